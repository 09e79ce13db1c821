//go:build linux

package main

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// injector runs one fault at a time on a schedule, rotating through the
// enabled kinds, and files each in the phase's history.
type injector struct {
	ph    *phase
	topo  topology
	admin *redis.Client // to a single lock server; it reconnects after a restart
	kinds []string
	next  *int // the rotation, carried across phases
	rng   *rand.Rand
	log   func(format string, a ...any)
	// failovers counts the run's failovers so far, which alternate
	// between variants (see failover.go), across phases.
	failovers *int
	// keyAdmin is a client of the lock Redis for the key faults, whatever
	// its topology; flushes counts this phase's flush faults, which
	// alternate between FLUSHALL and FLUSHDB; evictLimits are the memory
	// limits of the lock Redis's primaries, by address, for the evict
	// fault, whose fillers are filler.
	keyAdmin    redis.UniversalClient
	flushes     int
	evictLimits map[string]int64
	filler      string
}

// Fault durations, in terms of the lease: stops and pauses outlast it, so
// that holders lose their keys; DEBUG SLEEP stays within it, so that
// renewal should carry every hold across it.
func stopFor(lease time.Duration) time.Duration  { return lease * 3 / 2 }
func pauseFor(lease time.Duration) time.Duration { return lease * 3 / 2 }
func sleepFor(lease time.Duration) time.Duration { return lease / 2 }

// run injects faults at first, first+every, ... while they start before
// last; a fault starts a lease after the one before returned at the
// earliest, so that even a long one (a failover and the old primary's
// rejoining) is over and recovered from before the next.
func (in *injector) run(ctx context.Context, first time.Time, every time.Duration, last time.Time) error {
	lease := in.ph.cfg.lease
	for at := first; at.Before(last); {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Until(at)):
		}
		kind := in.kinds[*in.next%len(in.kinds)]
		*in.next++
		f, err := in.inject(ctx, kind, last)
		if err != nil {
			return fmt.Errorf("%s fault: %w", kind, err)
		}
		at = later(at.Add(every), time.Now().Add(lease))
		if f.kind == "" {
			continue // nothing to strike before the schedule ended
		}
		in.ph.col.fault(f)
		in.log("%s fault %-16s %7s  %s", time.Unix(0, f.start).Format("15:04:05.000"), f.kind, time.Duration(f.end-f.start).Round(time.Millisecond), f.note)
	}
	return nil
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func (in *injector) inject(ctx context.Context, kind string, last time.Time) (fault, error) {
	lease := in.ph.cfg.lease
	f := fault{kind: kind, worker: -1}
	switch kind {
	case faultNetStall, faultNetDelay, faultNetReset:
		return in.network(ctx, kind, last)
	case faultFailover:
		return in.failover(ctx, in.topo.(*sentinelGroup))
	case faultClusterFailover:
		return in.clusterFailover(ctx, in.topo.(*cluster), last)
	case faultMigrate:
		return in.migrate(ctx, in.topo.(*cluster), last)
	case faultDel, faultOverwrite, faultFlush, faultEvict:
		return in.keyFault(ctx, kind, last)
	case faultStop, faultKill:
		w, keys, ok := in.pickHolder(ctx, last)
		if !ok {
			return fault{}, nil
		}
		f.worker, f.keys = w.id, keys
		f.start = time.Now().UnixNano()
		if kind == faultKill {
			if err := in.ph.kill(w); err != nil {
				return f, err
			}
			f.end = f.start
			repl, err := in.ph.startWorker()
			if err != nil {
				return f, err
			}
			f.note = fmt.Sprintf("worker %d (held %v); worker %d replaces it", w.id, keys, repl)
			return f, nil
		}
		if err := w.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			return f, err
		}
		// Resume even when interrupted: a stopped worker would not notice
		// being told to end.
		sleepCtx(ctx, stopFor(lease))
		err := w.cmd.Process.Signal(syscall.SIGCONT)
		f.end = time.Now().UnixNano()
		f.note = fmt.Sprintf("worker %d (held %v)", w.id, keys)
		return f, err
	case faultClientKill:
		f.start = time.Now().UnixNano()
		var killed int64
		for _, typ := range []string{"normal", "pubsub"} {
			n, err := in.admin.ClientKillByFilter(ctx, "TYPE", typ, "SKIPME", "yes").Result()
			if err != nil {
				return f, err
			}
			killed += n
		}
		f.end = time.Now().UnixNano()
		f.note = fmt.Sprintf("%d connections", killed)
	case faultRestart:
		lock := in.topo.(*singleServer).srv
		f.start = time.Now().UnixNano()
		lock.Crash()
		if err := lock.Relaunch(); err != nil {
			return f, err
		}
		f.end = time.Now().UnixNano()
	case faultPause:
		d := pauseFor(lease)
		f.start = time.Now().UnixNano()
		if err := in.admin.Do(ctx, "CLIENT", "PAUSE", d.Milliseconds(), "ALL").Err(); err != nil {
			return f, err
		}
		// The PING waits for the pause to end: the fault's true end.
		if err := in.admin.Ping(ctx).Err(); err != nil {
			return f, err
		}
		f.end = time.Now().UnixNano()
	case faultSleep:
		d := sleepFor(lease)
		f.start = time.Now().UnixNano()
		if err := in.admin.Do(ctx, "DEBUG", "SLEEP", strconv.FormatFloat(d.Seconds(), 'f', 3, 64)).Err(); err != nil {
			return f, err
		}
		f.end = time.Now().UnixNano()
	}
	return f, nil
}

// pickHolder picks a random worker that is inside a critical section now,
// waiting for one until last.
func (in *injector) pickHolder(ctx context.Context, last time.Time) (*workerProc, []string, bool) {
	for time.Now().Before(last) && ctx.Err() == nil {
		holders := in.ph.col.holders()
		ids := slices.Sorted(maps.Keys(holders))
		if len(ids) > 0 {
			id := ids[in.rng.IntN(len(ids))]
			if w := in.ph.proc(id); w != nil {
				keys := holders[id]
				slices.Sort(keys)
				return w, slices.Compact(keys), true
			}
		}
		sleepCtx(ctx, 2*time.Millisecond)
	}
	return nil, nil, false
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
