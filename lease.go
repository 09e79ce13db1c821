package lockreg

import (
	"context"
	"fmt"
	"time"

	"github.com/lockreg/lockreg/internal/protocol"
)

// A hold's lease is how long its key is this registry's at the least: the
// registry counts it from when the call that took or last renewed the key
// was sent, so it never overestimates the real lease. A hold is lost when
// the registry can no longer tell that the key stayed its own: the lease
// ran out unrenewed, Redis said the key was gone or another's, or the
// registry closed. Renewal (renewal.go) extends leases and finds losses.

// LossCause says why a hold may have been lost.
type LossCause uint8

const (
	lossNone    LossCause = iota
	LossExpired           // the lease ran out unrenewed
	LossMaxHold           // renewal stopped at WithMaxHold, and the lease ran out
	LossDeleted           // Redis said the key was gone (deleted, or expired by Redis's clock)
	LossRestart           // Redis came back from a restart or failover without the key
	LossClosed            // the registry closed
	LossForced            // an operator forced the key open (Registry.ForceUnlock)
	// LossOverwritten: the key was set to another value behind the
	// holder's back, or passed through another owner before it came back
	// (releases, and renewal of a key passed on and back, which cannot
	// tell, say LossDeleted).
	LossOverwritten
	LossFlushed // the database was flushed (FLUSHALL, FLUSHDB)
	LossEvicted // the server evicted the key (maxmemory; see WithEvictionAllowed)
)

// lossCauses names each cause as metrics and logs do, and says what it
// means to the holder.
var lossCauses = [...]struct{ name, meaning string }{
	lossNone:        {"none", ""},
	LossExpired:     {"expired", "its lease ran out unrenewed (a stall longer than the lease, or renewals failing; the log says why)"},
	LossMaxHold:     {"max_hold", "it was held past WithMaxHold and its lease ran out"},
	LossDeleted:     {"deleted", "its Redis key was deleted or passed to another owner"},
	LossRestart:     {"restart", "Redis came back from a restart or failover without its key"},
	LossClosed:      {"closed", "the registry was closed"},
	LossForced:      {"forced", "an operator forced its key open (ForceUnlock)"},
	LossOverwritten: {"overwritten", "its Redis key was set to another value, or passed to another owner, behind its back"},
	LossFlushed:     {"flushed", "its Redis database was flushed (FLUSHALL, FLUSHDB)"},
	LossEvicted:     {"evicted", "Redis evicted its key (maxmemory)"},
}

// String names the cause as metrics and logs do. The zero value, no loss
// (a ReleaseEvent's FoundLost when the release found none), reads "none";
// a value beyond the causes reads "LossCause(n)".
func (c LossCause) String() string {
	if int(c) < len(lossCauses) {
		return lossCauses[c].name
	}
	return fmt.Sprintf("LossCause(%d)", c)
}

// explain says what the cause means to the holder.
func (c LossCause) explain() string {
	if int(c) < len(lossCauses) {
		return lossCauses[c].meaning
	}
	return c.String()
}

// lossUnknown is the cause of a loss that release.lua found: the key was
// not this registry's any more, for a reason Redis does not tell.
const lossUnknown = "its Redis key expired, was deleted, or Redis lost it"

// lose signals the hold lost for cause, once, unless it was released
// first (a release that found the key gone reports that itself).
func (h *Hold) lose(cause LossCause) {
	h.mu.Lock()
	tell := h.loseLocked(cause)
	h.mu.Unlock()
	tell()
}

// loseLocked is lose, with h.mu held; the caller runs tell once it let go
// of h.mu, to tell whoever asked to be told (see whenLost).
func (h *Hold) loseLocked(cause LossCause) (tell func()) {
	if !h.signalLocked(cause) {
		return func() {}
	}
	h.ended()
	if h.unclaimed {
		// No acquisition returned the hold yet, and none may: a hand-off
		// whose tenure a loss struck is discarded by its waiter, which
		// takes the key in Redis instead, and an acquisition that Close
		// overtook releases its hold and says ErrClosed. The hooks, which
		// count the holds that AcquireDone reported, hear of the loss once
		// the hold is claimed, if ever; else they would count one hold
		// ended twice.
		h.untold = true
		return func() {}
	}
	return h.tellLoss(cause, h.onLoss, h.lostErr)
}

