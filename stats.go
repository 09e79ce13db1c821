package lockreg

import (
	"math/bits"
	"sync/atomic"
	"time"
)

// Stats is a snapshot of a registry's counters, cumulative since New
// unless marked "now".
type Stats struct {
	// Acquisitions counts fresh holds (depth 0 to 1), local hand-offs
	// included; reentrant re-locks are not counted.
	Acquisitions int64
	// LocalHandoffs counts holds passed to a waiting goroutine of this
	// registry without a Redis round trip.
	LocalHandoffs int64
	// Grants counts keys another registry's release passed straight to a
	// goroutine of this registry that waited for them, without an
	// acquisition call (docs/PROTOCOL.md, The grant).
	Grants int64
	// FailedAttempts counts acquisition calls to Redis that did not take
	// the key: another owner held it, too few replicas acknowledged, or
	// the call failed.
	FailedAttempts int64
	// AcquireCalls, ReleaseCalls and RenewCalls count the calls sent to
	// Redis of each kind: an attempt's plain SET and the obtain.lua call
	// that follows it when the key was taken count as two. Calls of
	// concurrent goroutines share round trips, as one pipeline; with
	// WithWaitReplicas an acquisition's WAIT rides in its call's round
	// trip. Lock.Token's draws are not counted.
	AcquireCalls, ReleaseCalls, RenewCalls int64
	// Notifications counts release notifications received by the
	// registry's subscription.
	Notifications int64
	// Tracking says that the registry learns at once that a held key
	// changed (CLIENT TRACKING: a DEL, an overwrite, a flush, an eviction).
	// False until tracking is on, while no tracker's server answers (its
	// subscription broke: until it is back, holders learn of changes at
	// their renewals), and for good where the server refuses it
	// (an ACL without CLIENT, a proxy) or the client is neither a
	// *redis.Client nor a *redis.ClusterClient: holders then learn of such
	// changes at their next renewal.
	Tracking bool
	// Held is the number of holds now, a hold whose release is on its way
	// to Redis included.
	Held int64
	// Tracked is the number of keys with local state now: held or waited
	// for.
	Tracked int
	// Wait summarizes how long fresh acquisitions waited, from the call to
	// the hold, local waiting included.
	Wait WaitStats
}

// WaitStats summarizes acquisition waits. The quantiles are upper bounds
// read off power-of-two buckets (1µs, 2µs, 4µs, ...), capped at Max, so
// they overstate by up to 2x; Mean and Max are exact.
type WaitStats struct {
	Count               int64
	Mean, P50, P99, Max time.Duration
}

// waitBuckets: bucket i counts waits shorter than 2^i µs (the last one,
// everything longer).
const waitBuckets = 40

// counters are the registry's live statistics: atomics only, so that the
// hot path never takes a lock for them.
type counters struct {
	acquisitions, handoffs, grants, failed        atomic.Int64
	acquireCalls, releaseCalls, renewCalls, notes atomic.Int64
	held                                          atomic.Int64
	waitCount, waitTotal, waitMax                 atomic.Int64
	waits                                         [waitBuckets]atomic.Int64
}

// acquired counts a hold taken via, which its caller gets, after a wait.
// (held counts it before: a hold that Close overtakes is released, and
// counted out, without its caller.)
func (c *counters) acquired(waited time.Duration, via pathIndex) {
	c.acquisitions.Add(1)
	switch via {
	case viaHandoff:
		c.handoffs.Add(1)
	case viaGrant:
		c.grants.Add(1)
	}
	c.waitCount.Add(1)
	c.waitTotal.Add(int64(waited))
	for m := c.waitMax.Load(); int64(waited) > m && !c.waitMax.CompareAndSwap(m, int64(waited)); m = c.waitMax.Load() {
	}
	c.waits[min(bits.Len64(uint64(waited/time.Microsecond)), waitBuckets-1)].Add(1)
}

// Stats returns a snapshot of the registry's counters. Each counter is
// read atomically, the set of them not: under load they may be a few
// events apart.
func (r *Registry) Stats() Stats {
	c := &r.stats
	s := Stats{
		Acquisitions:   c.acquisitions.Load(),
		LocalHandoffs:  c.handoffs.Load(),
		Grants:         c.grants.Load(),
		FailedAttempts: c.failed.Load(),
		AcquireCalls:   c.acquireCalls.Load(),
		ReleaseCalls:   c.releaseCalls.Load(),
		RenewCalls:     c.renewCalls.Load(),
		Notifications:  c.notes.Load(),
		Held:           c.held.Load(),
		Tracked:        r.locals.size(),
		Tracking:       r.tracking.on.Load() && !r.tracking.refused.Load() && r.trackingUp(),
	}
	w := &s.Wait
	w.Count = c.waitCount.Load()
	w.Max = time.Duration(c.waitMax.Load())
	if w.Count == 0 {
		return s
	}
	w.Mean = time.Duration(c.waitTotal.Load() / w.Count)
	var buckets [waitBuckets]int64
	var total int64
	for i := range buckets {
		buckets[i] = c.waits[i].Load()
		total += buckets[i]
	}
	w.P50 = min(quantile(buckets[:], total, 0.50), w.Max)
	w.P99 = min(quantile(buckets[:], total, 0.99), w.Max)
	return s
}

// quantile is the upper bound of the bucket holding the q-quantile.
func quantile(buckets []int64, total int64, q float64) time.Duration {
	rank := int64(q * float64(total))
	for i, n := range buckets {
		if rank -= n; rank < 0 {
			return time.Duration(1<<i) * time.Microsecond
		}
	}
	return time.Duration(1<<(len(buckets)-1)) * time.Microsecond
}
