package lockreg

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/lockreg/lockreg/internal/protocol"
)

// lifecycle is a registry's life: open; then refusing acquisitions, from
// Shutdown or Close on; then stopped, its background work ended, by Close.
type lifecycle struct {
	// closing is closed once the registry refuses acquisitions: Shutdown
	// or Close began. idle is closed, and replaced, to tell the Shutdowns
	// that wait for the registry to be quiet to look again (tellShutdown):
	// a broadcast, as any number of them may wait.
	closing chan struct{}
	idle    chan struct{}
	// stopCtx bounds background work; Close cancels it (stop). Background
	// work goes on while Shutdown waits, as releases and renewals need it.
	stopCtx context.Context
	stop    context.CancelFunc

	mu          sync.Mutex // guards closing's close, idle, stopped, shutdown, closedFirst and background.Add
	stopped     bool       // Close stopped the background work
	shutdown    bool       // a Shutdown began
	closedFirst bool       // Close came before any Shutdown
	background  sync.WaitGroup
}

func (l *lifecycle) init() {
	l.closing = make(chan struct{})
	l.idle = make(chan struct{})
	l.stopCtx, l.stop = context.WithCancel(context.Background())
}

// Close stops the registry at once. Acquisitions that are waiting or
// under way, and any later ones, fail with ErrClosed (one that took its
// key meanwhile gives it back), and renewal stops. Keys still held stay
// held in Redis until their leases run out, or until their owners release
// them, which they still may; as nothing renews them any more, their Lost
// channels close, and their releases report ErrLockLost. Close waits for
// the registry's background work to end, and is idempotent: a call of it
// to a Redis that does not answer ends at the client's timeouts (go-redis's
// ReadTimeout, 3 s by default), as go-redis ends no call at its context's
// cancellation unless ContextTimeoutEnabled is set.
//
// Shutdown is the graceful way: it waits for the holds to be released
// first, and releases what is left itself.
func (r *Registry) Close() error {
	r.refuse()
	r.life.mu.Lock()
	if !r.life.stopped {
		r.life.stopped, r.life.closedFirst = true, !r.life.shutdown
		r.life.stop()
	}
	r.life.mu.Unlock()
	r.unsubscribe()
	r.stopTracking()
	r.life.background.Wait()
	r.forEachHold(func(h *Hold) {
		_ = h.lossNow() // a lease that ran out before lost the hold then
		h.lose(LossClosed)
	})
	return nil
}

// Shutdown closes the registry gracefully, as http.Server.Shutdown closes
// a server. New acquisitions fail with ErrClosed at once, and waiting ones
// end with ErrClosed; a goroutine that holds a lock may still lock it
// again (reentrantly). Then it waits until every hold is released (Holds,
// the holds of Lock and LockContext, Do's), and each release is done in
// Redis, renewing them meanwhile, as are the releases of keys that the
// ended acquisitions may have taken, or until ctx ends. Then it releases
// in Redis the keys still held (owner-checked), which signals their holds
// lost (their owners' releases report ErrLockLost and only unlock them
// locally; Lost fires before each release, and Done, Err and the hooks'
// LossEvent then name what it found: closed, or the key's loss before),
// and closes the registry. Those releases get a second past
// ctx's end, as far as the client honours it (as Release); a key whose
// release Redis did not answer by then expires after its lease, and Close
// may wait longer on a Redis that does not answer (see Close). It returns
// nil, or, if ctx ended first (it had to release a key, or Close cut a
// release of the background short: a grant's give-back, the release of a
// key that an ended acquisition took), an error matching ErrClosed and
// ctx's error. Any number of Shutdowns may wait at once; one called under
// a hold of the registry (in Do's fn, say) waits for that hold too, so
// until ctx ends, as http.Server.Shutdown called from a handler would.
// Close after Shutdown does nothing; Shutdown after Close returns
// ErrClosed at once, and leaves the keys as Close did.
func (r *Registry) Shutdown(ctx context.Context) error {
	if ctx == nil {
		return errNilContext
	}
	r.life.mu.Lock()
	r.life.shutdown = true
	closedFirst := r.life.closedFirst
	r.life.mu.Unlock()
	if closedFirst {
		// Close left the keys still held to their owners and leases, and
		// nothing renews their holds: there is nothing to wait for, and
		// nothing Shutdown may release behind Close's word.
		return fmt.Errorf("%w: Shutdown after Close", ErrClosed)
	}
	r.refuse()
	err := r.awaitReleases(ctx)
	if err != nil && !r.releaseHeld(ctx) && r.quiet() {
		err = nil // what was left ended as ctx did
	}
	_ = r.Close()
	if err != nil {
		return fmt.Errorf("%w: Shutdown's context ended before every release was done: %w", ErrClosed, err)
	}
	return nil
}

// Done returns a channel that is closed once the registry is closed: when
// Close stops its background work, which Shutdown does at its end. Code
// that watches a registry (instrumentation, a health check) lets go of it
// then.
func (r *Registry) Done() <-chan struct{} { return r.life.stopCtx.Done() }

// refuse makes the registry refuse acquisitions, and ends the waiting ones.
func (r *Registry) refuse() {
	r.life.mu.Lock()
	if !isClosed(r.life.closing) {
		close(r.life.closing)
	}
	r.life.mu.Unlock()
	// A goroutine waiting for a key's local mutex joined the key first, so
	// its localLock is in the map for the whole walk.
	r.locals.m.Range(func(_ string, l *localLock) bool {
		l.refuseWaiters()
		return true
	})
}

