package lockreg

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// A tenure is one stretch of the registry's holding of a key in Redis:
// from the acquisition that took it (an attempt or a grant) to the release
// that gives it back or the loss that ends it, over the holds handed off
// locally in between, which share it.
type tenure struct {
	// leaseEnd (an instant: on the monotonic clock, which a step of the
	// wall clock does not move) is when the lease ends at the latest:
	// measured from when the last successful acquisition or renewal was
	// sent, so it never overestimates the real lease; once a loss struck
	// the tenure, minus its cause (see strike), which every lease check
	// reads as over.
	leaseEnd atomic.Int64
	// confirm is made at the tenure's first local hand-off; see
	// confirmations.
	confirm atomic.Pointer[confirmations]
}

// confirmations are the releases of the tenure's holds that ended in a
// local hand-off, waiting to learn whether the key was still the
// registry's when they ended.
//
// Such a release asks Redis nothing, so unlike an owner-checked release it
// cannot itself find that the key changed behind the hold's back (a DEL, a
// flush). Tracking tells of such a change within about a round trip, but a
// hold may end within that round trip: the key then passes on, and the
// hold that held it when it changed would end without a word while another
// registry held the key too. So the release waits for a read of the key
// sent after the hand-off (the tracker's, one per turn for all the
// releases waiting on one tenure; without tracking, one on the registry's
// client at a time), or for the tenure's end, which is such
// a read too (its release script, or the loss found), and reports what it
// found. The next holder starts at once: only the goroutine that released
// waits, about a round trip.
type confirmations struct {
	mu sync.Mutex
	// waiting holds the releases no read has answered yet; asked, that a
	// read for them is queued with the tracker.
	waiting []chan verdict
	asked   bool
	// releasing says that the tenure's release script was sent, or is
	// about to be: a read from then on may find the key gone by that
	// release, so the release's outcome answers.
	releasing bool
	// ended says that the tenure ended; outcome is what its releases learn.
	ended   bool
	outcome verdict
}

// verdict is what a release waiting for its confirmation learns: err, and
// the loss's cause if err says the key was lost.
type verdict struct {
	cause LossCause
	err   error
}

// confirmations returns t's, made at once if need be.
func (t *tenure) confirmations() *confirmations {
	if c := t.confirm.Load(); c != nil {
		return c
	}
	t.confirm.CompareAndSwap(nil, new(confirmations))
	return t.confirm.Load()
}

// confirmHandoff waits until a read of h's key sent after h was handed off
// to next, in c, says whether the key was still the registry's, and returns
// nil if it was, else an error wrapping ErrLockLost and the loss's cause.
// It waits until Close or ctx's end, and at most for a lease: the
// registry's lease from now, or longer while the tenure's lease, which
// renewals and a grant's extension move on, lasts longer. Then (Redis
// unreachable, the tracking connection down, the registry closed) it
// returns ErrRedis.
func (r *Registry) confirmHandoff(ctx context.Context, h, next *Hold, c *confirmations) verdict {
	answer := make(chan verdict, 1)
	c.mu.Lock()
	if c.ended {
		v := c.outcome
		c.mu.Unlock()
		return v
	}
	c.waiting = append(c.waiting, answer)
	ask := !c.asked
	c.asked = true
	c.mu.Unlock()
	if ask {
		r.verify(next, LossDeleted) // the tracker's read, or the registry's client's without one
	}
	start := time.Now()
	deadline := func() time.Time {
		d := start.Add(r.cfg.expireAfter)
		if end := instant(h.tenure.leaseEnd.Load()).time(); end.After(d) {
			d = end
		}
		return d
	}
	wait := time.NewTimer(time.Until(deadline()))
	defer wait.Stop()
	for {
		select {
		case v := <-answer:
			return v
		case <-wait.C:
			if d := deadline(); time.Now().Before(d) {
				wait.Reset(time.Until(d))
				continue
			}
			select {
			case v := <-answer: // came as the wait ended
				return v
			default:
			}
			return verdict{err: fmt.Errorf("%w: release %q: no read confirmed the key after its local hand-off", ErrRedis, printedKey(h.lock.key))}
		case <-ctx.Done():
			select {
			case v := <-answer: // came as ctx ended
				return v
			default:
			}
			return verdict{err: fmt.Errorf("%w: release %q: no read confirmed the key after its local hand-off before ctx ended: %w", ErrRedis, printedKey(h.lock.key), ctx.Err())}
		case <-r.life.stopCtx.Done():
			// Not ErrClosed, which says that nothing was held (Do: fn did
			// not run): the hold was, and ended; only its confirmation is
			// missing, as when no read comes in time.
			return verdict{err: fmt.Errorf("%w: release %q: the registry closed before a read confirmed the key after its local hand-off", ErrRedis, printedKey(h.lock.key))}
		}
	}
}

