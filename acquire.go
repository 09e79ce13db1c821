package lockreg

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// One acquisition, end to end. It takes the key's local mutex (locallock.go),
// which may come with a hold a release handed off, or with a mark a release
// left; else it takes the key in Redis: it attempts (attempt.go), waits for
// a grant, a wake-up or the retry interval, takes a grant that came, and
// attempts again, until it holds the key or gives up (abandons). Its Redis
// calls run one of two ways:
//
//   - attemptsHere, on the caller's goroutine, when ctx cannot end;
//   - attemptsAside, in a goroutine of its own, when it can, so that the
//     caller returns when ctx ends even while Redis hangs; the goroutine
//     then ends the acquisition when its call returns, releasing the key
//     if the call took it. The waits between attempts and taking a grant
//     need no call and stay on the caller's goroutine, which a grant wakes.
//
// Handing a call to another goroutine and back costs a wake-up each way,
// about 6% of an uncontended cycle on a 2-core VM
// (BenchmarkUncontendedWithContext), so when the client ends its calls at
// ctx's deadline itself (go-redis's ContextTimeoutEnabled) the first
// attempt runs on the caller's goroutine all the same (firstAttemptHere).

// acquireHold takes the local mutex, then the key in Redis unless the
// mutex came with a hold, and returns the new hold. It tells the hooks.
func (l *Lock) acquireHold(ctx context.Context, wait bool) (*Hold, error) {
	r := l.r
	if err := l.checkAcquisition(ctx); err != nil {
		return nil, err
	}
	start := time.Now()
	if hooks := r.hooks.all(); hooks != nil {
		return l.acquireHooked(ctx, wait, start, hooks)
	}
	return l.takeHold(ctx, wait, start)
}

// acquireHooked is acquireHold with hooks to tell. A panic (a hook's, a
// client's) after an AcquireStart hook ran still tells AcquireDone, with
// OutcomeError, to the hooks whose AcquireStart was called (or all, once
// every one was), so that what they began, a span, ends; the panic goes
// on.
func (l *Lock) acquireHooked(ctx context.Context, wait bool, start time.Time, hooks []Hooks) (h *Hold, err error) {
	begun, ended := 0, false
	defer func() {
		if !ended {
			e := AcquireEvent{Key: l.key, Wait: time.Since(start), Outcome: OutcomeError,
				Err: fmt.Errorf("%w: key %q: the acquisition panicked", ErrNotObtained, printedKey(l.key))}
			tellAcquireDone(ctx, hooks[:begun], e)
		}
	}()
	for i, hk := range hooks {
		if hk.AcquireStart != nil {
			ctx = cmp.Or(hk.AcquireStart(ctx, l.key), ctx) // nil keeps ctx
		}
		begun = i + 1
	}
	h, err = l.takeHold(ctx, wait, start)
	ended = true
	e := AcquireEvent{Key: l.key, Wait: time.Since(start), Outcome: OutcomeAcquired, Err: err}
	switch {
	case err == nil:
		e.Path = h.via.path()
	case errors.Is(err, ErrClosed):
		e.Outcome = OutcomeClosed
	case errors.Is(err, ErrNotObtained) && !refused(err): // errBusy too
		e.Outcome = OutcomeNotObtained
	default:
		e.Outcome = OutcomeError
	}
	told := false // a hook that panics leaves nothing held; the panic goes on
	defer func() {
		if !told && err == nil {
			h.releaseUnclaimed()
		}
	}()
	tellAcquireDone(ctx, hooks, e)
	told = true
	return h, err
}

