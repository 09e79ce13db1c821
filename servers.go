package lockreg

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockreg/lockreg/internal/protocol"
)

// A server with a memory limit and any eviction policy but noeviction may
// evict lock keys, as they have a time to live: another registry then
// takes a key its holder still works under, and nothing tells either. A
// registry reads every primary's policy (INFO memory) in the background
// from New on, and refuses such a server (ErrServerEvicts) unless
// WithEvictionAllowed: its first acquisition waits for that first look,
// which is done by then as a rule. It looks again every policyRecheck, as
// a policy can change (CONFIG SET, a failover to a server configured
// otherwise, a primary added to a Cluster): a server that now may evict is
// refused from then on, and one fixed is used again. A tracker that finds
// its server new (its subscription came back after a failover or a
// restart, or a Cluster node it had no tracker for serves keys) has it
// look at once: a failover to a replica configured to evict would
// otherwise be used unrefused until the next look.

// serverCheck is what a registry learned of its servers' eviction policy.
type serverCheck struct {
	// looked is closed once the first look ended, done or not; refused is
	// then the error every acquisition fails with, if set.
	looked  chan struct{}
	refused atomic.Pointer[error]
	// recheck asks checkServers for a look now (recheckServers).
	recheck chan struct{}
	// native says that every primary renews natively (SET ... IFEQ, see
	// protocol.Peer.RenewOne), rather than by renew.lua.
	native atomic.Bool
	// renewalRefusalTold says that a renewal refused for good was logged
	// (renewalFailed).
	renewalRefusalTold atomic.Bool
	// evicts says that a server may evict lock keys, as WithEvictionAllowed
	// lets it: a key found gone after the server evicted keys lost its hold
	// to eviction. evicted is the servers' evicted_keys when last read.
	evicts  atomic.Bool
	mu      sync.Mutex // guards evicted
	evicted map[string]int64
}

func (s *serverCheck) init() {
	s.looked, s.recheck = make(chan struct{}), make(chan struct{}, 1)
}

// policyRecheck is how often a registry looks at its servers' eviction
// policy again once it knows it; a variable, which tests shorten.
var policyRecheck = 30 * time.Second

// checkServers reads the eviction policy of every primary, again every
// retry interval while Redis does not answer, until it knows, or knows
// that it cannot (the ACL forbids INFO, or its reply names no policy:
// logged once); then every policyRecheck, until Close.
func (r *Registry) checkServers(stop context.Context) {
	defer func() {
		if !isClosed(r.servers.looked) {
			close(r.servers.looked)
		}
	}()
	known, warned := false, false
	for {
		err := r.readEvictionPolicies(stop)
		switch {
		case err == nil:
			known = true
		case protocol.Permanent(err) || errors.As(err, new(unreadPolicy)):
			known = true
			if !warned {
				warned = true
				r.cfg.logger.Warn("lockreg: cannot read the servers' eviction policy (INFO memory); lock keys may be evicted unseen", "error", err)
			}
		}
		if !isClosed(r.servers.looked) {
			close(r.servers.looked) // acquisitions meanwhile report Redis's errors themselves
		}
		pause := policyRecheck
		if !known {
			pause = r.cfg.retryInterval
		}
		select {
		case <-stop.Done():
			return
		case <-time.After(pause):
		case <-r.servers.recheck:
		}
	}
}

// recheckServers has checkServers look at the servers' policies at once:
// a tracker's server may be another, or configured otherwise, than the
// one last looked at.
func (r *Registry) recheckServers() {
	select {
	case r.servers.recheck <- struct{}{}:
	default:
	}
}

// readEvictionPolicies reads and judges every primary's policy, and
// whether every one renews natively. A primary that will not tell (the
// ACL forbids INFO, or its reply names no policy) is left out of the
// judgement of the others, which is made all the same, and reported as
// an unreadPolicy error; a look that failed otherwise changes no
// judgement but to refuse a primary it found may evict, and the last:
// renew.lua, which every server runs.
func (r *Registry) readEvictionPolicies(ctx context.Context) error {
	native, evicts := true, false
	var refused, hidden error
	err := r.forEachPrimary(ctx, func(ctx context.Context, addr string, node redis.Cmdable) error {
		info, err := node.Info(ctx, "memory", "server").Result()
		if err != nil && !(protocol.IsReply(err) && protocol.Permanent(err)) {
			return err // no answer: asked again
		}
		var e protocol.Eviction
		if err == nil {
			e, err = protocol.ReadEviction(info)
		}
		if err != nil {
			native = false
			if hidden == nil {
				hidden = unreadPolicy{fmt.Errorf("%s: %w", addr, err)}
			}
			return nil
		}
		native = native && protocol.RenewsNatively(info)
		if !e.Evicts() {
			return nil
		}
		if !r.cfg.evictionAllowed {
			if refused == nil {
				refused = fmt.Errorf("%w: %s has maxmemory %d and maxmemory-policy %s", ErrServerEvicts, addr, e.MaxBytes, e.Policy)
			}
			return nil
		}
		evicts = true
		if !r.servers.evicts.Swap(true) {
			r.cfg.logger.Warn("lockreg: the server may evict lock keys; WithEvictionAllowed accepts it, and each eviction is reported as a loss", "server", addr, "maxmemory_policy", e.Policy)
		}
		r.countEvictionsFrom(ctx, addr, node)
		return nil
	})
	r.servers.native.Store(err == nil && native)
	if refused != nil {
		r.servers.refused.Store(&refused)
	}
	if err != nil {
		return err
	}
	r.servers.evicts.Store(evicts)
	if refused == nil {
		r.servers.refused.Store(nil)
	}
	return hidden
}