// awaitsConfirmation reports whether releases of t wait for a read.
func (t *tenure) awaitsConfirmation() bool {
	c := t.confirm.Load()
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.waiting) > 0
}

// toConfirm hands the releases waiting for a confirmation, if any, to a
// read of the key about to be sent.
func (t *tenure) toConfirm() []chan verdict {
	c := t.confirm.Load()
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	taken := c.waiting
	c.waiting, c.asked = nil, false
	return taken
}

// settle answers taken, the releases a read took (toConfirm), now that it
// found the key the registry's (ours), or not, or failed. A key found
// changed ended the tenure first (see Registry.changedBehindItsBack). A
// read whose reply came after the tenure's release or a loss began may
// have seen the key after those, and the tenure's end answers instead; so
// does the next read, or the end, where this one failed. A reply after
// the tenure's lease confirms nothing either: the key may have lapsed and
// come back to the registry since the hand-off (a grant, a new hold).
func (t *tenure) settle(taken []chan verdict, ours bool) {
	if len(taken) == 0 {
		return
	}
	c := t.confirm.Load()
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.ended:
		tell(taken, c.outcome)
	case ours && !c.releasing && t.loss() == lossNone && int64(nowInstant()) < t.leaseEnd.Load():
		tell(taken, verdict{})
	default:
		c.waiting = append(c.waiting, taken...)
	}
}

// releaseBegins marks that the tenure's release script is about to be
// sent.
func (c *confirmations) releaseBegins() {
	c.mu.Lock()
	c.releasing = true
	c.mu.Unlock()
}

// end ends the tenure: its releases learn outcome, now and from then on.
// A loss found while the tenure's release runs is left to the release,
// which finds it too, or found the key the registry's when it ran.
func (c *confirmations) end(outcome verdict, byRelease bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended || (c.releasing && !byRelease) {
		return
	}
	c.ended, c.outcome = true, outcome
	tell(c.waiting, outcome)
	c.waiting = nil
}

// strike ends t for a loss of key, for cause: its lease is over, for
// good, and its releases waiting for a confirmation learn the loss (a
// read that settles in between sees the lease over, and leaves them to
// end). It returns the tenure's cause: an earlier strike's, if one came
// first (two finders of one change may strike at once), which its
// releases learn, and its holds must be told too.
func (t *tenure) strike(key string, cause LossCause) LossCause {
	for {
		end := t.leaseEnd.Load()
		if end <= 0 {
			cause = LossCause(-end)
			break
		}
		if t.leaseEnd.CompareAndSwap(end, -int64(cause)) {
			break
		}
	}
	if c := t.confirm.Load(); c != nil {
		c.end(handedOffVerdict(key, verdict{cause: cause, err: lossError(key, cause)}), false)
	}
	return cause
}