// takeHold is acquireHold's work, begun at start.
func (l *Lock) takeHold(ctx context.Context, wait bool, start time.Time) (*Hold, error) {
	r := l.r
	if err := r.serversLooked(ctx); err != nil {
		return nil, err
	}
	r.publishSoon() // waiters are named to inspectors too
	local := r.locals.join(l.key)
	got, err := local.lock(ctx, r.life.closing, wait)
	if err != nil {
		r.leave(l.key)
		return nil, l.notAcquired(ctx, err, nil)
	}
	h, handedOff := got.hold, got.hold != nil
	var handedOut int64
	if handedOff {
		local.hold.Store(h)
		if h.tenure.loss() != lossNone {
			// A loss struck the tenure while the key was handed off, and may
			// have looked for its current hold before h became it (see
			// changedBehindItsBack): the key is not the registry's, so this
			// acquisition takes it in Redis instead, after storing h's token.
			local.hold.Store(nil)
			handedOut, h, handedOff = h.token, nil, false
		}
	}
	if !handedOff {
		a := &acquisition{l: l, ctx: ctx, wait: wait, local: local, mark: got.mark, handedOut: handedOut}
		h, err = a.takeKey()
		local.acquired(&a.wake)
		if err != nil {
			return nil, err
		}
		h.local = local
		local.hold.Store(h)
		r.arm(h, LossDeleted, local.waited())
	}
	waited := time.Since(start)
	r.stats.held.Add(1)
	// Close signals the holds it finds, after closing: one stored later would
	// never be, nor renewed. Such an acquisition fails as the waiting ones do
	// and gives the key back unclaimed (the hooks never hear of its loss,
	// nor Stats of the hold).
	if r.closing() {
		_, _ = h.releaseKey(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("%w: cannot lock %q", ErrClosed, printedKey(l.key))
	}
	r.stats.acquired(waited, h.via)
	h.claim()
	r.subscribeSoon()
	return h, nil
}

// acquireState is what an acquisition does next.
type acquireState uint8

const (
	// attemptDue: an attempt in Redis, at first and after every wait.
	attemptDue acquireState = iota
	// waiting: a wait for a grant, a wake-up or the retry interval, after
	// an attempt failed or while a mark a release left awaits its grant.
	waiting
)

// acquisition is the state of one acquisition that takes its key in Redis,
// changed by one goroutine at a time (the caller's, or attemptsAside's
// while it runs a call).
type acquisition struct {
	l     *Lock
	ctx   context.Context
	wait  bool // false: one attempt only (TryLock)
	local *localLock
	state acquireState
	// mark is this registry's mark as waiting for the key, as the last
	// failed attempt (or the release that marked it) saw it; a grant is
	// trusted against it (takeGrant). Unset while the registry is unmarked.
	mark waitMark
	// mayHoldKey says that the last call failed in a way that can come
	// after Redis ran it (a timeout, a broken connection): ending the
	// acquisition then releases the key, owner-checked.
	mayHoldKey bool
	// handedOut is the token of a local hand-off this acquisition
	// discarded, or 0: its release handed out the one below it, which no
	// script stored, and a draw from a stored token ahead of the clock
	// would hand that out again. Attempts store it first (attempt).
	handedOut int64
	lastErr   atomic.Pointer[error] // what the last attempt found, for the caller's error (failedWith)
	retry     *time.Timer
	wake      wakeup // local's wake (locallock.go), from begin on
}

// takeKey takes the key in Redis, waiting unless a.wait is false; with a
// mark that a release left, it first waits for the grant the mark asks
// for. Called with the local mutex owned; on failure it unlocks that.
func (a *acquisition) takeKey() (*Hold, error) {
	if a.mark.isSet() {
		a.state = waiting
	}
	if err := a.begin(); err != nil {
		return nil, err
	}
	// A panic (an AcquireAttempt or RedisCalls hook's) would leave the
	// local mutex locked for good, every later acquisition of the key
	// waiting for it, and the key in Redis if the attempt took it: the
	// acquisition is abandoned as a failed one is, and the panic goes on.
	ended := false
	defer func() {
		if !ended {
			a.local.acquired(&a.wake)
			a.mayHoldKey = true
			_ = a.abandon(ErrNotObtained)
		}
	}()
	h, err := a.attempts()
	ended = true
	return h, err
}

// attempts is takeKey's work, once begun.
func (a *acquisition) attempts() (*Hold, error) {
	if a.ctx.Done() == nil {
		return a.run(a.attemptsHere)
	}
	if h, err := a.firstAttemptHere(); h != nil || err != nil {
		return h, err
	}
	return a.run(a.attemptsAside)
}

// begin readies the first step, or reports why the acquisition ended
// before it.
func (a *acquisition) begin() error {
	l := a.l
	if a.state == attemptDue {
		// A ctx ended already fails the call unsent, unable to tell that it
		// did not run: a release and withdrawals would follow, for nothing.
		err := a.ctx.Err()
		if err == nil {
			err = l.awaitPending(a.ctx)
		}
		if err == nil {
			err = l.r.contention.yield(a.ctx, l.r.life.closing, l.key, a.wait)
		}
		if err != nil {
			a.letGo(false)
			return l.notAcquired(a.ctx, err, nil)
		}
	}
	// A notification from before this point says nothing new (the wake-up
	// is new). A grant from before it, if the key is still ours, the first
	// attempt finds; with a mark, a grant that answers it may have come
	// already, and its token is checked first.
	a.local.acquiring(&a.wake)
	if a.state == attemptDue {
		a.local.grantedToken.Store(0)
	}
	return nil
}

// run makes the attempts until one takes the key, or a grant gives it,
// or the acquisition ends; attempts makes the attempt that is due.
func (a *acquisition) run(attempts func() (*Hold, error)) (*Hold, error) {
	for {
		if h := a.takeGrant(); h != nil {
			return h, nil
		}
		if a.state == attemptDue {
			if h, err := attempts(); h != nil || err != nil {
				return h, err
			}
		}
		if err := a.pause(); err != nil {
			return nil, err
		}
	}
}

// attemptsHere makes the attempt that is due. If it fails while the
// registry has no subscription yet, it subscribes and, once subscribed,
// tries again at once: a release between the failed attempt and the
// subscription must not be missed; unless ctx ended meanwhile, as
// attemptsAside's caller then left and told AcquireDone. It returns the
// hold, or the error that ended the acquisition, or neither when it is
// time to wait.
func (a *acquisition) attemptsHere() (*Hold, error) {
	for {
		if h, err := a.attempt(); h != nil || err != nil {
			return h, err
		}
		r := a.l.r
		if !r.cfg.pubSub || r.notes.subscribed.Load() || r.subscribe(a.ctx) != nil || a.ctx.Err() != nil {
			return nil, nil
		}
		if h := a.takeGrant(); h != nil {
			return h, nil
		}
		a.state = attemptDue
	}
}

// takeGrant returns the hold a grant that came gives, if the trust rule
// holds (grant.go); else, if a grant came, the key is this registry's but
// since when is unknown, and an attempt is due to find out.
func (a *acquisition) takeGrant() *Hold {
	token := a.local.grantedToken.Swap(0)
	if token == 0 {
		return nil
	}
	if h := a.l.acceptGrant(a.local, token, a.mark); h != nil {
		return h
	}
	a.state, a.mayHoldKey = attemptDue, true // the grant left the key here
	return nil
}

// acceptGrant returns the hold a grant of token gives, or nil if the trust
// rule fails for mark or the registry is closing.
func (l *Lock) acceptGrant(local *localLock, token int64, mark waitMark) *Hold {
	r := l.r
	if mark.token <= 0 || token <= mark.token {
		return nil
	}
	h := newHold(l, token, mark.sent, r.grants.lease)
	h.via = viaGrant
	if h.leaseOver() {
		return nil
	}
	// The hold itself begins now, for WithMaxHold and the run of local
	// hand-offs.
	h.taken = nowInstant()
	h.redisTaken = h.taken
	if !r.extendLater(local, h) {
		return nil // closing: the grant expires unextended
	}
	r.grants.leaseEnds(instant(h.tenure.leaseEnd.Load()))
	return h
}

// pause waits for the next attempt: a retry interval, or less if a
// release wakes it. It returns nil when the attempt is due, else the
// error that ended the acquisition.
func (a *acquisition) pause() error {
	r := a.l.r
	if a.retry == nil {
		a.retry = time.NewTimer(r.cfg.retryInterval)
	} else {
		a.retry.Reset(r.cfg.retryInterval)
	}
	var stop error
	select {
	case <-a.retry.C:
		a.state = attemptDue
		return nil
	case <-a.local.wakeChannel(&a.wake):
		a.state = attemptDue
		return nil
	case <-a.ctx.Done():
		stop = a.ctx.Err()
	case <-r.life.closing:
		stop = ErrClosed
	}
	a.retry.Stop()
	return a.abandon(stop)
}

// abandon ends the acquisition without the key, for the reason stop: it
// withdraws its mark and lets go of the local mutex (letGo).
func (a *acquisition) abandon(stop error) error {
	l := a.l
	// A grant that came meanwhile left the key to this registry.
	granted := a.local.grantedToken.Swap(0) != 0
	if a.mark.isSet() {
		l.withdrawMark()
	}
	a.letGo(granted)
	return l.notAcquired(a.ctx, stop, a.lastError())
}

// letGo unlocks the local mutex of an acquisition that ends without the
// key, first releasing the key (in the background) if the last call or a
// grant may have taken it, or if a local hand-off it discarded left a
// token that no script stored: that token was handed out, and a later
// draw from a stored token ahead of the clock would hand it out again.
func (a *acquisition) letGo(granted bool) {
	l, handedOut := a.l, a.handedOut
	if !(a.mayHoldKey || granted || handedOut != 0) ||
		!l.r.goBackground(func(ctx context.Context) { l.releaseThenUnlockLocal(ctx, a.local, handedOut) }) {
		l.unlockLocal(a.local)
	}
}

// notAcquired turns the reason an acquisition stopped into its error: a
// Redis error that retrying would not mend ends it with that error, as
// does any failed attempt of a TryLock, which does not retry.
func (l *Lock) notAcquired(ctx context.Context, reason, lastErr error) error {
	switch {
	case reason == errBusy:
		return errBusy
	case errors.Is(reason, ErrRedis) || errors.Is(reason, ErrNotReplicated):
		return errors.Join(fmt.Errorf("%w: key %q", ErrNotObtained, printedKey(l.key)), reason)
	case errors.Is(reason, ErrClosed):
		return fmt.Errorf("%w: cannot lock %q", ErrClosed, printedKey(l.key))
	default:
		return errors.Join(fmt.Errorf("%w: key %q: %w", ErrNotObtained, printedKey(l.key), ctx.Err()), lastErr)
	}
}
