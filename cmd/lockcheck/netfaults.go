//go:build linux

package main

import (
	"context"
	"fmt"
	"time"
)

// Network fault durations: a stall outlasts the lease, as a stop does, so
// that the victim's holds lose their keys while its requests wait on the
// wire; a delay lasts a few seconds, adding 5 to 50 ms to every piece of
// data each way, which renewal should absorb.
func stallFor(lease time.Duration) time.Duration { return stopFor(lease) }

const (
	delayFor           = 3 * time.Second
	delayMin, delayMax = 5 * time.Millisecond, 50 * time.Millisecond
)

// network strikes the connections of a worker that holds a lock now,
// through its router: every connection it has to Redis (Sentinels and
// every cluster node included) and every one it dials meanwhile.
func (in *injector) network(ctx context.Context, kind string, last time.Time) (fault, error) {
	if kind == faultNetDelay && time.Now().Add(delayFor).After(last) {
		return fault{}, nil // it would not end in time to recover from
	}
	w, keys, ok := in.pickHolder(ctx, last)
	if !ok {
		return fault{}, nil
	}
	f := fault{kind: kind, worker: w.id, keys: keys, start: time.Now().UnixNano()}
	switch kind {
	case faultNetStall:
		w.router.Stall()
		// Resume even when interrupted: the worker's calls wait on it.
		sleepCtx(ctx, stallFor(in.ph.cfg.lease))
		w.router.Resume()
		f.note = fmt.Sprintf("worker %d (held %v)", w.id, keys)
	case faultNetDelay:
		w.router.Delay(delayMin, delayMax)
		sleepCtx(ctx, delayFor)
		w.router.Delay(0, 0)
		f.note = fmt.Sprintf("worker %d (held %v)", w.id, keys)
	case faultNetReset:
		n := w.router.ResetConns()
		f.note = fmt.Sprintf("worker %d (held %v): %d connections", w.id, keys, n)
	}
	f.end = time.Now().UnixNano()
	return f, nil
}
