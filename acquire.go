package lockreg

import (
	"context"
	"errors"
	"os"
	"sync/atomic"
	"time"
)

// An acquisition takes a key in Redis for the goroutine or Hold that owns
// the key's local mutex: it attempts (obtain.go), waits for a grant, a
// wake-up or the retry interval, and attempts again, until it holds the
// key or ends. Its Redis calls run one of two ways:
//
//   - attemptsHere, on the caller's goroutine, when ctx cannot end;
//   - attemptsAside, in a goroutine of its own, when it can, so that the
//     caller returns when ctx ends even while Redis hangs; the goroutine
//     then ends the acquisition when its call returns, releasing the key
//     if the call took it. The waits between attempts, and taking a grant,
//     which need no call, stay on the caller's goroutine: a grant wakes
//     the caller itself.
//
// Handing a call to another goroutine and back costs a wake-up each way,
// about 6% of an uncontended cycle on a 2-core VM
// (BenchmarkUncontendedWithContext), so when the client ends its calls at
// ctx's deadline itself (go-redis's ContextTimeoutEnabled) the first
// attempt runs on the caller's goroutine all the same (firstAttemptHere).

// acquireState is what an acquisition does next.
type acquireState uint8

const (
	// attemptDue: an attempt in Redis, at first and after every wait.
	attemptDue acquireState = iota
	// waiting: a wait for a grant, a wake-up or the retry interval, after
	// an attempt failed or while a mark a release left awaits its grant.
	waiting
)

// acquisition is one acquisition's state, changed by one goroutine at a
// time (the caller's, or attemptsAside's while it runs a call).
type acquisition struct {
	l     *Lock
	ctx   context.Context
	wait  bool // false: one attempt only (TryLock)
	local *localLock
	state acquireState
	// mark is this registry's mark as waiting for the key, as the last
	// failed attempt (or the release that marked it) saw it; a grant is
	// trusted against it (grant.go). Unset while the registry is unmarked.
	mark waitMark
	// mayHoldKey says that the last call failed in a way that can come
	// after Redis ran it (a timeout, a broken connection): ending the
	// acquisition then releases the key, owner-checked.
	mayHoldKey bool
	lastErr    atomic.Pointer[error] // the last Redis error, for the caller's error
	retry      *time.Timer
}