// handedOffVerdict is what the releases waiting for a confirmation learn
// from outcome, the end of their tenure of key. A lapse of the tenure's
// lease is a later hold's loss: theirs ended with a live lease (a hold
// whose lease is over is not handed off, nextLocalHold), so the lapse
// tells them only that no read confirmed them in time.
func handedOffVerdict(key string, outcome verdict) verdict {
	if outcome.cause != LossExpired && outcome.cause != LossMaxHold {
		return outcome
	}
	return verdict{err: fmt.Errorf("%w: release %q: no read confirmed the key after its local hand-off before the lease ran out", ErrRedis, printedKey(key))}
}

// loss is the cause of the loss that struck t, or lossNone while t lasts.
func (t *tenure) loss() LossCause {
	if end := t.leaseEnd.Load(); end <= 0 {
		return LossCause(-end)
	}
	return lossNone
}

func tell(waiting []chan verdict, v verdict) {
	for _, w := range waiting {
		w <- v
	}
}

// lossError is the error of a hold of key lost for cause.
func lossError(key string, cause LossCause) error {
	return fmt.Errorf("%w: key %q: %s", ErrLockLost, printedKey(key), cause.explain())
}

// keepConfirming queues again, for the next turn, a read for each tenure
// of batch that releases wait to have confirmed.
func (t *tracker) keepConfirming(batch []armRequest) {
	t.mu.Lock()
	defer t.mu.Unlock()
	seen := make(map[*tenure]bool)
	for _, req := range batch {
		if tn := req.h.tenure; !seen[tn] && tn.awaitsConfirmation() {
			seen[tn] = true
			t.queue = append(t.queue, armRequest{h: req.h, cause: req.cause})
		}
	}
}

// handedOut is the last token h handed out locally, or 0 if it handed
// none: token is h's own (read under h.mu).
func (h *Hold) handedOut(token int64) int64 {
	if h.handoffs > 0 {
		return token
	}
	return 0
}

// nextLocalHold returns the hold to hand off, with the Redis key, to the
// next local waiter, or nil when h must go back to Redis: hand-offs are
// off, h may be lost or its lease over, nobody waits, or the run of
// hand-offs reached its bound, after which other registries get their
// turn; or nothing renews h's lease and it is running out (passesOnLapse).
// If h has a token, the next hold's
// is one more: no other registry can draw a token meanwhile, as the key
// stays held, and the release stores the last one handed out. Otherwise
// the next hold draws its own if asked.
func (r *Registry) nextLocalHold(h *Hold, token int64, local *localLock) *Hold {
	if r.cfg.handoffMax == 0 || h.handoffs >= r.cfg.handoffMax || h.isLost() || h.leaseOver() ||
		h.redisTaken.since() >= r.cfg.handoffFor || local.unchecked.Load() > 0 || !local.waited() ||
		r.passesOnLapse(h) {
		return nil
	}
	next := &Hold{
		lock:       h.lock,
		via:        viaHandoff,
		local:      local,
		taken:      nowInstant(),
		redisTaken: h.redisTaken,
		handoffs:   h.handoffs + 1,
		tenure:     h.tenure,
		unclaimed:  true,
	}
	if token != 0 {
		next.token = token + 1
	}
	return next
}

// passesOnLapse reports whether a hand-off of h would pass on a lease
// that nothing renews any more, running out: h was held past WithMaxHold,
// whose renewal stopped, and the next hold would inherit a lease the
// watchdog may not renew before it ends; or renewal is off and the key
// was taken in Redis two thirds of a lease ago, so that less than a third
// of it is left, and the next hold would be lost soon after it began (the
// release that handed it off could wait for a read in vain). A granted
// key's short lease counts from the grant, as the grant's extension
// (extendLater) makes it a full one.
func (r *Registry) passesOnLapse(h *Hold) bool {
	if r.cfg.maxHold > 0 && h.taken.since() >= r.cfg.maxHold {
		return true
	}
	return !r.cfg.renewal && h.redisTaken.since() >= r.cfg.expireAfter*2/3
}
