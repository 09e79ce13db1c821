package lockreg

import (
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockreg/lockreg/internal/protocol"
)

const (
	defaultExpireAfter   = 30 * time.Second
	defaultRetryInterval = 100 * time.Millisecond
	defaultHandoffMax    = 16
	defaultHandoffFor    = 10 * time.Millisecond
	// maxHandoffs bounds WithLocalHandoff's n: the tokens a run of local
	// hand-offs raises without Redis (see ForceUnlock).
	maxHandoffs = 1000
	// pubSubYield is how long a registry leaves a key it just released to
	// a waiting registry, which learns of the release by pub/sub within a
	// round trip or two, before its own next local waiter tries.
	pubSubYield = 2 * time.Millisecond
	// minGrantLease is the shortest lease of a granted key (grantLease).
	minGrantLease = 100 * time.Millisecond
	// maxExpireAfter bounds the lease: an owner name's end (two leases) is
	// counted in ns since 1970, which run out in 2262, and a lease's in ns
	// since the process started, in an int64.
	maxExpireAfter = 10 * 365 * 24 * time.Hour
)

// Option configures a Registry; pass options to New. An invalid option
// makes New fail with an ErrInvalidOption error that names it.
type Option func(*config)

// config is a registry's settings, from its options.
type config struct {
	expireAfter   time.Duration
	retryInterval time.Duration
	logger        *slog.Logger
	renewal       bool
	maxHold       time.Duration // 0: renew for as long as the lock is held
	waitReplicas  int           // 0: no WAIT
	waitTimeout   time.Duration
	pubSub        bool
	handoffMax    int // 0: no local hand-offs
	handoffFor    time.Duration
	owner         string // the name inspectors see for this registry
	// evictionAllowed accepts a server that may evict lock keys.
	evictionAllowed bool
	errs            []error // option errors, reported together by New
}

// WithExpireAfter sets the lease of a lock's Redis key: if the holder's
// process dies, other processes can take the lock at most this long after
// its last acquisition or renewal. Default 30s; at least 1ms, at most 10
// years, in whole milliseconds.
func WithExpireAfter(d time.Duration) Option {
	return func(c *config) {
		switch {
		case d < time.Millisecond:
			c.errs = append(c.errs, fmt.Errorf("%w: WithExpireAfter(%v): below 1ms", ErrInvalidOption, d))
		case d > maxExpireAfter:
			c.errs = append(c.errs, fmt.Errorf("%w: WithExpireAfter(%v): above 10 years", ErrInvalidOption, d))
		}
		c.expireAfter = d.Truncate(time.Millisecond)
	}
}

// WithRetryInterval sets the pause between Redis attempts while a lock is
// held by another process. Default 100ms; it must be shorter than the lease.
func WithRetryInterval(d time.Duration) Option {
	return func(c *config) {
		if d <= 0 {
			c.errs = append(c.errs, fmt.Errorf("%w: WithRetryInterval(%v): not positive", ErrInvalidOption, d))
		}
		c.retryInterval = d
	}
}

// WithLogger sets where the registry reports what it cannot return: Redis
// errors while waiting, and failed releases from Unlock. Default
// slog.Default(); it must not be nil.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) {
		if l == nil {
			c.errs = append(c.errs, fmt.Errorf("%w: WithLogger(nil)", ErrInvalidOption))
		}
		c.logger = l
	}
}

// WithRenewal turns the lease watchdog on (the default) or off. While on,
// the registry extends the lease of every key it holds each expireAfter/3,
// in batched, owner-checked calls, so work may outlast the lease.
// Off, the lease is fixed: a hold that outlasts it is lost (see Lock.Lost).
func WithRenewal(on bool) Option {
	return func(c *config) { c.renewal = on }
}

// WithMaxHold stops renewing a hold d after it was taken, so a forgotten
// unlock cannot keep a key alive for ever: the lease then runs out and the
// holder is told through Lost. A hold past it is not handed off locally
// (WithLocalHandoff): the next holder takes the key in Redis, with a lease
// of its own. Default: no limit. It needs renewal on, and d must be
// positive.
func WithMaxHold(d time.Duration) Option {
	return func(c *config) {
		if d <= 0 {
			c.errs = append(c.errs, fmt.Errorf("%w: WithMaxHold(%v): not positive", ErrInvalidOption, d))
		}
		c.maxHold = d
	}
}

