package lockreg

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/puzpuzpuz/xsync/v3"
	"github.com/redis/go-redis/v9"
)

// Errors returned by the registry and its locks. Every error lockreg returns
// is one of these or wraps one, so callers can test with errors.Is. The
// wrapping error names the key and what happened; the advice is here.
var (
	// ErrNotObtained: an acquisition gave up because its context ended
	// (the error also matches the context's error) while another owner
	// held the key or Redis did not answer. Retry later, or allow a longer
	// deadline.
	ErrNotObtained = errors.New("lockreg: lock not obtained")
	// ErrNotHeld: a release of what is not held: an Unlock by a goroutine
	// that does not hold the lock, or a second Release of a Hold. Unlock
	// from the goroutine that locked, once per successful lock; release a
	// Hold once.
	ErrNotHeld = errors.New("lockreg: lock not held")
	// ErrLockLost: the hold may have been lost, so its critical section
	// may have overlapped another holder's. The wrapping error names the
	// cause when the registry knows it: a stall longer than the lease (a
	// GC pause, a stopped process, Redis unreachable), Redis losing data (a
	// restart without persistence, a failover to a lagging replica), or a
	// deleted key; also a lease that WithMaxHold let run out, or a closed
	// registry. Stop the protected work; use fencing tokens (Hold.Token)
	// where a late write must be refused; for stalls, make the lease
	// (WithExpireAfter) longer than the longest pause.
	ErrLockLost = errors.New("lockreg: lock lost")
	// ErrClosed: the registry was closed (Close, Shutdown). Obtain locks
	// from an open registry made by New.
	ErrClosed = errors.New("lockreg: registry closed")
	// ErrInvalidOption: New was given an argument it cannot use; the
	// message names it. Fix the named option.
	ErrInvalidOption = errors.New("lockreg: invalid argument to New")
	// ErrInvalidKey: an empty key, or a DoAll with no keys. Name the
	// resource to lock: any non-empty string is a key.
	ErrInvalidKey = errors.New("lockreg: invalid key")
	// ErrRedis: a Redis call failed. While waiting, the lock retries; at
	// release, the key is left to expire after its lease. Check that Redis
	// is reachable and healthy, and that its ACL allows the commands the
	// README lists.
	ErrRedis = errors.New("lockreg: Redis call failed")
	// ErrNotReplicated: with WithWaitReplicas, fewer replicas acknowledged
	// an acquisition than required; the key was released and the attempt
	// counts as failed. Check the replicas' health, or require fewer.
	ErrNotReplicated = errors.New("lockreg: too few replicas acknowledged the lock")
)

const (
	defaultExpireAfter   = 30 * time.Second
	defaultRetryInterval = 100 * time.Millisecond
	defaultHandoffMax    = 16
	defaultHandoffFor    = 10 * time.Millisecond
	// pubSubYield is how long a registry leaves a key it just released to
	// a waiting registry, which learns of the release by pub/sub within a
	// round trip or two, before its own next local waiter tries.
	pubSubYield = 2 * time.Millisecond
	// minGrantLease is the shortest lease of a granted key (see grant): the
	// grantee must hear of the grant and extend the lease within it, and
	// a grantee that died while waiting keeps the key from others as long.
	minGrantLease = 100 * time.Millisecond
)

// Option configures a Registry; pass options to New.
type Option func(*config)

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
	errs          []error // option errors, reported together by New
}

// WithExpireAfter sets the lease of a lock's Redis key: if the holder's
// process dies, other processes can take the lock this long after its last
// acquisition. Default 30s; at least 1ms, in whole milliseconds.
func WithExpireAfter(d time.Duration) Option {
	return func(c *config) {
		if d < time.Millisecond {
			c.errs = append(c.errs, fmt.Errorf("%w: WithExpireAfter(%v): the lease must be at least 1ms", ErrInvalidOption, d))
		}
		c.expireAfter = d.Truncate(time.Millisecond)
	}
}

// WithRetryInterval sets the pause between Redis attempts while a lock is
// held by another process. Default 100ms; it must be shorter than the lease.
func WithRetryInterval(d time.Duration) Option {
	return func(c *config) {
		if d <= 0 {
			c.errs = append(c.errs, fmt.Errorf("%w: WithRetryInterval(%v): the interval must be positive", ErrInvalidOption, d))
		}
		c.retryInterval = d
	}
}

