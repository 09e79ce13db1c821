package lockreg

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockreg/lockreg/internal/protocol"
)

// One attempt to take a key in Redis. An unmarked attempt on a key this
// registry has not seen contended is a plain SET NX PX, the least Redis
// can do to take a key; only if that finds the key taken does obtain.lua
// follow, which marks this registry as waiting, or finds the key its own
// already. With WithWaitReplicas, obtain.lua goes with a WAIT, and a hold
// too few replicas acknowledged is released again and reported as
// ErrNotReplicated.

// attemptsAside is attemptsHere in a goroutine of its own, from which the
// caller returns when ctx ends.
func (a *acquisition) attemptsAside() (*Hold, error) {
	type result struct {
		h        *Hold
		err      error
		panicked any
	}
	answer, left := make(chan result), make(chan struct{})
	l := a.l
	started := l.r.goBackground(func(stop context.Context) {
		h, panicked, err := a.attemptsCaught()
		select {
		case answer <- result{h, err, panicked}:
		case <-left:
			switch {
			case panicked != nil:
				// Nobody is left to panic to: the acquisition ended with
				// ctx. A panic here would crash the process.
				l.r.cfg.logger.Error("lockreg: a hook panicked in an attempt whose caller had left", "key", printedKey(l.key), "panic", panicked)
				a.mayHoldKey = true
				_ = a.abandon(a.ctx.Err())
			case h != nil:
				l.releaseThenUnlockLocal(stop, a.local, 0) // the attempt stored any token first
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
		if got.panicked != nil {
			panic(got.panicked) // on the caller's goroutine, which takeKey cleans up for
		}
		return got.h, got.err
	case <-a.ctx.Done():
		close(left)
		return nil, l.notAcquired(a.ctx, a.ctx.Err(), a.lastError())
	}
}

// releaseThenUnlockLocal unlocks the local mutex of an acquisition that
// may have taken the key in Redis after all, once it released the key
// there (owner-checked), storing handedOut, if set, first (see
// acquisition.handedOut): unlocking first would let the next local owner
// take the key (it carries the same client id) and then lose it to this
// release.
func (l *Lock) releaseThenUnlockLocal(ctx context.Context, local *localLock, handedOut int64) {
	ctx, cancel := context.WithTimeout(ctx, l.r.cfg.expireAfter)
	defer cancel()
	if _, err := l.releaseRedisAside(ctx, protocol.Release{HandedOut: handedOut}); err != nil {
		l.r.cfg.logger.Debug("lockreg: could not release the key of an abandoned attempt; it expires after the lease", "key", printedKey(l.key), "error", err)
	}
	l.unlockLocal(local)
}

// attemptsCaught is attemptsHere for attemptsAside's goroutine, where a
// panic (a hook's) would crash the process: it is returned instead.
func (a *acquisition) attemptsCaught() (h *Hold, panicked any, err error) {
	defer func() {
		if v := recover(); v != nil {
			panicked = v
		}
	}()
	h, err = a.attemptsHere()
	return h, nil, err
}

// attempt makes the attempt that is due. It returns the hold, or the
// error that ended the acquisition (TryLock's attempt failed), or neither
// when the acquisition goes on.
func (a *acquisition) attempt() (*Hold, error) {
	var h *Hold
	var found protocol.ObtainReply
	sent := time.Now()
	err := a.storeHandedOut()
	if err == nil {
		h, found, err = a.l.attemptRedis(a.ctx, a.wait, a.mark.isSet())
	}
	if h != nil {
		return h, nil
	}
	a.state = waiting
	a.settleDoubt(err)
	switch {
	case protocol.Permanent(err):
		return nil, a.abandon(err)
	case err != nil:
		a.failedWith(err)
		if a.wait && mayHaveRun(err) && !a.mark.isSet() {
			// obtain.lua may have marked this registry: a mark with no
			// token trusts no grant, but is withdrawn if the acquisition
			// gives up, and removed by the attempt that takes the key.
			a.mark = waitMark{sent: sent}
		}
	default:
		// Redis answered: another owner holds the key, which is why it was
		// not taken, not an earlier Redis error (see failedWith).
		a.lastErr.Store(&redisAnswered)
		if a.wait { // obtain.lua marked this registry
			a.mark = waitMark{sent: sent, token: found.LastToken}
			a.l.r.publishSoon() // a long wait outlives the owner name's time to live
		}
	}
	if !a.wait && err != nil {
		// TryLock's attempt failed: the key was not found held, and the
		// hooks (an error, to them) must hear what failed.
		return nil, a.abandon(err)
	}
	if !a.wait {
		return nil, a.abandon(errBusy)
	}
	return nil, nil
}

// storeHandedOut raises the key's stored token to a.handedOut, if set,
// with a release that finds the key not ours, or gives it back if it is.
func (a *acquisition) storeHandedOut() error {
	if a.handedOut == 0 {
		return nil
	}
	if _, err := a.l.releaseRedis(a.ctx, protocol.Release{HandedOut: a.handedOut}); err != nil {
		return err
	}
	a.handedOut = 0
	return nil
}

// firstAttemptHere makes the first attempt on the calling goroutine, if
// that cannot keep the caller past ctx's deadline: the client ends its
// calls at the deadline itself, the attempt is a plain SET (a key not
// seen contended, no WithWaitReplicas, no token to store first) and it
// can go out at once rather than queue behind other calls. A
// cancellation of ctx before its
// deadline then takes effect when the SET returns: one round trip, or
// while Redis hangs, the deadline. It returns the hold, or the error that
// ended the acquisition, or neither when the acquisition goes on aside:
// the key was taken, the SET failed, or it did not run.
func (a *acquisition) firstAttemptHere() (*Hold, error) {
	l := a.l
	if _, ok := a.ctx.Deadline(); !ok || !l.r.callsEndAtDeadline || a.state != attemptDue || a.handedOut != 0 || !l.plainSetFirst(a.mark.isSet()) {
		return nil, nil
	}
	sent := time.Now()
	held, wentOut, err := l.setIfFree(a.ctx, false)
	switch {
	case !wentOut:
		return nil, nil
	case !held && err == nil:
		// Another owner holds the key: obtain.lua follows aside, marking
		// this registry as waiting, as the rest of this attempt, which
		// tells the hooks of it (and Stats counts it once, failed).
		l.r.contention.saw(l.key)
		return nil, nil
	}
	l.r.attempting(a.ctx, l.key)
	if held {
		return l.took(sent), nil
	}
	l.r.stats.failed.Add(1)
	a.settleDoubt(err)
	if protocol.Permanent(err) {
		return nil, a.abandon(err)
	}
	a.failedWith(err)
	if a.ctx.Err() != nil {
		return nil, a.abandon(a.ctx.Err())
	}
	a.state = waiting // the next attempt comes after a pause, as after any failed one
	return nil, nil
}

// settleDoubt updates mayHoldKey after an attempt's call that returned
// err: a reply settles whether the key is this registry's, an error that
// can come after the call ran raises the doubt, and one that says it did
// not run (an error reply such as LOADING, no connection) leaves an
// earlier doubt standing, as the key that call may have taken is still
// there.
func (a *acquisition) settleDoubt(err error) {
	a.mayHoldKey = mayHaveRun(err) || errors.Is(err, errKeyKept) || (a.mayHoldKey && err != nil)
}

// errKeyKept marks the error of an attempt that took the key but could not
// give it back (obtainReplicated): the key may be this registry's, however
// surely the error says that the failed call did not run.
var errKeyKept = errors.New("the key may be held until its lease ends")

// redisAnswered is what an attempt that found the key held leaves as the
// last error: none, but an attempt ended (see failedWith). It stays nil;
// storing its address allocates nothing on a contended attempt.
var redisAnswered error

// failedWith records a Redis error of an attempt, logging it unless it
// repeats the last one or ctx ended (it then says nothing new). An attempt
// that ctx cut short keeps what the attempt before it found: the caller's
// error already says that ctx ended, and what Redis last said (connection
// refused, an ACL refusal, or that another owner held the key, which is no
// Redis error) is what tells them why the lock was not obtained. A cut is
// kept only where no attempt ended before it: Redis answered nothing.
func (a *acquisition) failedWith(err error) {
	prev := a.lastError()
	if a.ctx.Err() != nil {
		if a.lastErr.Load() == nil || !cutShort(err) {
			a.lastErr.Store(&err)
		}
		return
	}
	if prev == nil || prev.Error() != err.Error() {
		a.l.r.cfg.logger.Warn("lockreg: Redis error while acquiring; retrying", "key", printedKey(a.l.key), "error", err)
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

// attemptRedis makes one attempt to take the key and returns the hold it
// took, or nil and what it found: another owner holds the key. wait says
// that the caller will wait for the key, so that a failed attempt marks
// the registry (obtain.lua); marked, that an earlier attempt marked it,
// which a success withdraws.
func (l *Lock) attemptRedis(ctx context.Context, wait, marked bool) (h *Hold, found protocol.ObtainReply, err error) {
	r := l.r
	r.attempting(ctx, l.key)
	sent := time.Now()
	switch {
	case r.cfg.waitReplicas > 0:
		found, err = l.obtainReplicated(ctx, wait, marked)
	case l.plainSetFirst(marked):
		if found.Held, _, err = l.setIfFree(ctx, true); !found.Held && err == nil {
			found, err = l.obtain(ctx, wait, marked)
		}
	default:
		found, err = l.obtain(ctx, wait, marked)
	}
	if !found.Held {
		r.stats.failed.Add(1)
		if err == nil {
			r.contention.saw(l.key)
		}
		return nil, found, err
	}
	return l.took(sent), found, nil
}

// plainSetFirst says whether an attempt starts with a plain SET: unmarked,
// on a key this registry has not seen contended, without WithWaitReplicas.
func (l *Lock) plainSetFirst(marked bool) bool {
	return l.r.cfg.waitReplicas == 0 && !marked && !l.r.contention.looksContended(l.key)
}

// took returns the hold of an attempt, sent at sent, that took the key.
func (l *Lock) took(sent time.Time) *Hold {
	h := newHold(l, 0, sent, l.r.cfg.expireAfter)
	if h.leaseOver() {
		// The reply came a lease or more after the call was sent (Redis or
		// this process stalled): the key may have expired and passed on.
		h.lose(LossExpired)
	}
	return h
}

// setIfFree sets the key to the client id with the lease if no one holds
// it. Unless queue is set, the SET goes out only if it need not queue
// behind other calls (see batcher.send); wentOut says whether it did.
func (l *Lock) setIfFree(ctx context.Context, queue bool) (held, wentOut bool, err error) {
	r := l.r
	cmd, wentOut := r.batcher.send(ctx, queue, r.peer.SetIfFree(l.keys()))
	if !wentOut {
		return false, false, nil
	}
	r.countCalls(OpAcquire, 1)
	if held, err = protocol.ReadSetIfFree(cmd); err != nil {
		return false, true, fmt.Errorf("%w: attempt: %w", ErrRedis, l.cutKeys(err))
	}
	return held, true, nil
}

// obtain runs obtain.lua once.
func (l *Lock) obtain(ctx context.Context, wait, marked bool) (protocol.ObtainReply, error) {
	l.r.countCalls(OpAcquire, 1)
	found, err := protocol.ReadObtain(l.runScript(ctx, l.r.peer.Obtain(l.keys(), wait, marked), nil))
	if err != nil {
		return protocol.ObtainReply{}, fmt.Errorf("%w: attempt: %w", ErrRedis, l.cutKeys(err))
	}
	return found, nil
}

// obtainReplicated runs obtain.lua once, with WAIT.
func (l *Lock) obtainReplicated(ctx context.Context, wait, marked bool) (protocol.ObtainReply, error) {
	r := l.r
	r.countCalls(OpAcquire, 1)
	found, acked, waitErr, err := protocol.ObtainReplicated(ctx, r.client, r.peer.Obtain(l.keys(), wait, marked), r.cfg.waitReplicas, r.cfg.waitTimeout)
	if err != nil {
		return protocol.ObtainReply{}, fmt.Errorf("%w: attempt: %w", ErrRedis, l.cutKeys(err))
	}
	if !found.Held || acked >= int64(r.cfg.waitReplicas) {
		return found, nil
	}
	// Too few replicas have the key: a failover now could lose it. Give it
	// back rather than hold a lock that might not survive.
	if _, err := l.releaseRedis(ctx, protocol.Release{}); err != nil {
		// obtain.lua took the key, and the release that failed may not
		// have run (an error reply says it did not): the key may still be
		// this registry's, which the error must say, or an acquisition
		// that ends now would leave it locked for the lease.
		return protocol.ObtainReply{}, fmt.Errorf("%w (%w)", err, errKeyKept)
	}
	if waitErr != nil {
		// WAIT itself failed: an ACL without it is permanent, and says so.
		waitErr = fmt.Errorf("%w: wait: %w", ErrRedis, waitErr)
	}
	return protocol.ObtainReply{}, errors.Join(fmt.Errorf("%w: %d of %d replicas acknowledged %q within %v", ErrNotReplicated, acked, r.cfg.waitReplicas, printedKey(l.key), r.cfg.waitTimeout), waitErr)
}

// runScript runs one of the lock's script calls, c, through the batcher.
// While the lock's slot moves between Redis Cluster nodes, Redis refuses a
// script whose keys are split between the nodes or partly missing, which
// the waiting marker, the queue and the fence usually are; the script then
// runs on the lock's key alone (see protocol.Call.OnLockKeyOnly), which
// Redis always serves, so locks keep working during a migration. A call
// on the lock's key alone cannot reach the fence: fence's call, if any,
// is made first, on the fence alone, which Redis serves wherever the move
// left it, and the call on the lock's key only once that succeeded.
func (l *Lock) runScript(ctx context.Context, c protocol.Call, fence func() protocol.Call) *redis.Cmd {
	cmd := l.r.batcher.run(ctx, c)
	if !protocol.SlotMigrating(cmd.Err()) {
		return cmd
	}
	if fence != nil {
		if raised := l.r.batcher.run(ctx, fence()); raised.Err() != nil {
			return raised // nothing was freed
		}
	}
	return l.r.batcher.run(ctx, c.OnLockKeyOnly())
}

// mayHaveRun reports whether a failed call may have run its script after
// all: a timeout, a cancelled context or a broken connection can come after
// Redis ran it. An error reply from Redis, no connection to be had, or a
// closed client means it did not.
func mayHaveRun(err error) bool {
	if err == nil || errors.Is(err, ErrNotReplicated) || errors.Is(err, redis.ErrClosed) {
		return false
	}
	var reply redis.Error
	var netErr *net.OpError
	return !errors.As(err, &reply) && !errors.Is(err, redis.ErrPoolTimeout) &&
		!(errors.As(err, &netErr) && netErr.Op == "dial")
}
