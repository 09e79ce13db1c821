//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockreg/lockreg"
)

// The key faults change a held key behind its holder's back: an operator
// with redis-cli deletes it (del), sets it to a value of its own (overwrite)
// or flushes the server (flush), or the server, out of memory, evicts it
// (evict). The library tracks every key its holders hold (CLIENT TRACKING,
// docs/PROTOCOL.md, "Tracking: a holder knows at once"), so each holder must learn of the change
// within a round trip or two: blindtime.go measures how long it was blind.
//
// They strike the lock Redis only: the fenced store is a server of its own,
// which a flush or an eviction of the lock Redis leaves alone, and the
// checker keeps nothing else in the lock Redis but the fillers of an evict
// fault, which it removes.

// isKeyFault reports whether kind changes held keys behind their holders'
// backs.
func isKeyFault(kind string) bool { return slices.Contains(keyFaults, kind) }

// lockKey is key's lock in Redis: the library's key scheme for keys
// without braces or '%'.
func lockKey(registry, key string) string { return registry + ":{" + key + "}" }

// The evict fault's server: maxmemory evictHeadroom above what it used when
// the run began, allkeys-lru. The fault fills it to within fillMargin of
// its limit in pipelines of fillBatch fillers of fillerSize, then writes
// one filler at a time until Redis evicted a run key's lock, for fillFor
// at most, then removes the fillers. Small fillers, one at a time, bound
// when an eviction happened: after the filler before the last one sent
// (a worker's call may make the eviction a filler made due), a
// millisecond or less before its notification came in.
const (
	evictHeadroom = 8 << 20
	fillMargin    = 1 << 20
	fillerSize    = 64 << 10
	fillBatch     = 32
	fillFor       = 2 * time.Second
	fillerPrefix  = "lockcheck:filler:"
	// evictedChannel carries the name of every key Redis evicts (keyspace
	// notifications, class Ee).
	evictedChannel = "__keyevent@0__:evicted"
)

// overwriteTTL is how long an overwrite's foreign value lives: after it,
// the key is free again.
func overwriteTTL(lease time.Duration) time.Duration { return lease / 2 }

// keyFault strikes a key that a worker holds now (every key, for a flush).
func (in *injector) keyFault(ctx context.Context, kind string, last time.Time) (fault, error) {
	w, keys, ok := in.pickHolder(ctx, last)
	if !ok {
		return fault{}, nil
	}
	key := keys[in.rng.IntN(len(keys))]
	target := lockKey(in.ph.registry, key)
	f := fault{kind: kind, worker: -1}
	var err error
	switch kind {
	case faultDel:
		var n int64
		f.start = time.Now().UnixNano()
		n, err = in.keyAdmin.Del(ctx, target).Result()
		f.end = time.Now().UnixNano()
		// A DEL that deleted nothing changed nothing (its holder let go
		// first, or the key was gone already): filed as a change, it
		// would excuse an overlap around it.
		if err != nil || n > 0 {
			f.changes = []keyChange{{key: key, lo: f.start, hi: f.end}}
		}
		f.note = fmt.Sprintf("DEL %s (worker %d held it): %d deleted", target, w.id, n)
	case faultOverwrite:
		ttl := overwriteTTL(in.ph.cfg.lease)
		f.start = time.Now().UnixNano()
		var was string
		was, err = in.keyAdmin.SetArgs(ctx, target, fmt.Sprintf("lockcheck-operator-%d", f.start), redis.SetArgs{TTL: ttl, Get: true}).Result()
		f.end = time.Now().UnixNano()
		// Nor did a key set where there was none free one for anybody.
		if errors.Is(err, redis.Nil) {
			was, err = "nothing", nil
		} else {
			f.changes = []keyChange{{key: key, lo: f.start, hi: f.end}}
		}
		f.note = fmt.Sprintf("SET %s PX %d (worker %d held it); it was %q", target, ttl.Milliseconds(), w.id, was)
	case faultFlush:
		cmd := "FLUSHALL"
		if in.flushes%2 == 1 {
			cmd = "FLUSHDB"
		}
		in.flushes++
		var node *redis.Client
		var there []string
		if node, there, err = in.serverOf(ctx, key); err != nil {
			return fault{}, err
		}
		f.start = time.Now().UnixNano()
		err = node.Do(ctx, cmd).Err()
		f.end = time.Now().UnixNano()
		for _, k := range there {
			f.changes = append(f.changes, keyChange{key: k, lo: f.start, hi: f.end})
		}
		f.note = fmt.Sprintf("%s on %s (worker %d held %v; keys there %v)", cmd, node.Options().Addr, w.id, keys, there)
	case faultEvict:
		var node *redis.Client
		if node, _, err = in.serverOf(ctx, key); err != nil {
			return fault{}, err
		}
		var fillers int
		fillers, err = in.evict(ctx, &f, node, key)
		evicted := make([]string, len(f.changes))
		for i, c := range f.changes {
			evicted[i] = c.key
		}
		f.note = fmt.Sprintf("%d fillers of %d KiB on %s (worker %d held %v); evicted %v", fillers, fillerSize>>10, node.Options().Addr, w.id, keys, evicted)
	}
	for _, c := range f.changes {
		if !slices.Contains(f.keys, c.key) {
			f.keys = append(f.keys, c.key)
		}
	}
	slices.Sort(f.keys)
	return f, err
}