// WithLogger sets where the registry reports what it cannot return: Redis
// errors while waiting, and failed releases from Unlock. Default
// slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(c *config) {
		if l == nil {
			c.errs = append(c.errs, fmt.Errorf("%w: WithLogger(nil): pass a logger, or omit the option for slog.Default()", ErrInvalidOption))
		}
		c.logger = l
	}
}

// WithRenewal turns the lease watchdog on (the default) or off. While on,
// the registry extends the lease of every key it holds each expireAfter/3,
// in batched, owner-checked script calls, so work may outlast the lease.
// Off, the lease is fixed: a hold that outlasts it is lost (see Lock.Lost).
func WithRenewal(on bool) Option {
	return func(c *config) { c.renewal = on }
}

// WithMaxHold stops renewing a hold d after it was taken, so a forgotten
// unlock cannot keep a key alive for ever: the lease then runs out and the
// holder is told through Lock.Lost. Default: no limit. It needs renewal on.
func WithMaxHold(d time.Duration) Option {
	return func(c *config) {
		if d <= 0 {
			c.errs = append(c.errs, fmt.Errorf("%w: WithMaxHold(%v): the limit must be positive; omit the option for none", ErrInvalidOption, d))
		}
		c.maxHold = d
	}
}

// WithWaitReplicas makes every acquisition wait, in the same round trip,
// until n replicas acknowledged it (Redis WAIT), for at most timeout. With
// fewer acknowledgements the registry releases the key and counts the
// attempt as failed (ErrNotReplicated), retrying while the deadline allows.
// This narrows, but does not close, the window in which a failover to a
// replica loses a lock: WAIT does not make Redis strongly consistent.
func WithWaitReplicas(n int, timeout time.Duration) Option {
	return func(c *config) {
		if n < 1 {
			c.errs = append(c.errs, fmt.Errorf("%w: WithWaitReplicas(%d, …): n must be at least 1; omit the option to not wait", ErrInvalidOption, n))
		}
		if timeout < time.Millisecond {
			c.errs = append(c.errs, fmt.Errorf("%w: WithWaitReplicas(…, %v): the timeout must be at least 1ms (WAIT 0 would block for ever)", ErrInvalidOption, timeout))
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
// that other registries get their turn. Default 16 and 10ms; n = 0 turns
// hand-offs off.
func WithLocalHandoff(n int, d time.Duration) Option {
	return func(c *config) {
		if n < 0 || (n > 0 && d <= 0) {
			c.errs = append(c.errs, fmt.Errorf("%w: WithLocalHandoff(%d, %v): n must be at least 0 and, when above 0, d positive", ErrInvalidOption, n, d))
		}
		c.handoffMax, c.handoffFor = n, d
	}
}

// Registry hands out distributed locks that share one Redis namespace
// (registryKey) and one client id. Create one per process and namespace with
// New, and Close it when done.
type Registry struct {
	client      redis.UniversalClient
	registryKey string
	clientID    string // the value of every Redis key this registry holds
	cfg         config
	locals      localLocks
	calls       batcher
	stats       counters
	// callsEndAtDeadline says that the client ends its calls at their
	// context's deadline (go-redis's ContextTimeoutEnabled): see
	// acquisition.tryInline.
	callsEndAtDeadline bool
	// channel wakes the waiters of every registry of this registryKey.
	// subscriptions are the channels the registry listens to: channel, and
	// channel:<client id>, which carries the grants to this registry alone,
	// so that a grant wakes no other process.
	channel       string
	subscriptions []string
	// yield is how long a release that another registry waits for keeps
	// this registry's next acquisition of the key back; yields holds the
	// pending ones (the watchdog drops those nobody came for).
	yield  time.Duration
	yields *xsync.MapOf[string, time.Time]
	// pending holds, by key, the calls on the key's state in Redis still
	// on their way that an acquisition's first attempt must not overtake:
	// withdrawals of this registry's waiting mark (see unmark) and
	// give-backs of grants (see giveBack).
	pending *xsync.MapOf[string, *pendingCalls]
	// contended holds, by key, until when the key counts as contended
	// (see looksContended).
	contended *xsync.MapOf[string, time.Time]
	// obtainArgs are obtain.lua's arguments, made once (go-redis copies
	// them), indexed by whether the attempt waits (its mark then asks for
	// grants, when the registry takes them) and by whether an earlier
	// attempt marked the key. The other arguments are boxed once too, as
	// each boxing is an allocation per call.
	obtainArgs [2][2][]any
	// grantLease is the lease of a key another registry's release passes
	// to this one (see grant), or 0 if this registry takes no grants.
	grantLease                        time.Duration
	clientIDArg, leaseArg, channelArg any
	// releaseArgs are release.lua's arguments when nobody is expected to
	// wait: the client id alone.
	releaseArgs []any

	subscribeMu sync.Mutex // guards sub, and serializes opening it
	sub         *redis.PubSub
	subscribed  atomic.Bool
	// subscribing says that subscribeSoon is opening the subscription;
	// subscribeAfter (unix ns) is when it may try again after a failure.
	subscribing    atomic.Bool
	subscribeAfter atomic.Int64

	// closed is closed once the registry refuses acquisitions: at
	// Shutdown, or Close. idle tells a Shutdown that waits for the holds
	// that the last one was released.
	closed chan struct{}
	idle   chan struct{}
	stop   context.CancelFunc
	// stopCtx bounds background work; Close cancels it. Background work
	// goes on while Shutdown waits, as releases and renewals need it.
	stopCtx context.Context

	mu         sync.Mutex // guards refusing, stopped and background.Add
	refusing   bool       // closed is closed
	stopped    bool       // Close stopped the background work
	background sync.WaitGroup
}

// New creates a registry whose locks live in Redis under registryKey. The
// registry gets a random client id: registries in any process that share a
// registryKey exclude each other; registries with different registryKeys
// never interfere.
func New(client redis.UniversalClient, registryKey string, opts ...Option) (*Registry, error) {
	cfg := config{
		expireAfter: defaultExpireAfter, retryInterval: defaultRetryInterval, logger: slog.Default(),
		renewal: true, pubSub: true, handoffMax: defaultHandoffMax, handoffFor: defaultHandoffFor,
	}
	for _, opt := range opts {
		opt(&cfg)
	}
	errs := cfg.errs
	if client == nil {
		errs = append(errs, fmt.Errorf("%w: client is nil: pass a go-redis client", ErrInvalidOption))
	}
	if err := checkRegistryKey(registryKey); err != nil {
		errs = append(errs, err)
	}
	if len(cfg.errs) == 0 && cfg.retryInterval >= cfg.expireAfter {
		errs = append(errs, fmt.Errorf("%w: the retry interval (WithRetryInterval, %v) must be shorter than the lease (WithExpireAfter, %v)", ErrInvalidOption, cfg.retryInterval, cfg.expireAfter))
	}
	if cfg.maxHold > 0 && !cfg.renewal {
		errs = append(errs, fmt.Errorf("%w: WithMaxHold needs renewal, which WithRenewal(false) turned off; drop one of them", ErrInvalidOption))
	}
	if ring, isRing := client.(*redis.Ring); isRing {
		if cfg.waitReplicas > 0 {
			errs = append(errs, fmt.Errorf("%w: WithWaitReplicas does not work with a redis.Ring; use a Client, FailoverClient or ClusterClient", ErrInvalidOption))
		}
		// A Ring sends a renewal of many keys, and a subscription, to one
		// shard, and a script's notification goes out on its key's shard:
		// held keys on the others would expire, and waiters go unwoken.
		if shards := len(ring.Options().Addrs); shards > 1 {
			errs = append(errs, fmt.Errorf("%w: a redis.Ring with %d shards splits a registry's keys and notifications across servers; use a ClusterClient, or a Ring of one shard", ErrInvalidOption, shards))
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	cfg.errs = nil
	stopCtx, stop := context.WithCancel(context.Background())
	r := &Registry{
		client:             client,
		registryKey:        registryKey,
		clientID:           uuid.NewString(),
		cfg:                cfg,
		locals:             newLocalLocks(),
		calls:              batcher{client: client},
		callsEndAtDeadline: endsCallsAtDeadline(client),
		channel:            registryKey + ":released",
		yield:              cfg.retryInterval,
		yields:             xsync.NewMapOf[string, time.Time](),
		pending:            xsync.NewMapOf[string, *pendingCalls](),
		contended:          xsync.NewMapOf[string, time.Time](),
		closed:             make(chan struct{}),
		idle:               make(chan struct{}, 1),
		stop:               stop,
		stopCtx:            stopCtx,
	}
	if cfg.pubSub {
		r.yield = min(pubSubYield, cfg.retryInterval)
	}
	// A failed attempt that will wait marks its key as waited for during
	// two retry intervals, so that a polling waiter keeps its mark alive.
	// TryLock's attempt leaves none: nobody would answer a wake-up, and its
	// mark, served first, would cost a real waiter its grant.
	markFor := [2]string{"0", strconv.FormatInt(max(2*cfg.retryInterval.Milliseconds(), 2), 10)} // without and with waiting
	r.clientIDArg, r.leaseArg = r.clientID, strconv.FormatInt(cfg.expireAfter.Milliseconds(), 10)
	if cfg.pubSub && cfg.waitReplicas == 0 {
		r.grantLease = min(max(2*cfg.retryInterval, minGrantLease), cfg.expireAfter)
	}
	marks := [2]string{r.clientID, r.clientID} // without and with waiting
	if r.grantLease > 0 {
		marks[1] += ":" + strconv.FormatInt(r.grantLease.Milliseconds(), 10)
	}
	for wait, mark := range marks {
		for marked, unmark := range []string{"0", "1"} {
			r.obtainArgs[wait][marked] = []any{r.clientIDArg, r.leaseArg, markFor[wait], unmark, mark}
		}
	}
	r.releaseArgs = []any{r.clientIDArg}
	r.channelArg = "" // no notifications
	if cfg.pubSub {
		r.channelArg = r.channel
		r.subscriptions = []string{r.channel}
	}
	if r.grantLease > 0 {
		r.subscriptions = append(r.subscriptions, r.channel+":"+r.clientID)
	}
	r.goBackground(r.watch)
	return r, nil
}

// endsCallsAtDeadline reports whether client ends its calls at their
// context's deadline, as go-redis's clients do with ContextTimeoutEnabled.
// Other implementations of UniversalClient are not assumed to.
func endsCallsAtDeadline(client redis.UniversalClient) bool {
	switch c := client.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

// Obtain returns the lock for key, which may be any non-empty string (binary
// included). It is cheap and keeps nothing in the registry: locks for the
// same key, obtained at any time, share one state. Obtain panics if key is
// empty.
func (r *Registry) Obtain(key string) *Lock {
	if key == "" {
		panic("lockreg: Obtain with an empty key; name the resource to lock")
	}
	return &Lock{r: r, key: key, keys: redisKeys(r.registryKey, key)}
}

// redisKeys are a lock's keys in Redis: the lock itself,
// <registryKey>:{<key>}, then its fence (the last token), its waiting
// marker and its queue of waiting registries, which extend it and so share
// its hash tag and Cluster slot. The key's braces and '%' are escaped (as
// %7B, %7D, %25), so that the part in braces is exactly the key: no key
// can end the tag early, and no two (registryKey, key) pairs share a Redis
// key. Keys without them, the usual case, appear as they are.
func redisKeys(registryKey, key string) []string {
	if strings.ContainsAny(key, "{}%") {
		key = keyEscaper.Replace(key)
	}
	lock := registryKey + ":{" + key + "}"
	return []string{lock, lock + ":fence", lock + ":waiting", lock + ":queue"}
}

var keyEscaper = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")

// checkRegistryKey refuses the registryKeys whose locks' keys would not
// share a Cluster slot. A hash tag in the registryKey is fine (it puts all
// of the registry's locks in one slot), but an empty one, "{}", makes Redis
// hash each whole key instead.
func checkRegistryKey(registryKey string) error {
	if registryKey == "" {
		return fmt.Errorf("%w: registryKey is empty: pass the Redis key prefix for this registry's locks", ErrInvalidOption)
	}
	if open := strings.IndexByte(registryKey, '{'); open >= 0 && strings.HasPrefix(registryKey[open+1:], "}") {
		return fmt.Errorf("%w: registryKey %q starts a Redis Cluster hash tag with \"{}\", which would split a lock's keys across slots; remove the empty braces", ErrInvalidOption, registryKey)
	}
	return nil
}
