package lockreg

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/lockreg/lockreg/internal/protocol"
)

// release is Release, for Hold values and the last Unlock alike. It tells
// the hooks.
func (h *Hold) release(ctx context.Context) error {
	hooks := h.lock.r.hooks.all()
	if hooks == nil {
		_, err := h.releaseKey(ctx)
		return err
	}
	held := h.taken.since() // the release's own time is not the hold's
	callerCtx := ctx
	begun, ended := 0, false // begun: the hooks whose ReleaseStart returned
	defer func() {
		if ended {
			return // a ReleaseDone hook panicked: it is not told again
		}
		// A panic (a ReleaseStart hook's, a client's) still tells
		// ReleaseDone to the hooks whose ReleaseStart was called, so that
		// what they began, a span, ends; the panic goes on.
		var loss releaseLoss
		var err error
		if begun < len(hooks) {
			// A ReleaseStart hook's: the hold is released all the same.
			loss, err = h.releaseKey(callerCtx)
		} else {
			// A client's, in the release's Redis calls (a go-redis hook's,
			// a RedisCalls hook's), which came after releaseKey marked the
			// hold released: no loss is signalled since, and the loss it
			// would have found is not known.
			loss, err = h.signalledLoss(), errReleasePanicked(h.lock.key)
		}
		// A hold whose loss the hooks were told of ends with that loss,
		// for them: its release must say so, or they count it ended twice.
		tellReleaseDone(ctx, hooks[:begun], h.releaseEvent(held, loss, err))
	}()
	for i, hk := range hooks {
		if hk.ReleaseStart != nil {
			ctx = cmp.Or(hk.ReleaseStart(ctx, h.lock.key), ctx) // nil keeps ctx
		}
		begun = i + 1
	}
	loss, err := h.releaseKey(ctx)
	ended = true
	tellReleaseDone(ctx, hooks, h.releaseEvent(held, loss, err))
	return err
}

// releaseEvent is the end of h's release, which knew loss of it.
func (h *Hold) releaseEvent(held time.Duration, loss releaseLoss, err error) ReleaseEvent {
	e := ReleaseEvent{Key: h.lock.key, Held: held, WasLost: loss.signalled, Err: err}
	if !loss.signalled {
		e.FoundLost = loss.cause
	}
	return e
}

// signalledLoss is the loss signalled of h, released already, if any.
func (h *Hold) signalledLoss() releaseLoss {
	h.mu.Lock()
	defer h.mu.Unlock()
	return releaseLoss{cause: h.cause, signalled: h.cause != lossNone}
}

// errReleasePanicked is the error of a release that a panic in its Redis
// calls cut short: the key is freed in Redis, or left to its lease.
func errReleasePanicked(key string) error {
	return fmt.Errorf("%w: key %q: the release panicked", ErrRedis, printedKey(key))
}

// releaseLoss is what a release knew of its hold's loss: its cause, if it
// was lost, and whether it had been signalled before (Lost closed) or the
// release found it.
type releaseLoss struct {
	cause     LossCause
	signalled bool
}