// WithWaitReplicas makes every acquisition wait, in the same round trip,
// until n replicas acknowledged it (Redis WAIT), for at most timeout. With
// fewer acknowledgements the registry releases the key and counts the
// attempt as failed (ErrNotReplicated), retrying while the deadline allows.
// This narrows, but does not close, the window in which a failover to a
// replica loses a lock: WAIT does not make Redis strongly consistent. n
// must be at least 1, and timeout at least 1ms (WAIT 0 blocks for ever),
// below the lease, and below the client's ReadTimeout, within which
// go-redis reads WAIT's reply.
// A redis.Ring cannot wait for replicas.
func WithWaitReplicas(n int, timeout time.Duration) Option {
	return func(c *config) {
		if n < 1 {
			c.errs = append(c.errs, fmt.Errorf("%w: WithWaitReplicas(%d, …): n below 1", ErrInvalidOption, n))
		}
		if timeout < time.Millisecond {
			c.errs = append(c.errs, fmt.Errorf("%w: WithWaitReplicas(…, %v): timeout below 1ms", ErrInvalidOption, timeout))
		}
		c.waitReplicas, c.waitTimeout = n, timeout
	}
}

// WithPubSub turns release notifications on (the default) or off. On, a
// release that another registry waits for grants it the key, or wakes its
// waiters, by a message on one subscription per registry, at once instead
// of at their next retry; the retry stays as the safety net for lost
// messages. Off, the registry takes no grants and its waiters poll every
// retry interval (Spring's SPIN_LOCK).
func WithPubSub(on bool) Option {
	return func(c *config) { c.pubSub = on }
}

// WithLocalHandoff bounds local hand-offs: when the owner unlocks while
// another goroutine of this registry waits for the key, the registry passes
// the hold to it without a Redis round trip (the key stays held, the
// fencing token rises by one), at most n times in a row and for at most d
// since the key was taken in Redis; then it releases the key in Redis so
// that other registries get their turn. The unlock that hands off returns
// once a read of the key after the hand-off confirmed it was still held,
// about a round trip (with tracking or without); the next holder does not
// wait for it. With WithRenewal(false), nothing renews the lease handed
// on: d is at most two thirds of the lease then, so that a third of it is
// left at least. Default 16 and 10ms; n = 0 turns
// hand-offs off, and d must be positive when n is not. n is at most 1,000:
// ForceUnlock keeps fencing tokens rising past those handed off locally by
// that bound.
func WithLocalHandoff(n int, d time.Duration) Option {
	return func(c *config) {
		if n < 0 || n > maxHandoffs || (n > 0 && d <= 0) {
			c.errs = append(c.errs, fmt.Errorf("%w: WithLocalHandoff(%d, %v): n outside 0 to %d, or d not positive", ErrInvalidOption, n, d, maxHandoffs))
		}
		c.handoffMax, c.handoffFor = n, d
	}
}

// WithOwner names the registry to operators: Inspect, Locks and lockctl
// show it beside the locks it holds, for example "billing/pod-7". The
// default names the program, the host and the process id
// ("billing@pod-7:4242"). It must not be empty.
func WithOwner(name string) Option {
	return func(c *config) {
		if name == "" {
			c.errs = append(c.errs, fmt.Errorf("%w: WithOwner(\"\")", ErrInvalidOption))
		}
		c.owner = name
	}
}

// WithEvictionAllowed lets the registry hold keys on a server that may
// evict them (maxmemory with a maxmemory-policy other than noeviction),
// which it otherwise refuses with ErrServerEvicts. It logs one warning
// naming the policy, and a holder whose key is evicted learns of it at
// once (without tracking, at its next renewal), through Lost and Do's
// context (LossEvicted); its critical section may still have overlapped
// another's by then.
func WithEvictionAllowed() Option {
	return func(c *config) { c.evictionAllowed = true }
}