// obtainRedis takes the key in Redis, waiting unless wait is false; with
// a mark that a release left, it first waits for the grant the mark asks
// for. Called with the local mutex owned; on failure it unlocks that.
func (l *Lock) obtainRedis(ctx context.Context, wait bool, local *localLock, mark waitMark) (*Hold, error) {
	a := &acquisition{l: l, ctx: ctx, wait: wait, local: local, mark: mark}
	if mark.isSet() {
		a.state = waiting
	}
	if err := a.begin(); err != nil {
		return nil, err
	}
	if ctx.Done() == nil {
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
		err := l.awaitPending(a.ctx)
		if err == nil {
			err = l.r.contention.yield(a.ctx, l.r.life.closed, l.key)
		}
		if err != nil {
			l.unlockLocal(a.local)
			return l.notAcquired(a.ctx, err, nil)
		}
	}
	// A notification from before this point says nothing new. A grant
	// from before it, if the key is still ours, the first attempt finds;
	// with a mark, a grant that answers it may have come already, and its
	// token is checked first.
	select {
	case <-a.local.wake:
	default:
	}
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
// subscription must not be missed. It returns the hold, or the error that
// ended the acquisition, or neither when it is time to wait.
func (a *acquisition) attemptsHere() (*Hold, error) {
	for {
		if h, err := a.attempt(); h != nil || err != nil {
			return h, err
		}
		r := a.l.r
		if !r.cfg.pubSub || r.notes.subscribed.Load() || r.subscribe(a.ctx) != nil {
			return nil, nil
		}
		if h := a.takeGrant(); h != nil {
			return h, nil
		}
		a.state = attemptDue
	}
}

// attemptsAside is attemptsHere in a goroutine of its own, from which the
// caller returns when ctx ends.
func (a *acquisition) attemptsAside() (*Hold, error) {
	type result struct {
		h   *Hold
		err error
	}
	answer, left := make(chan result), make(chan struct{})
	l := a.l
	started := l.r.goBackground(func(stop context.Context) {
		h, err := a.attemptsHere()
		select {
		case answer <- result{h, err}:
		case <-left:
			switch {
			case h != nil:
				l.releaseThenUnlockLocal(stop, a.local)
			case err == nil:
				_ = a.abandon(a.ctx.Err())
			}
		}
	})
	if !started {
		return nil, a.abandon(ErrClosed)
	}
	select {
	case got := <-answer:
		return got.h, got.err
	case <-a.ctx.Done():
		close(left)
		return nil, l.notAcquired(a.ctx, a.ctx.Err(), a.lastError())
	}
}

// attempt makes the attempt that is due. It returns the hold, or the
// error that ended the acquisition (TryLock's attempt failed), or neither
// when the acquisition goes on.
func (a *acquisition) attempt() (*Hold, error) {
	sent := time.Now()
	h, found, err := a.l.tryObtain(a.ctx, a.wait, a.mark.isSet())
	if h != nil {
		return h, nil
	}
	a.state, a.mayHoldKey = waiting, mayHaveRun(err)
	switch {
	case err != nil:
		a.failedWith(err)
	case a.wait: // another owner held it: obtain.lua marked this registry
		a.mark = waitMark{sent: sent, token: found.lastToken}
		a.l.r.publishSoon() // a long wait outlives the owner name's time to live
	}
	if !a.wait {
		return nil, a.abandon(errBusy)
	}
	return nil, nil
}

// firstAttemptHere makes the first attempt on the calling goroutine, if
// that cannot keep the caller past ctx's deadline: the client ends its
// calls at the deadline itself, the attempt is a plain SET (a key not
// seen contended, no WithWaitReplicas) and it can go out at once rather
// than queue behind other calls. A cancellation of ctx before its
// deadline then takes effect when the SET returns: one round trip, or
// while Redis hangs, the deadline. It returns the hold, or the error that
// ended the acquisition, or neither when the acquisition goes on aside:
// the key was taken, the SET failed, or it did not run.
func (a *acquisition) firstAttemptHere() (*Hold, error) {
	l := a.l
	if _, ok := a.ctx.Deadline(); !ok || !l.r.callsEndAtDeadline || a.state != attemptDue || !l.plainSetFirst(a.mark.isSet()) {
		return nil, nil
	}
	sent := time.Now()
	found, wentOut, err := l.setIfFree(a.ctx, false)
	if wentOut {
		l.r.attempting(a.ctx, l.key)
	}
	switch {
	case !wentOut:
		return nil, nil
	case found.held:
		return l.took(sent), nil
	case err == nil:
		// Another owner holds the key: obtain.lua follows aside, marking
		// this registry as waiting.
		l.r.contention.saw(l.key)
		return nil, nil
	}
	l.r.stats.failed.Add(1)
	a.mayHoldKey = mayHaveRun(err)
	a.failedWith(err)
	if a.ctx.Err() != nil {
		return nil, a.abandon(a.ctx.Err())
	}
	a.state = waiting // the next attempt comes after a pause, as after any failed one
	return nil, nil
}

// failedWith records a Redis error of an attempt, logging it unless it
// repeats the last one or ctx ended (it then says nothing new). An attempt
// that ctx cut short keeps the error before it: the caller's error already
// says that ctx ended, and what Redis last said (connection refused, an ACL
// refusal) is what tells them why the lock was not obtained.
func (a *acquisition) failedWith(err error) {
	prev := a.lastError()
	if a.ctx.Err() != nil {
		if prev == nil || !cutShort(err) {
			a.lastErr.Store(&err)
		}
		return
	}
	if prev == nil || prev.Error() != err.Error() {
		a.l.r.cfg.logger.Warn("lockreg: Redis error while acquiring; retrying", "key", a.l.key, "error", err)
	}
	a.lastErr.Store(&err)
}

// cutShort says that err is a call's end at ctx's end: ctx's own error
// (a dial, a wait for a connection) or, with go-redis's
// ContextTimeoutEnabled, a read or write past ctx's deadline.
func cutShort(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded)
}

func (a *acquisition) lastError() error {
	if err := a.lastErr.Load(); err != nil {
		return *err
	}
	return nil
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
	case <-a.local.wake:
		a.state = attemptDue
		return nil
	case <-a.ctx.Done():
		stop = a.ctx.Err()
	case <-r.life.closed:
		stop = ErrClosed
	}
	a.retry.Stop()
	return a.abandon(stop)
}

// abandon ends the acquisition without the key, for the reason stop: it
// withdraws its mark and unlocks the local mutex, first releasing the key
// (in the background) if the last call or a grant may have taken it.
func (a *acquisition) abandon(stop error) error {
	l := a.l
	// A grant that came meanwhile left the key to this registry.
	granted := a.local.grantedToken.Swap(0) != 0
	if a.mark.isSet() {
		l.withdrawMark()
	}
	if !(a.mayHoldKey || granted) || !l.r.goBackground(func(ctx context.Context) { l.releaseThenUnlockLocal(ctx, a.local) }) {
		l.unlockLocal(a.local)
	}
	return l.notAcquired(a.ctx, stop, a.lastError())
}

// releaseThenUnlockLocal unlocks the local mutex of an acquisition that
// may have taken the key in Redis after all, once it released the key
// there (owner-checked): unlocking first would let the next local owner
// take the key (it carries the same client id) and then lose it to this
// release.
func (l *Lock) releaseThenUnlockLocal(ctx context.Context, local *localLock) {
	ctx, cancel := context.WithTimeout(ctx, l.r.cfg.expireAfter)
	defer cancel()
	if _, err := l.releaseRedis(ctx, 0, false, ""); err != nil {
		l.r.cfg.logger.Debug("lockreg: could not release the key of an abandoned attempt; it expires after the lease", "key", l.key, "error", err)
	}
	l.unlockLocal(local)
}

// unlockLocal unlocks the local mutex, with nothing to hand off, and ends
// the caller's part in the key's local state.
func (l *Lock) unlockLocal(local *localLock) {
	local.unlock(handoff{})
	l.r.locals.leave(l.key)
}