// unreadPolicy is a server's INFO reply that names no eviction policy (a
// proxy, a server of another kind): asking again would tell no more.
type unreadPolicy struct{ error }

func (u unreadPolicy) Unwrap() error { return u.error }

// forEachPrimary calls fn for every primary of the registry's client, one
// after the other, and returns the first error.
func (r *Registry) forEachPrimary(ctx context.Context, fn func(ctx context.Context, addr string, node redis.Cmdable) error) error {
	cluster, ok := r.client.(*redis.ClusterClient)
	if !ok {
		addr := "Redis"
		if c, ok := r.client.(*redis.Client); ok {
			addr = c.Options().Addr
		}
		return fn(ctx, addr, r.client)
	}
	var mu sync.Mutex
	return cluster.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		return fn(ctx, node.Options().Addr, node)
	})
}

// serversLooked waits for the first look at the servers' policies, and
// returns ErrServerEvicts if a server may evict lock keys unallowed.
func (r *Registry) serversLooked(ctx context.Context) error {
	select {
	case <-r.servers.looked:
	default:
		if err := waitFor(ctx, r.life.closing, r.servers.looked); err != nil {
			return nil // the acquisition ends for that reason itself
		}
	}
	if err := r.servers.refused.Load(); err != nil {
		return *err
	}
	return nil
}

// countEvictionsFrom reads the server's evicted_keys once, as the count
// the tracker's first look compares with. Later looks are the tracker's
// alone: one between an eviction and the tracker's read of the key would
// hide it (the key would read as deleted).
func (r *Registry) countEvictionsFrom(ctx context.Context, addr string, node redis.Cmdable) {
	r.servers.mu.Lock()
	_, seen := r.servers.evicted[addr]
	r.servers.mu.Unlock()
	if !seen {
		r.evictedSince(ctx, addr, node)
	}
}

// evictedSince reports whether the server at addr evicted keys since the
// last look (INFO stats), for a registry whose servers may evict.
func (r *Registry) evictedSince(ctx context.Context, addr string, node redis.Cmdable) bool {
	if !r.servers.evicts.Load() {
		return false
	}
	info, err := node.Info(ctx, "stats").Result()
	if err != nil {
		return false
	}
	n := protocol.EvictedKeys(info)
	r.servers.mu.Lock()
	defer r.servers.mu.Unlock()
	if r.servers.evicted == nil {
		r.servers.evicted = make(map[string]int64)
	}
	last, seen := r.servers.evicted[addr]
	r.servers.evicted[addr] = n
	return seen && n > last
}

// evictionsOf is, for one round of calls on the registry's client (which
// no tracker reads for), whether the server of a key evicted keys since
// the last look: read once a server, and, through settle, for every
// server of the round, so that a key found gone later is put down to
// eviction only for one since this round, as a tracker's batch does.
func (r *Registry) evictionsOf(ctx context.Context) (evicted func(redisKey string) bool, settle func(holds []*Hold)) {
	seen := make(map[string]bool) // by server
	evicted = func(redisKey string) bool {
		if !r.servers.evicts.Load() {
			return false
		}
		addr, node := r.primaryOf(ctx, redisKey)
		if node == nil {
			return false
		}
		if v, ok := seen[addr]; ok {
			return v
		}
		seen[addr] = r.evictedSince(ctx, addr, node)
		return seen[addr]
	}
	settle = func(holds []*Hold) {
		for _, h := range holds {
			evicted(h.redisKey())
		}
	}
	return evicted, settle
}

// primaryOf is the primary that serves redisKey, named as forEachPrimary
// names it, or nil if the Cluster cannot say.
func (r *Registry) primaryOf(ctx context.Context, redisKey string) (string, redis.Cmdable) {
	switch c := r.client.(type) {
	case *redis.ClusterClient:
		node, err := c.MasterForKey(ctx, redisKey)
		if err != nil {
			return "", nil
		}
		return node.Options().Addr, node
	case *redis.Client:
		return c.Options().Addr, c
	}
	return "Redis", r.client
}