// releaseKey is release's work. It returns what it knew of the hold's
// loss, read under the hold's lock (once released, no loss is signalled),
// and the error.
func (h *Hold) releaseKey(ctx context.Context) (releaseLoss, error) {
	l, local := h.lock, h.local
	r := l.r
	h.mu.Lock()
	if h.released {
		h.mu.Unlock()
		return releaseLoss{}, fmt.Errorf("%w: key %q: released already", ErrNotHeld, printedKey(l.key))
	}
	h.released = true
	token, lostErr, keyReleased := h.token, h.lostErr, h.keyReleased
	loss := releaseLoss{cause: h.cause, signalled: h.cause != lossNone}
	h.mu.Unlock()

	// The key's local state keeps a current hold until the key is handed
	// off or goes back to Redis: a grant that lands in between finds the
	// key held here (receiveGrant), rather than leave its token to a
	// waiter that never takes it, which would hide from the next hold that
	// its key went through another owner.
	// The hold counts as held until its release is done, in Redis too: a
	// Shutdown that returned before that would let its caller close the
	// client under the release, and leave the key locked for its lease.
	defer r.holdEnded()
	// Done closes once the release's outcome is known, which Err then says
	// (before holdEnded, deferred first, lets a Shutdown return).
	defer func() {
		h.mu.Lock()
		h.ended()
		h.mu.Unlock()
	}()
	if keyReleased {
		// Shutdown's release of the key ends the tenure (shutdown.go); what
		// it found, bounded by its grace, is the hold's outcome.
		<-h.shutDown
		h.mu.Lock()
		loss.cause, lostErr = h.cause, h.lostErr
		h.mu.Unlock()
		local.hold.Store(nil)
		l.unlockLocal(local)
		return loss, lostErr
	}
	if next := r.nextLocalHold(h, token, local); next != nil {
		// The hand-off asks Redis nothing, so a read after it must confirm
		// the hold (tenure.go), with tracking or without: a change the
		// renewal found would reach only the tenure's later holds. Its
		// confirmations are made first, so that the next hold's release
		// finds them.
		c := h.tenure.confirmations()
		if local.unlock(handoff{hold: next}) {
			r.leave(l.key)
			// ctx bounds the wait for the confirmation, as it would the
			// release's own call; one that has ended already does not (the
			// wait is bounded by the lease then).
			if ctx.Err() != nil {
				ctx = context.WithoutCancel(ctx)
			}
			return h.confirmed(r.confirmHandoff(ctx, h, next, c))
		}
	}
	// A grant that lands from now until the release's reply finds no
	// current hold and is kept as if for a waiter (receiveGrant). One that
	// the release's own mark does not explain (below) was given before the
	// release ran: the key went through another owner behind the hold's
	// back and came back by that grant, which tracking cannot tell (it
	// reads back the registry's own client id).
	grantBefore := local.grantedToken.Load()
	local.hold.Store(nil)
	// A panic in the release's calls (a go-redis hook's, a RedisCalls
	// hook's) lets go of the key here all the same, and tells the releases
	// that wait for this one (tenure.go): else they, and every goroutine
	// after the key, would wait for good. The panic goes on.
	settled := false
	defer func() {
		if !settled {
			if c := h.tenure.confirm.Load(); c != nil {
				c.end(verdict{err: errReleasePanicked(l.key)}, true)
			}
			local.unlock(handoff{})
			r.leave(l.key)
		}
	}()
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		ctx, cancel = r.releaseContext(ctx)
		defer cancel()
	}
	// A grant that landed while the hold was current is being given back,
	// and judges the hold (giveBack): the release waits for that verdict,
	// which strikes the tenure, before it tells the key's fate. Only a
	// key with calls pending waits; it sends nothing. A ctx that ends
	// meanwhile does not stop the release, as one that had ended before it
	// does not (above), nor does a Shutdown: the give-back ends by Close.
	if l.settlePending(ctx) != nil {
		var cancel context.CancelFunc
		ctx, cancel = r.releaseContext(ctx)
		defer cancel()
		_ = l.settlePending(ctx)
	}
	struck := h.tenure.loss()
	// If a goroutine of this registry waits for the key and the release
	// passes it to another registry, the release marks this one as waiting
	// too, in the same call, for that goroutine: it then waits for its
	// grant without a failing attempt of its own, one round trip less per
	// hand-off between processes. Only a subscribed registry hears grants.
	markNext := r.grants.lease > 0 && r.notes.subscribed.Load() && local.waited()
	var sent time.Time // when the call that may mark was sent
	if markNext {
		sent = time.Now()
	}
	// A lease that ran out before the release, as the registry counts it,
	// may have let another owner in, even if the key is this registry's
	// again by the time the release runs.
	leaseRanOut := h.leaseOver()
	c := h.tenure.confirm.Load()
	if c != nil {
		c.releaseBegins()
	}
	found, err := l.releaseRedis(ctx, protocol.Release{HandedOut: h.handedOut(token), MarkNext: markNext})
	// An owner check that Redis refused as the key is of another type
	// (WRONGTYPE) found the key no registry's: the hold is lost, as a
	// renewal or tracking reads it, and nothing is left to release.
	overwritten := protocol.WrongType(err)
	if overwritten {
		err = nil
	}
	// A grant that answers the mark this release set has a token above
	// the mark's; any other grant that landed during the release came
	// before it ran, if its token is still the key's last (a note that
	// came late, of a grant an attempt of this registry took, is not).
	g := local.grantedToken.Load()
	grantedBehind := err == nil && g != 0 && g != grantBefore && (found.MarkToken == 0 || g <= found.MarkToken) && r.grantIsLastAfterRelease(ctx, l, g)
	var mark waitMark
	if found.MarkToken != 0 {
		mark = waitMark{sent: sent, token: found.MarkToken}
	}
	switch found.Outcome {
	case protocol.DeletedWaited:
		r.contention.yieldAfter(l.key)
		r.contention.saw(l.key)
	case protocol.Granted:
		r.contention.saw(l.key)
	}
	settled = true
	if !local.unlock(handoff{mark: mark}) && mark.isSet() {
		// The waiter was abandoned meanwhile. unlock kept the mutex, so that
		// the withdrawal is on record before the next owner can attempt.
		l.withdrawMark()
		local.unlock(handoff{})
	}
	r.leave(l.key)
	switch {
	case lostErr != nil:
	case struck != lossNone:
		loss.cause = struck
		lostErr = lossError(l.key, loss.cause)
	case leaseRanOut:
		// A struck tenure's lease reads as over too: its loss names itself.
		loss.cause = cmp.Or(h.tenure.loss(), r.lapseCause(h))
		lostErr = lossError(l.key, loss.cause)
	case (overwritten || err == nil && found.Outcome == protocol.NotOurs) && h.wasForced():
		// News of a forced unlock came before the check it asked for
		// (receiveForced): the registry knows the cause, which that check
		// would have named.
		loss.cause = LossForced
		lostErr = lossError(l.key, loss.cause)
	case overwritten:
		loss.cause = LossOverwritten
		lostErr = lossError(l.key, loss.cause)
	case err == nil && found.Outcome == protocol.NotOurs && h.leaseOver():
		// The lease ran out while the call was on its way (a paused
		// server, a slow network, a queue): the key most likely expired,
		// and "deleted" would send an operator looking for who deleted it.
		// Or a loss struck the hold meanwhile (tracking's read, sent before
		// the release began, found the key gone): that loss names itself.
		loss.cause = cmp.Or(h.tenure.loss(), r.lapseCause(h))
		lostErr = lossError(l.key, loss.cause)
	case err == nil && found.Outcome == protocol.NotOurs:
		loss.cause = LossDeleted
		lostErr = fmt.Errorf("%w: key %q: %s", ErrLockLost, printedKey(l.key), lossUnknown)
	case grantedBehind:
		loss.cause = LossOverwritten
		lostErr = lossError(l.key, loss.cause)
	}
	if !loss.signalled && loss.cause != lossNone {
		h.foundLost(loss.cause, lostErr)
	}
	switch {
	case lostErr != nil && err != nil:
		err = errors.Join(lostErr, err)
	case lostErr != nil:
		err = lostErr
	}
	if c != nil {
		c.end(handedOffVerdict(l.key, verdict{cause: loss.cause, err: err}), true)
	}
	return loss, err
}