// newConfig applies opts to the defaults, and checks the result against
// client and namespace, returning every problem at once.
func newConfig(client redis.UniversalClient, namespace string, opts []Option) (config, error) {
	cfg := config{
		expireAfter: defaultExpireAfter, retryInterval: defaultRetryInterval, logger: slog.Default(),
		renewal: true, pubSub: true, handoffMax: defaultHandoffMax, handoffFor: defaultHandoffFor,
		owner: defaultOwner(),
	}
	for i, opt := range opts {
		if opt == nil {
			cfg.errs = append(cfg.errs, fmt.Errorf("%w: option %d is nil", ErrInvalidOption, i+1))
			continue
		}
		opt(&cfg)
	}
	errs, optionsValid := cfg.errs, len(cfg.errs) == 0
	cfg.errs = nil
	if client == nil || isNilPointer(client) {
		errs = append(errs, fmt.Errorf("%w: client is nil", ErrInvalidOption))
	}
	if err := protocol.CheckNamespace(namespace); err != nil {
		errs = append(errs, fmt.Errorf("%w: namespace %w", ErrInvalidOption, err))
	}
	if optionsValid && cfg.retryInterval >= cfg.expireAfter {
		errs = append(errs, fmt.Errorf("%w: WithRetryInterval(%v): not below the lease (WithExpireAfter, %v)", ErrInvalidOption, cfg.retryInterval, cfg.expireAfter))
	}
	// The lease runs from obtain.lua's SET: an acquisition whose WAIT
	// lasted as long would hand back a hold already lost.
	if optionsValid && cfg.waitReplicas > 0 && cfg.waitTimeout >= cfg.expireAfter {
		errs = append(errs, fmt.Errorf("%w: WithWaitReplicas(…, %v): not below the lease (WithExpireAfter, %v)", ErrInvalidOption, cfg.waitTimeout, cfg.expireAfter))
	}
	if cfg.maxHold > 0 && !cfg.renewal {
		errs = append(errs, fmt.Errorf("%w: WithMaxHold needs renewal, which WithRenewal(false) turned off", ErrInvalidOption))
	}
	// go-redis reads a pipeline's replies within the client's ReadTimeout,
	// WAIT's too: a WAIT as long would end every replicated attempt in a
	// timeout, after obtain.lua took the key, for as long as ctx allows.
	if rt := readTimeout(client); cfg.waitReplicas > 0 && rt > 0 && cfg.waitTimeout >= rt {
		errs = append(errs, fmt.Errorf("%w: WithWaitReplicas(…, %v): not below the client's ReadTimeout (%v)", ErrInvalidOption, cfg.waitTimeout, rt))
	}
	if ring, isRing := client.(*redis.Ring); isRing && ring != nil {
		if cfg.waitReplicas > 0 {
			errs = append(errs, fmt.Errorf("%w: WithWaitReplicas with a redis.Ring", ErrInvalidOption))
		}
		// A Ring sends a renewal of many keys, and a subscription, to one
		// shard, and a script's notification goes out on its key's shard:
		// held keys on the others would expire, and waiters go unwoken.
		if shards := len(ring.Options().Addrs); shards > 1 {
			errs = append(errs, fmt.Errorf("%w: a redis.Ring with %d shards", ErrInvalidOption, shards))
		}
	}
	return cfg, errors.Join(errs...)
}

// isNilPointer reports whether v is a typed nil pointer: a
// (*redis.Client)(nil) passed as a UniversalClient is not nil itself.
func isNilPointer(v any) bool {
	rv := reflect.ValueOf(v)
	return rv.Kind() == reflect.Pointer && rv.IsNil()
}

// grantLease is the lease of a key another registry's release grants to
// this one (see grant.go), or 0 if this registry takes no grants: the
// grantee must hear of the grant and extend the lease within it, and a
// grantee that died while waiting keeps the key from others as long.
func (c *config) grantLease() time.Duration {
	if !c.pubSub || c.waitReplicas > 0 {
		return 0 // no subscription to hear grants by; a grant is not acknowledged by replicas
	}
	return min(max(2*c.retryInterval, minGrantLease), c.expireAfter)
}

// readTimeout is client's ReadTimeout, as go-redis applies it (0: none).
func readTimeout(client redis.UniversalClient) time.Duration {
	switch c := client.(type) {
	case *redis.Client:
		if c != nil {
			return c.Options().ReadTimeout
		}
	case *redis.ClusterClient:
		if c != nil {
			return c.Options().ReadTimeout
		}
	}
	return 0
}