// signalLocked records h lost for cause and closes Lost, unless it was
// lost or released first; h.mu is held.
func (h *Hold) signalLocked(cause LossCause) bool {
	if h.cause != lossNone || h.released {
		return false
	}
	h.cause = cause
	h.lostErr = lossError(h.lock.key, cause)
	if h.lost != nil {
		close(h.lost)
	}
	return true
}

// tellLoss tells onLoss, if any, and the hooks that h was lost for cause,
// with err; h.mu is not held.
func (h *Hold) tellLoss(cause LossCause, onLoss func(error), err error) func() {
	return func() {
		if onLoss != nil {
			onLoss(err)
		}
		e := LossEvent{Key: h.lock.key, Cause: cause, Held: h.taken.since()}
		for _, hk := range h.lock.r.hooks.all() {
			if hk.Lost != nil {
				h.lock.r.tellLost(hk.Lost, e)
			}
		}
	}
}

// claim records that an acquisition returns h, and tells the hooks of a
// loss that came before (see loseLocked).
func (h *Hold) claim() {
	h.mu.Lock()
	h.unclaimed = false
	untold, cause, err := h.untold, h.cause, h.lostErr
	h.untold = false
	h.mu.Unlock()
	if untold {
		h.tellLoss(cause, nil, err)()
	}
}

// lossError is the error of a lost hold, or nil.
func (h *Hold) lossError() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lostErr
}

// whenLost arranges for fn to be told of the hold's loss: at once if it
// is lost already.
func (h *Hold) whenLost(fn func(error)) {
	h.mu.Lock()
	err := h.lostErr
	if err == nil {
		h.onLoss = fn
	}
	h.mu.Unlock()
	if err != nil {
		fn(err)
	}
}

// endLease ends the lease now, for h and the holds handed on from it, and
// signals h lost for cause, and with it the hold of the tenure that is
// current now: Redis said that the key was not this registry's, or a
// renewal came too late to tell. h may have been handed off meanwhile (a
// renewal, a Token or a give-back that went out before its release): the
// news is the current hold's then. The tenure is struck before this looks
// for its current hold: a hold handed off from h that becomes current
// after the look finds the strike itself (Lock.takeHold).
func (h *Hold) endLease(cause LossCause) {
	cause = h.tenure.strike(h.lock.key, cause)
	h.lose(cause)
	if current := currentOf(h); current != h {
		current.lose(cause)
	}
}

// changedBehindItsBack loses h, whose key was found gone (or, with gone
// false, set to another value) after an event that suggested cause; and
// with it the hold of the same tenure of the key that is current now, a
// hold handed off from h. evicted says that the server evicted keys
// meanwhile.
func (r *Registry) changedBehindItsBack(h *Hold, cause LossCause, gone, evicted bool) {
	if h.tenure.loss() != lossNone {
		return // the tenure was ended by an earlier loss, which named its cause
	}
	// A forced unlock names the hold that was current when its note came.
	forced := false
	for _, held := range []*Hold{h, currentOf(h)} {
		held.mu.Lock()
		forced = forced || held.forced
		held.mu.Unlock()
	}
	switch {
	case forced:
		cause = LossForced
	case h.leaseOver():
		cause = r.lapseCause(h)
	case cause == LossRestart || cause == LossFlushed || cause == LossForced:
	case gone && r.forcing.inFlight(h.lock.key):
		cause = LossForced // found before the reply of this registry's own ForceUnlock
	case !gone:
		cause = LossOverwritten
	case evicted:
		cause = LossEvicted
	}
	h.endLease(cause)
}

// currentOf is the key's current hold if it is of h's tenure (handed off
// from h), else h.
func currentOf(h *Hold) *Hold {
	if h.local == nil { // not yet stored as its key's hold (takeHold)
		return h
	}
	if current := h.local.hold.Load(); current != nil && current.tenure == h.tenure {
		return current
	}
	return h
}

// extendLease moves the lease's end to end (an instant), unless that would
// shorten it, and reports true, if the lease was live at sent and still is:
// a renewal sent and answered within the lease carries it on. One answered
// after it may have reached Redis once the key had lapsed there and come
// back to the registry (a grant), which the owner check cannot tell.
func (h *Hold) extendLease(sent time.Time, end int64) bool {
	for {
		current := h.tenure.leaseEnd.Load()
		if current <= int64(instantOf(sent)) || current <= int64(nowInstant()) {
			return false
		}
		if current >= end || h.tenure.leaseEnd.CompareAndSwap(current, end) {
			return true
		}
	}
}