// confirmed records v, the confirmation of h, which was handed off
// locally, and returns it as releaseKey does.
func (h *Hold) confirmed(v verdict) (releaseLoss, error) {
	if v.cause != lossNone {
		h.foundLost(v.cause, v.err)
	}
	return releaseLoss{cause: v.cause}, v.err
}

// wasForced reports whether news came that an operator forced h's key
// open (receiveForced).
func (h *Hold) wasForced() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.forced
}

// foundLost records that h's release found it lost for cause, with err,
// for Err.
func (h *Hold) foundLost(cause LossCause, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lostErr == nil {
		h.cause, h.lostErr = cause, err
	}
}

// releaseUnclaimed releases h, which an acquisition took and its caller
// never got (an AcquireDone hook panicked), on a context of its own: the
// acquisition's ended with the panic. The hooks, told that h was acquired,
// are told of its release (a panic of theirs there goes on in place of
// the one that ended the acquisition).
func (h *Hold) releaseUnclaimed() {
	ctx, cancel := h.lock.r.releaseContext(h.lock.r.life.stopCtx)
	defer cancel()
	_ = h.release(ctx)
}

// grantIsLastAfterRelease is grantIsLast for a release whose script ran:
// a ctx that ended since must not hide the grant's verdict, which the
// read alone gives, so the read runs as a release whose ctx ended does.
func (r *Registry) grantIsLastAfterRelease(ctx context.Context, l *Lock, token int64) bool {
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		ctx, cancel = r.releaseContext(ctx)
		defer cancel()
	}
	return r.grantIsLast(ctx, l, token)
}

