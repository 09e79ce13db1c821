package lockreg

import (
	"fmt"
	"time"
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
	LossDeleted           // Redis said the key was gone or another owner's
	LossRestart           // Redis came back from a restart or failover without the key
	LossClosed            // the registry closed
	LossForced            // an operator forced the key open (Registry.ForceUnlock)
)

// String names the cause as metrics and logs do.
func (c LossCause) String() string {
	return [...]string{"none", "expired", "max_hold", "deleted", "restart", "closed", "forced"}[c]
}

// explain says what the cause means to the holder.
func (c LossCause) explain() string {
	return [...]string{
		"",
		"its lease ran out unrenewed (a stall longer than the lease, or Redis unreachable)",
		"it was held past WithMaxHold and its lease ran out",
		"its Redis key was deleted or passed to another owner",
		"Redis came back from a restart or failover without its key",
		"the registry was closed",
		"an operator forced its key open (ForceUnlock)",
	}[c]
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
	if h.cause != lossNone || h.released {
		return func() {}
	}
	h.cause = cause
	h.lostErr = fmt.Errorf("%w: key %q: %s", ErrLockLost, h.lock.key, cause.explain())
	close(h.lost)
	onLoss, err := h.onLoss, h.lostErr
	return func() {
		if onLoss != nil {
			onLoss(err)
		}
		e := LossEvent{Key: h.lock.key, Cause: cause, Held: time.Since(h.taken)}
		for _, hk := range h.lock.r.hooks.all() {
			if hk.Lost != nil {
				hk.Lost(e)
			}
		}
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
// signals h lost for cause: Redis said that the key was not this
// registry's, or a renewal came too late to tell.
func (h *Hold) endLease(cause LossCause) {
	h.leaseEnd.Store(0)
	h.lose(cause)
}

// extendLease moves the lease's end to end (unix ns), unless that would
// shorten it, and reports true, if the lease was live at sent: a renewal
// sent within the lease carries it on.
func (h *Hold) extendLease(sent time.Time, end int64) bool {
	for {
		current := h.leaseEnd.Load()
		if current <= sent.UnixNano() {
			return false
		}
		if current >= end || h.leaseEnd.CompareAndSwap(current, end) {
			return true
		}
	}
}

// leaseOver reports whether the lease ran out unrenewed, as the registry
// counts it.
func (h *Hold) leaseOver() bool { return time.Now().UnixNano() >= h.leaseEnd.Load() }

func (h *Hold) isLost() bool { return isClosed(h.lost) }