// leaseOver reports whether the lease ran out unrenewed, as the registry
// counts it.
func (h *Hold) leaseOver() bool { return int64(nowInstant()) >= h.tenure.leaseEnd.Load() }

// lossNow is h's loss error, or nil while it lives. A lease that ran out
// unrenewed, which the watchdog signals as its timer fires, is signalled
// now: a caller about to act under h must not wait for that.
func (h *Hold) lossNow() error {
	if cause := h.tenure.loss(); cause != lossNone {
		h.lose(cause)
	} else if h.leaseOver() {
		h.lose(h.lock.r.lapseCause(h))
	}
	return h.lossError()
}

func (h *Hold) isLost() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cause != lossNone
}

// verifyHolds checks that Redis still has the key of every hold, arming
// it, after an event that may have lost keys (a restart, a failover, a
// flush): a key found gone loses its hold for cause. Without tracking it
// reads the keys on the registry's client, in one pipeline.
func (r *Registry) verifyHolds(cause LossCause) {
	// After a flush or a reconnect, a key may have changed until it is
	// checked: no hand-off meanwhile. (A first tracking connection arms
	// keys that nothing said changed.)
	changed := cause == LossFlushed || cause == LossRestart
	var unarmed []*Hold
	r.forEachHold(func(h *Hold) {
		if h.isLost() {
			return
		}
		if t := r.trackerFor(h.redisKey()); t != nil {
			if changed {
				h.local.unchecked.Add(1)
			}
			t.enqueue(armRequest{h: h, cause: cause, invalidated: changed})
		} else {
			unarmed = append(unarmed, h)
		}
	})
	if len(unarmed) > 0 {
		r.goBackground(func(ctx context.Context) { r.checkHolds(ctx, unarmed, cause) })
	}
}

// verify checks one hold's key as verifyHolds does.
func (r *Registry) verify(h *Hold, cause LossCause) {
	if t := r.trackerFor(h.redisKey()); t != nil {
		t.enqueue(armRequest{h: h, cause: cause})
		return
	}
	r.goBackground(func(ctx context.Context) { r.checkHolds(ctx, []*Hold{h}, cause) })
}

// checkHolds reads the keys of holds on the registry's client, in one
// pipeline, and loses the holds whose keys are not its own for cause.
// Where a read failed and releases wait on it to confirm a hand-off
// (settle queued them again), no tracker's next turn reads again: it
// reads again after a retry interval, until the releases are answered
// (the tenure's end answers them too) or the registry closes.
func (r *Registry) checkHolds(ctx context.Context, holds []*Hold, cause LossCause) {
	for len(holds) > 0 {
		failed := r.checkHoldsOnce(ctx, holds, cause)
		holds = holds[:0:0]
		for _, h := range failed {
			if h.tenure.awaitsConfirmation() {
				holds = append(holds, h)
			}
		}
		if len(holds) == 0 {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(r.cfg.retryInterval):
		}
	}
}

// checkHoldsOnce is one read of checkHolds; it returns the holds whose
// read failed while releases waited on it.
func (r *Registry) checkHoldsOnce(ctx context.Context, holds []*Hold, cause LossCause) (failed []*Hold) {
	calls := make([]*protocol.Call, len(holds))
	confirming := make([][]chan verdict, len(holds)) // see armBatch
	for i, h := range holds {
		calls[i] = r.peer.CheckOwner(h.redisKey())
		confirming[i] = h.tenure.toConfirm()
	}
	if r.countCallsAside(OpCheck, calls) == nil {
		protocol.RunPipeline(ctx, r.client, calls)
	}
	evicted, settle := r.evictionsOf(ctx)
	defer settle(holds)
	logged := false
	var restored []*Hold
	defer func() { r.renewRestored(restored) }()
	for i, h := range holds {
		owner, err := r.peer.ReadOwner(calls[i])
		switch {
		case err != nil && !logged:
			logged = true
			r.cfg.logger.Debug("lockreg: could not check the held keys; the renewal will", "error", err)
		case err != nil:
		case owner != protocol.Ours:
			gone := owner == protocol.Gone
			r.changedBehindItsBack(h, cause, gone, gone && evicted(h.redisKey()))
		case cause == LossRestart:
			restored = append(restored, h)
		default:
			spareForced(h, cause)
		}
		h.tenure.settle(confirming[i], err == nil && owner == protocol.Ours)
		if err != nil && len(confirming[i]) > 0 {
			failed = append(failed, h)
		}
	}
	return failed
}