// releaseContext is the context of a release that must not be cut short
// by ctx's end: ctx's values, bounded by the lease, after which the key
// has expired anyway.
func (r *Registry) releaseContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), r.cfg.expireAfter)
}

// releaseRedisAside is releaseRedis for the registry's background work: a
// RedisCalls hook's panic, with no caller to go on to, fails the release
// as a Redis error would (countCallsAside). The call was made: the key is
// released, or left to its lease.
func (l *Lock) releaseRedisAside(ctx context.Context, o protocol.Release) (got protocol.ReleaseReply, err error) {
	defer func() {
		if v := recover(); v != nil {
			got, err = protocol.ReleaseReply{}, l.r.hookPanicked(OpRelease, v)
		}
	}()
	return l.releaseRedis(ctx, o)
}

// releaseRedis runs release.lua, for a hold (o.HandedOut: the last token
// it handed out locally), or for an attempt that may have taken the key,
// or for a grant nobody here took (o.GiveBack). With o.MarkNext, a release
// that grants the key to another registry marks this one as waiting.
//
// release.lua gets the client id alone unless the registry expects the
// rest of its arguments to be needed: a local hand-off raised the token, a
// grant goes back, or the key looks contended. Four arguments fewer make an
// uncontended release about as cheap for Redis as the minimal owner-checked
// GET and DEL (BenchmarkServerTime). A release that finds a waiter without
// them changes nothing and is sent again with them, one more round trip
// the first time a key turns contended.
func (l *Lock) releaseRedis(ctx context.Context, o protocol.Release) (protocol.ReleaseReply, error) {
	r := l.r
	o.Full = r.contention.looksContended(l.key)
	for {
		var fence func() protocol.Call
		if o.HandedOut != 0 {
			// The tokens handed out must be stored before the key is freed.
			fence = func() protocol.Call { return r.peer.RaiseFence(l.keys(), o.HandedOut) }
		}
		cmd := l.runScript(ctx, r.peer.Release(l.keys(), l.key, o), fence)
		// Told once the call was made: a RedisCalls hook that panics then
		// leaves the key released, not taken for a lease.
		r.countCalls(OpRelease, 1)
		found, err := protocol.ReadRelease(cmd)
		if err != nil {
			return protocol.ReleaseReply{}, fmt.Errorf("%w: release %q: %w", ErrRedis, printedKey(l.key), l.cutKeys(err))
		}
		if found.NoteRefused != "" && r.notes.noteRefusalTold.CompareAndSwap(false, true) {
			// The key was deleted or granted all the same: the waiters,
			// not told, take it when they poll.
			r.cfg.logger.Warn("lockreg: PUBLISH refused; waiters are not told of releases, and take keys when they poll",
				"key", printedKey(l.key), "error", found.NoteRefused)
		}
		if found.Outcome != protocol.NeedsArguments {
			return found, nil
		}
		r.contention.saw(l.key)
		o.Full = true
	}
}