// serverOf returns the lock server that holds key's lock (its primary, on
// a Cluster) and the run keys it holds.
func (in *injector) serverOf(ctx context.Context, key string) (*redis.Client, []string, error) {
	c, ok := in.topo.(*cluster)
	if !ok {
		return in.admin, in.ph.keys, nil
	}
	node, err := c.admin.MasterForKey(ctx, lockKey(in.ph.registry, key))
	if err != nil {
		return nil, nil, fmt.Errorf("the primary of %s: %w", key, err)
	}
	there, err := c.serves(ctx, node.Options().Addr, in.ph.keys)
	return node, there, err
}

// evict fills node, the lock Redis that holds key's lock, until it evicts
// a run key's lock, and files every eviction of one meanwhile, as its
// notification comes in. The fillers share key's hash tag, and so its
// Cluster slot. It returns how many fillers it wrote.
func (in *injector) evict(ctx context.Context, f *fault, node *redis.Client, key string) (int, error) {
	limit := in.evictLimits[node.Options().Addr]
	if err := evicting(ctx, node, limit); err != nil { // again: a restart forgets it
		return 0, err
	}
	sub := node.Subscribe(ctx, evictedChannel)
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		return 0, fmt.Errorf("subscribe to %s: %w", evictedChannel, err)
	}
	keyOf := make(map[string]string, len(in.ph.keys))
	for _, k := range in.ph.keys {
		keyOf[lockKey(in.ph.registry, k)] = k
	}
	var mu sync.Mutex
	var sent []int64 // when each filler was sent
	hit := make(chan struct{}, 1)
	heard := make(chan struct{})
	go func() {
		defer close(heard)
		for {
			msg, err := sub.ReceiveMessage(ctx)
			if err != nil {
				return // the subscription closed
			}
			at := time.Now().UnixNano()
			k, ours := keyOf[msg.Payload]
			mu.Lock()
			// sent[i-1] is the last filler sent by at; none: not the fill's.
			if i, _ := slices.BinarySearch(sent, at+1); ours && i > 0 {
				f.changes = append(f.changes, keyChange{key: k, lo: sent[max(i-2, 0)], hi: at})
			}
			mu.Unlock()
			if !ours {
				continue
			}
			select {
			case hit <- struct{}{}:
			default:
			}
		}
	}()
	if in.filler == "" {
		in.filler = strings.Repeat("x", fillerSize)
	}
	var fillers []string
	add := func(n int) []string {
		from := len(fillers)
		for i := range n {
			fillers = append(fillers, fmt.Sprintf("%s{%s}:%d", fillerPrefix, key, from+i))
		}
		mu.Lock()
		sent = append(sent, time.Now().UnixNano())
		mu.Unlock()
		return fillers[from:]
	}
	f.start = time.Now().UnixNano()
	// In bulk to near the limit, then one at a time.
	for {
		used, err := usedMemory(ctx, node)
		if err != nil {
			return len(fillers), err
		}
		if used >= limit-fillMargin {
			break
		}
		if _, err := node.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, k := range add(fillBatch) {
				p.Set(ctx, k, in.filler, 0)
			}
			return nil
		}); err != nil {
			return len(fillers), fmt.Errorf("fill: %w", err)
		}
	}
	for until := time.Now().Add(fillFor); time.Now().Before(until) && len(hit) == 0; {
		if err := node.Set(ctx, add(1)[0], in.filler, 0).Err(); err != nil {
			return len(fillers), fmt.Errorf("fill: %w", err)
		}
	}
	f.end = time.Now().UnixNano()
	err := node.Unlink(ctx, fillers...).Err()
	// The notifications of the last evictions may trail the last reply.
	sleepCtx(ctx, 20*time.Millisecond)
	_ = sub.Close()
	<-heard
	return len(fillers), err
}

