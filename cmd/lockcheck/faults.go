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

	"github.com/lockreg/lockreg/internal/redistest"
)

// injector runs one fault at a time on a schedule, rotating through the
// enabled kinds, and files each in the phase's history.
type injector struct {
	ph    *phase
	lock  *redistest.Server
	admin *redis.Client // to the lock server; it reconnects after a restart
	kinds []string
	next  *int // the rotation, carried across phases
	rng   *rand.Rand
	log   func(format string, a ...any)
}

// Fault durations, in terms of the lease: stops and pauses outlast it, so
// that holders lose their keys; DEBUG SLEEP stays within it, so that
// renewal should carry every hold across it.
func stopFor(lease time.Duration) time.Duration  { return lease * 3 / 2 }
func pauseFor(lease time.Duration) time.Duration { return lease * 3 / 2 }
func sleepFor(lease time.Duration) time.Duration { return lease / 2 }

// run injects faults at first, first+every, ... while they start before
// last.
func (in *injector) run(ctx context.Context, first time.Time, every time.Duration, last time.Time) error {
	for at := first; at.Before(last); at = at.Add(every) {
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
		if f.Kind == "" {
			continue // no holder to pick before the schedule ended
		}
		in.ph.col.fault(f)
		in.log("fault %-11s %6s  %s", f.Kind, time.Duration(f.End-f.Start).Round(time.Millisecond), f.Note)
	}
	return nil
}

func (in *injector) inject(ctx context.Context, kind string, last time.Time) (Fault, error) {
	lease := in.ph.cfg.lease
	f := Fault{Kind: kind, Worker: -1}
	switch kind {
	case faultStop, faultKill:
		w, keys, ok := in.pickHolder(ctx, last)
		if !ok {
			return Fault{}, nil
		}
		f.Worker, f.Keys = w.id, keys
		f.Start = time.Now().UnixNano()
		if kind == faultKill {
			if err := in.ph.kill(w); err != nil {
				return f, err
			}
			f.End = f.Start
			repl, err := in.ph.startWorker()
			if err != nil {
				return f, err
			}
			f.Note = fmt.Sprintf("worker %d (held %v); worker %d replaces it", w.id, keys, repl)
			return f, nil
		}
		if err := w.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			return f, err
		}
		// Resume even when interrupted: a stopped worker would not notice
		// being told to end.
		sleepCtx(ctx, stopFor(lease))
		err := w.cmd.Process.Signal(syscall.SIGCONT)
		f.End = time.Now().UnixNano()
		f.Note = fmt.Sprintf("worker %d (held %v)", w.id, keys)
		return f, err
	case faultClientKill:
		f.Start = time.Now().UnixNano()
		var killed int64
		for _, typ := range []string{"normal", "pubsub"} {
			n, err := in.admin.ClientKillByFilter(ctx, "TYPE", typ, "SKIPME", "yes").Result()
			if err != nil {
				return f, err
			}
			killed += n
		}
		f.End = time.Now().UnixNano()
		f.Note = fmt.Sprintf("%d connections", killed)
	case faultRestart:
		f.Start = time.Now().UnixNano()
		in.lock.Crash()
		if err := in.lock.Relaunch(); err != nil {
			return f, err
		}
		f.End = time.Now().UnixNano()
	case faultPause:
		d := pauseFor(lease)
		f.Start = time.Now().UnixNano()
		if err := in.admin.Do(ctx, "CLIENT", "PAUSE", d.Milliseconds(), "ALL").Err(); err != nil {
			return f, err
		}
		// The PING waits for the pause to end: the fault's true end.
		if err := in.admin.Ping(ctx).Err(); err != nil {
			return f, err
		}
		f.End = time.Now().UnixNano()
	case faultSleep:
		d := sleepFor(lease)
		f.Start = time.Now().UnixNano()
		if err := in.admin.Do(ctx, "DEBUG", "SLEEP", strconv.FormatFloat(d.Seconds(), 'f', 3, 64)).Err(); err != nil {
			return f, err
		}
		f.End = time.Now().UnixNano()
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