// awaitReleases waits until the registry is quiet, or ctx ends (its
// error).
func (r *Registry) awaitReleases(ctx context.Context) error {
	for {
		// The word to look again is taken before the look: a change after
		// the look closes it.
		r.life.mu.Lock()
		again := r.life.idle
		r.life.mu.Unlock()
		if r.quiet() {
			return nil
		}
		select {
		case <-again:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// quiet reports whether nothing is left that Close would cut short: no
// hold; no key with local state, as an acquisition that Shutdown refused
// may be releasing, in the background, a key its last call took; and no
// give-back of a grant under way. Close cancels such releases, and their
// keys then wait for their leases.
func (r *Registry) quiet() bool {
	return r.stats.held.Load() == 0 && r.locals.size() == 0 && r.grants.pending.Size() == 0
}

// holdEnded counts a hold's release.
func (r *Registry) holdEnded() {
	r.stats.held.Add(-1)
	r.tellShutdown()
}

// tellShutdown has a Shutdown that waits look again whether the registry
// is quiet: a hold ended, a key's local state or a give-back did.
func (r *Registry) tellShutdown() {
	if !r.closing() {
		return
	}
	r.life.mu.Lock()
	close(r.life.idle)
	r.life.idle = make(chan struct{})
	r.life.mu.Unlock()
}

// releaseHeld releases the keys of the holds still held, all at once (the
// calls share round trips), and reports whether there were any. Shutdown's
// ctx has ended by then: the releases get shutdownGrace more, a round trip
// many times over, not a lease, as a process being stopped has a deadline
// of its own; a key whose release does not come back by then (Redis is not
// answering) expires after its lease.
func (r *Registry) releaseHeld(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(shutdownGrace, r.cfg.expireAfter))
	defer cancel()
	var releases sync.WaitGroup
	found := false
	r.forEachHold(func(h *Hold) {
		// A lease that ran out before, unsignalled yet, lost the hold then,
		// though the release may find the key the registry's again.
		_ = h.lossNow()
		h.mu.Lock()
		if h.released || h.keyReleased {
			h.mu.Unlock()
			return // its owner's release is under way
		}
		// Lost with the key taken from it, in one step: its owner's
		// release must not find the one without the other.
		h.keyReleased = true
		h.shutDown = make(chan struct{})
		tell := h.loseAtShutdown()
		handedOut := h.handedOut(h.token)
		h.mu.Unlock()
		tell()
		found = true
		// Releases of the tenure's holds handed off before it learn from
		// this release, not from a read that may see its DEL (tenure.go).
		c := h.tenure.confirm.Load()
		if c != nil {
			c.releaseBegins()
		}
		releases.Go(func() {
			got, err := h.lock.releaseRedisAside(ctx, protocol.Release{HandedOut: handedOut})
			var v verdict
			switch {
			case (protocol.WrongType(err) || err == nil && got.Outcome == protocol.NotOurs) && h.wasForced():
				// News of a forced unlock came before the check it asked
				// for, which would have named it (as releaseKey does).
				v = verdict{cause: LossForced, err: lossError(h.Key(), LossForced)}
			case protocol.WrongType(err):
				v = verdict{cause: LossOverwritten, err: lossError(h.Key(), LossOverwritten)}
			case err != nil:
				r.cfg.logger.Warn("lockreg: Shutdown could not release a key; it expires after its lease", "key", printedKey(h.Key()), "error", err)
				v.err = err
			case got.Outcome == protocol.NotOurs:
				v = verdict{cause: LossDeleted, err: lossError(h.Key(), LossDeleted)}
			}
			h.foundAtShutdown(v)
			if c != nil {
				c.end(v, true)
			}
		})
	})
	releases.Wait()
	return found
}

// loseAtShutdown signals h lost before Shutdown's release of its key, as
// closed, so that no news of that release's own DEL can name another
// cause; h.mu is held, and the caller runs tell once it let go of it.
// Lost closes and onLoss (Do's fn) hears at once, so that the work stops
// before the DEL. Done and the hooks wait for what the release found
// (foundAtShutdown), so that they tell the loss's one cause, as Err and
// Release do: a key taken from h before must not pass for the closing.
func (h *Hold) loseAtShutdown() (tell func()) {
	if !h.signalLocked(LossClosed) {
		return func() {}
	}
	h.untold = true
	onLoss, err := h.onLoss, h.lostErr
	return func() {
		if onLoss != nil {
			onLoss(err)
		}
	}
}

// foundAtShutdown records what Shutdown's release of h's key found, v,
// ends h, tells the hooks the loss's cause (once h is claimed, if it is
// not yet) and then lets h's own release, which waits for it, report it.
func (h *Hold) foundAtShutdown(v verdict) {
	h.mu.Lock()
	if v.cause != lossNone && h.cause == LossClosed {
		h.cause, h.lostErr = v.cause, v.err
	}
	h.ended()
	tell := func() {}
	if h.untold && !h.unclaimed {
		h.untold = false
		tell = h.tellLoss(h.cause, nil, h.lostErr)
	}
	h.mu.Unlock()
	tell()
	close(h.shutDown)
}

// shutdownGrace bounds the releases Shutdown makes itself, once its ctx
// ended.
const shutdownGrace = time.Second

// goBackground runs fn in a goroutine that Close waits for, with a context
// that Close cancels. It reports false, and runs nothing, once closed.
func (r *Registry) goBackground(fn func(ctx context.Context)) bool {
	r.life.mu.Lock()
	defer r.life.mu.Unlock()
	if r.life.stopped {
		return false
	}
	r.life.background.Add(1)
	go func() {
		defer r.life.background.Done()
		fn(r.life.stopCtx)
	}()
	return true
}

// closing reports whether the registry refuses acquisitions.
func (r *Registry) closing() bool { return isClosed(r.life.closing) }

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