// evicting sets the lock Redis up for the evict fault: a memory limit
// (limit bytes), allkeys-lru, and a notification of every eviction.
func evicting(ctx context.Context, c *redis.Client, limit int64) error {
	for _, kv := range [][2]string{{"maxmemory-policy", "allkeys-lru"}, {"maxmemory", fmt.Sprint(limit)}, {"notify-keyspace-events", "Ee"}} {
		if err := c.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			return fmt.Errorf("CONFIG SET %s %s: %w", kv[0], kv[1], err)
		}
	}
	return nil
}

// evictingServers sets every lock server up for the evict fault: the
// single server (admin), or each primary of a Cluster. It returns their
// limits by address.
func evictingServers(ctx context.Context, topo topology, admin *redis.Client) (map[string]int64, error) {
	limits := make(map[string]int64)
	set := func(ctx context.Context, c *redis.Client) error {
		limit, err := evictionLimit(ctx, c)
		if err == nil {
			err = evicting(ctx, c, limit)
		}
		limits[c.Options().Addr] = limit
		return err
	}
	c, ok := topo.(*cluster)
	if !ok {
		return limits, set(ctx, admin)
	}
	var mu sync.Mutex
	return limits, c.admin.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		return set(ctx, node)
	})
}

// evictionLimit is the evict fault's memory limit for the lock Redis:
// evictHeadroom above what it uses now.
func evictionLimit(ctx context.Context, c *redis.Client) (int64, error) {
	used, err := usedMemory(ctx, c)
	return used + evictHeadroom, err
}

// usedMemory is what Redis says it uses (INFO memory's used_memory).
func usedMemory(ctx context.Context, c *redis.Client) (int64, error) {
	info, err := c.Info(ctx, "memory").Result()
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("INFO memory: used_memory %q: %w", v, err)
			}
			return n, nil
		}
	}
	return 0, errors.New("INFO memory has no used_memory")
}

// refusal is what a registry without WithEvictionAllowed did on the
// evicting lock Redis: it must refuse it (ErrServerEvicts).
type refusal struct {
	refused bool
	said    string
}

// checkRefusal has a registry without WithEvictionAllowed, on a client of
// its own, try to lock a key on the evicting lock Redis, once.
func checkRefusal(ctx context.Context, topo topology, lease time.Duration) (refusal, error) {
	var c redis.UniversalClient
	if t, ok := topo.(*cluster); ok {
		c = redis.NewClusterClient(&redis.ClusterOptions{Addrs: t.addrs()})
	} else {
		c = redis.NewClient(&redis.Options{Addr: topo.addrs()[0]})
	}
	defer c.Close()
	reg, err := lockreg.New(c, "lockcheck-refusal", lockreg.WithExpireAfter(lease), lockreg.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		return refusal{}, err
	}
	defer reg.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	lock := reg.Obtain("probe")
	switch err := lock.LockContext(ctx); {
	case errors.Is(err, lockreg.ErrServerEvicts):
		return refusal{refused: true, said: err.Error()}, nil
	case err == nil:
		_ = lock.UnlockContext(ctx)
		return refusal{said: "it took the key"}, nil
	default:
		return refusal{said: err.Error()}, nil
	}
}
