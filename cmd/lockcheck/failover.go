//go:build linux

package main

import (
	"context"
	"fmt"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockreg/lockreg/internal/redistest"
)

// Failovers alternate between variants, so that a run has each:
//   - fast ("forced"): right after the kill, the promotion is triggered (SENTINEL
//     FAILOVER, CLUSTER FAILOVER FORCE on the replica), as a deployment
//     that detects failure quicker than the lease would have it. Only then
//     can a hold from before the kill still be live, by its own count, when
//     the new primary hands its key to a second owner: with detection by
//     timeout (1.5 s down-after, 2 s cluster node timeout), every lease
//     of 1 s has run out by the promotion.
//   - lagging: before the kill, the replica is frozen and its link cut at
//     the primary for 50 to 500 ms, so that what the primary took meanwhile
//     is certainly lost, instead of only when the kill beats replication by
//     microseconds.
//
// The n-th failover of a run is fast if n is even, and lagging if n is a
// multiple of 4.
func failoverVariant(n int) (fast, lagging bool) { return n%2 == 0, n%4 == 0 }

// variant names a failover's variant in the report.
func variant(fast bool) string {
	if fast {
		return "forced"
	}
	return "detected"
}

// The longest a promotion and a rejoining may take before the run fails.
const (
	promotionTimeout = 30 * time.Second
	rejoinTimeout    = 60 * time.Second
)

// failover kills -9 the Sentinel group's primary, waits until the Sentinels
// have promoted the replica, and brings the old primary back as its
// replica.
func (in *injector) failover(ctx context.Context, t *sentinelGroup) (fault, error) {
	fast, lagging := failoverVariant(*in.failovers)
	*in.failovers++
	primary, replica := t.g.Primary, t.g.Replica
	if replica.Role() == "master" {
		primary, replica = replica, primary
	}
	f := fault{kind: faultFailover, worker: -1, keys: in.ph.keys, variant: variant(fast)}
	note, err := in.kill(ctx, &f, primary, replica, lagging)
	if err != nil {
		return f, err
	}
	if fast {
		note += in.trigger(ctx, "SENTINEL FAILOVER", func() error {
			c := redis.NewSentinelClient(&redis.Options{Addr: t.g.SentinelAddrs()[0]})
			defer c.Close()
			return c.Failover(ctx, redistest.SentinelMaster).Err()
		})
	}
	promoted, err := t.g.AwaitFailover(primary, promotionTimeout)
	if err != nil {
		return f, err
	}
	f.end = time.Now().UnixNano()
	rejoined, err := timed(func() error { return t.g.Rejoin(primary, promoted, rejoinTimeout) })
	f.note = fmt.Sprintf("%s; %s promoted, %s rejoined as its replica in %v", note, promoted.Addr(), primary.Addr(), rejoined)
	return f, err
}

// clusterFailover kills -9 the primary of a key that is held now, waits
// until its replica serves the key's slot, and brings the killed node back,
// which turns into the new primary's replica.
func (in *injector) clusterFailover(ctx context.Context, t *cluster, last time.Time) (fault, error) {
	_, keys, ok := in.pickHolder(ctx, last)
	if !ok {
		return fault{}, nil
	}
	key := keys[in.rng.IntN(len(keys))]
	slot, err := t.slot(ctx, key)
	if err != nil {
		return fault{}, err
	}
	primary, replica, err := t.c.Shard(slot)
	if err != nil {
		return fault{}, err
	}
	if replica == nil {
		return fault{}, fmt.Errorf("%s, primary of slot %d, has no replica", primary.Addr(), slot)
	}
	fast, lagging := failoverVariant(*in.failovers)
	*in.failovers++
	f := fault{kind: faultClusterFailover, worker: -1, variant: variant(fast)}
	if f.keys, err = t.serves(ctx, primary.Addr(), in.ph.keys); err != nil {
		return f, err
	}
	note, err := in.kill(ctx, &f, primary, replica, lagging)
	if err != nil {
		return f, err
	}
	note = fmt.Sprintf("%s (slot %d of %s, keys %v)", note, slot, key, f.keys)
	if fast {
		note += in.trigger(ctx, "CLUSTER FAILOVER FORCE", func() error {
			c := redis.NewClient(&redis.Options{Addr: replica.Addr()})
			defer c.Close()
			return c.Do(ctx, "CLUSTER", "FAILOVER", "FORCE").Err()
		})
	}
	if err := t.c.AwaitFailover(slot, replica, promotionTimeout); err != nil {
		return f, err
	}
	f.end = time.Now().UnixNano()
	rejoined, err := timed(func() error { return t.c.Rejoin(primary, rejoinTimeout) })
	f.note = fmt.Sprintf("%s; %s took over, %s rejoined as its replica in %v", note, replica.Addr(), primary.Addr(), rejoined)
	return f, err
}

// kill kills primary with SIGKILL and files the kill as f's start; if
// lagging, it first freezes replica and cuts its link, and lets it go on
// after the kill.
func (in *injector) kill(ctx context.Context, f *fault, primary, replica *redistest.Server, lagging bool) (string, error) {
	note := "kill -9 " + primary.Addr()
	if lagging {
		if err := replica.Signal(syscall.SIGSTOP); err != nil {
			return note, err
		}
		c := redis.NewClient(&redis.Options{Addr: primary.Addr()})
		_, err := c.ClientKillByFilter(ctx, "TYPE", "replica").Result()
		_ = c.Close()
		if err != nil {
			_ = replica.Signal(syscall.SIGCONT)
			return note, fmt.Errorf("cut %s off: %w", replica.Addr(), err)
		}
		lag := 50*time.Millisecond + time.Duration(in.rng.Int64N(int64(450*time.Millisecond)))
		sleepCtx(ctx, lag)
		note = fmt.Sprintf("%s, its replica cut off %v before", note, lag.Round(time.Millisecond))
	}
	f.start = time.Now().UnixNano()
	primary.Crash()
	if lagging {
		if err := replica.Signal(syscall.SIGCONT); err != nil {
			return note, err
		}
	}
	return note, nil
}

// trigger runs a command that starts the promotion at once, and says how
// it went for the fault's note. Should it fail (a failover the Sentinels
// began themselves is in progress), the failover goes on by detection.
func (in *injector) trigger(ctx context.Context, name string, run func() error) string {
	if err := run(); err != nil {
		return fmt.Sprintf("; %s failed (%v): detected instead", name, err)
	}
	return "; " + name
}

// timed runs fn and returns how long it took.
func timed(fn func() error) (time.Duration, error) {
	start := time.Now()
	err := fn()
	return time.Since(start).Round(time.Millisecond), err
}

// migrate moves the slot of a key that is held now, and waited for if
// any held key is, to the next primary, a step at a time with a quarter
// lease between steps: the slot marked migrating, each of its keys (the
// lock, its fence, its waiting marker and queue) moved, the slot handed
// over.
func (in *injector) migrate(ctx context.Context, t *cluster, last time.Time) (fault, error) {
	_, keys, ok := in.pickHolder(ctx, last)
	if !ok {
		return fault{}, nil
	}
	key, waited := in.waitedKey(ctx, t, keys)
	slot, err := t.slot(ctx, key)
	if err != nil {
		return fault{}, err
	}
	primaries, err := t.c.Primaries()
	if err != nil {
		return fault{}, err
	}
	f := fault{kind: faultMigrate, worker: -1, keys: []string{key}, start: time.Now().UnixNano()}
	m, err := redistest.StartSlotMigration(primaries, slot)
	if err != nil {
		return f, err
	}
	defer m.Close()
	step := in.ph.cfg.lease / 4
	moved := 0
	for {
		sleepCtx(ctx, step)
		_, ok, err := m.Move()
		if err != nil {
			return f, err
		}
		if !ok {
			break
		}
		moved++
	}
	if err := m.Complete(); err != nil {
		return f, err
	}
	f.end = time.Now().UnixNano()
	f.note = fmt.Sprintf("slot %d of %s (held, %s) from %s to %s, %d Redis keys moved one by one", slot, key, waited, m.From, m.To, moved)
	return f, nil
}

// waitedKey picks one of keys, one some registry waits for if there is.
func (in *injector) waitedKey(ctx context.Context, t *cluster, keys []string) (string, string) {
	in.rng.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
	for _, k := range keys {
		lock := in.ph.registry + ":{" + k + "}"
		n, err := t.admin.Exists(ctx, lock+":waiting", lock+":queue").Result()
		if err == nil && n > 0 {
			return k, "waited for"
		}
	}
	return keys[0], "not waited for"
}
