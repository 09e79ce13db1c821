package lockreg

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Hold is one holding of a lock: from its acquisition to its release.
// Lock.Acquire returns one, and any goroutine may use it: release it,
// watch Lost, ask for its Token. The goroutine that acquired it may
// return meanwhile. A Hold is not reentrant: while it lives, every other
// acquisition of its key in the registry waits, that of the goroutine that
// acquired it included.
//
// The goroutine-owned holds of Lock and LockContext are Holds too, which
// the registry maps to their goroutine; Do and DoAll use Holds directly.
type Hold struct {
	lock  *Lock
	local *localLock
	taken time.Time // when this hold began (for WithMaxHold)
	// redisTaken is when the registry took the key in Redis; handoffs
	// counts the local hand-offs since. Both bound the run of hand-offs.
	redisTaken time.Time
	handoffs   int
	// leaseEnd (unix ns) is when the lease ends at the latest: measured
	// from when the last successful acquisition or renewal was sent, so it
	// never overestimates the real lease. Holds handed on locally share it
	// with the hold they came from, as they share its Redis key.
	leaseEnd *atomic.Int64
	lost     chan struct{} // closed once the hold may be lost (lose)

	// drawMu serializes token draws, so that a hold never has two tokens;
	// it is held across the draw's round trip, which is why mu is apart.
	drawMu sync.Mutex
	mu     sync.Mutex // guards what follows: short sections only
	token  int64      // the fencing token, 0 until drawn (see Token)
	cause  lossCause  // why the hold may be lost; lossNone while it is not
	// lostErr is the error a lost hold reports, made once at loss, so that
	// Do can tell it apart from the same news arriving by fn's error.
	lostErr error
	// onLoss, if set, is told of the loss (Do cancels fn's context).
	onLoss func(error)
	// released says that Release (or the last Unlock) has begun: a hold
	// is released once. keyReleased says that Shutdown released its key
	// in Redis already, so the owner's Release only frees it locally.
	released, keyReleased bool
}

func newHold(l *Lock, token int64, sent time.Time, lease time.Duration) *Hold {
	h := &Hold{lock: l, token: token, taken: sent, redisTaken: sent, leaseEnd: new(atomic.Int64), lost: make(chan struct{})}
	h.leaseEnd.Store(sent.Add(lease).UnixNano())
	return h
}

// Key returns the key the hold's lock was obtained for.
func (h *Hold) Key() string { return h.lock.key }

// redisKey is the hold's key in Redis.
func (h *Hold) redisKey() string { return h.lock.keys[0] }

// Lost returns a channel that is closed when the hold may have been lost:
// renewal found the Redis key gone or owned by someone else, Redis came
// back from a restart or failover without it, the lease ran out unrenewed
// (renewal off, past WithMaxHold, Redis unreachable), or the registry
// closed. It fires within one renewal interval (expireAfter/3) of the
// loss, within about a second of Redis answering again after a restart
// or failover (with WithPubSub on), and is closed already when the
// acquisition's reply came a lease or more after it was sent. Stop the
// protected work when it fires; Release then reports ErrLockLost.
//
// Release does not close it: a goroutine that watches it should also
// watch for the end of the work (Do does both for you).
func (h *Hold) Lost() <-chan struct{} { return h.lost }

// Release releases the hold: it passes the key to a goroutine of this
// registry that waits for it, within the WithLocalHandoff bounds, or
// deletes the Redis key if this registry still owns it (owner-checked: a
// key another owner took since is left alone). Either way the lock is
// freed locally.
//
// It returns ErrNotHeld, changing nothing, if the hold was released
// already. It returns ErrLockLost, naming the cause, if the hold may have
// been lost (Lost fired, or release found the key gone or taken): another
// owner may have held the key meanwhile. It returns an ErrRedis error,
// joined to that if both happened, if Redis failed (the key then expires
// after its lease).
//
// ctx bounds the Redis call as far as the client honours it (go-redis
// applies its deadline with ContextTimeoutEnabled set, and otherwise its
// ReadTimeout and WriteTimeout). A ctx that has ended already does not
// stop the release: it then runs bounded by the lease, after which the key
// would have expired anyway, so a cancelled request context never leaves
// a key held.
func (h *Hold) Release(ctx context.Context) error { return h.release(ctx) }

// Token returns the hold's fencing token. Every hold of a key, by any
// registry, that asks for a token gets one greater than the tokens of all
// earlier holds of that key. Pass it with every write the lock protects,
// and have the store reject a write whose token is lower than one it has
// seen: that stops a holder that lost its lock (a long pause past the
// lease) from doing harm.
//
// A hold's first call draws its token in Redis, one round trip, checking
// that the key is still this registry's; later calls, holds passed on
// from a hold that has a token, and keys another registry passed to this
// one cost nothing. Holds that never ask pay nothing for fencing. Token
// returns an ErrNotHeld error once the hold is released; an ErrLockLost
// error if the key expired or passed on, or may have (Lost has fired):
// stop the protected work; and an ErrRedis error if Redis failed (the
// hold is unchanged: call again). Like Release, it is bounded by ctx only
// as far as the client honours it.
func (h *Hold) Token(ctx context.Context) (int64, error) {
	h.drawMu.Lock()
	defer h.drawMu.Unlock()
	token, err := h.usableToken()
	if err != nil || token != 0 {
		return token, err
	}
	l := h.lock
	token, err = l.runScript(ctx, drawScript, l.keys[:2], l.r.clientIDArg, l.r.leaseArg).Int64()
	if err != nil {
		return 0, fmt.Errorf("%w: draw the token of %q: %w", ErrRedis, l.key, err)
	}
	if token == 0 {
		h.endLease(lossDeleted)
		return 0, h.lossError()
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.released {
		// Released while the draw ran: the next holder draws its own.
		return 0, fmt.Errorf("%w: key %q: released while its token was drawn", ErrNotHeld, l.key)
	}
	h.token = token
	return token, nil
}

// usableToken returns the hold's token, or 0 if it has none yet, or why
// it cannot have one.
func (h *Hold) usableToken() (int64, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.released:
		return 0, fmt.Errorf("%w: key %q: the hold was released", ErrNotHeld, h.lock.key)
	case h.cause != lossNone:
		return 0, h.lostErr
	case h.leaseOver():
		return 0, fmt.Errorf("%w: key %q: %s", ErrLockLost, h.lock.key, lossExpired.explain())
	}
	return h.token, nil
}

// lossCause says why a hold may have been lost.
type lossCause uint8

const (
	lossNone    lossCause = iota
	lossExpired           // the lease ran out unrenewed
	lossMaxHold           // renewal stopped at WithMaxHold, and the lease ran out
	lossDeleted           // Redis said the key was gone or another owner's
	lossRestart           // Redis came back from a restart or failover without the key
	lossClosed            // the registry closed
)

// String names the cause as metrics and logs do.
func (c lossCause) String() string {
	return [...]string{"none", "expired", "max_hold", "deleted", "restart", "closed"}[c]
}

// explain says what the cause means to the holder.
func (c lossCause) explain() string {
	return [...]string{
		"",
		"its lease ran out unrenewed (a stall longer than the lease, or Redis unreachable)",
		"it was held past WithMaxHold and its lease ran out",
		"its Redis key was deleted or passed to another owner",
		"Redis came back from a restart or failover without its key",
		"the registry was closed",
	}[c]
}

// lossUnknown is the cause of a loss that release.lua found: the key was
// not this registry's any more, for a reason Redis does not tell.
const lossUnknown = "its Redis key expired, was deleted, or Redis lost it"

// lose signals the hold lost for cause, once, unless it was released
// first (a release that found the key gone reports that itself).
func (h *Hold) lose(cause lossCause) {
	h.mu.Lock()
	tell := h.loseLocked(cause)
	h.mu.Unlock()
	tell()
}

// loseLocked is lose, with h.mu held; the caller runs tell once it let go
// of h.mu, to tell whoever asked to be told (see whenLost).
func (h *Hold) loseLocked(cause lossCause) (tell func()) {
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
func (h *Hold) endLease(cause lossCause) {
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

// release is Release, for Hold values and the last Unlock alike.
func (h *Hold) release(ctx context.Context) error {
	l, local := h.lock, h.local
	r := l.r
	h.mu.Lock()
	if h.released {
		h.mu.Unlock()
		return fmt.Errorf("%w: key %q: released already", ErrNotHeld, l.key)
	}
	h.released = true
	token, lostErr, keyReleased := h.token, h.lostErr, h.keyReleased
	h.mu.Unlock()

	local.hold.Store(nil)
	r.holdEnded()
	if keyReleased {
		l.free(local)
		return lostErr
	}
	if next := r.handoff(h, token, local); next != nil && local.unlock(handover{hold: next}) {
		r.locals.leave(l.key)
		return nil
	}
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		ctx, cancel = r.releaseContext(ctx)
		defer cancel()
	}
	// If a goroutine of this registry waits for the key and the release
	// passes it to another registry, the release marks this one as waiting
	// too, in the same call, for that goroutine: it then waits for its
	// grant without a failing attempt of its own, one round trip less per
	// hand-off between processes. Only a subscribed registry hears grants.
	markNext := r.grantLease > 0 && r.subscribed.Load() && local.waited()
	var sent time.Time // when the call that may mark was sent
	if markNext {
		sent = time.Now()
	}
	// A lease that ran out before the release, as the registry counts it,
	// may have let another owner in, even if the key is this registry's
	// again by the time the release runs.
	leaseRanOut := h.leaseOver()
	var handedOutToken int64
	if h.handoffs > 0 {
		handedOutToken = token
	}
	released, err := l.releaseRedis(ctx, handedOutToken, markNext)
	var mark waitMark
	if released < 0 {
		mark = waitMark{sent: sent, token: -released}
		released = granted
	}
	switch released {
	case releasedWhileWaited:
		// Another registry waits: let it take the key before our next
		// acquisition tries, or that would nearly always win.
		r.yields.Store(l.key, time.Now().Add(r.yield))
		l.sawContention()
	case granted:
		l.sawContention()
	}
	if !local.unlock(handover{mark: mark}) && mark.token != 0 {
		// The waiter gave up meanwhile. unlock kept the mutex, so that
		// the withdrawal is on record before the next owner can attempt.
		l.unmark()
		local.unlock(handover{})
	}
	r.locals.leave(l.key)
	switch {
	case lostErr != nil:
	case leaseRanOut:
		lostErr = fmt.Errorf("%w: key %q: %s", ErrLockLost, l.key, lossExpired.explain())
	case err == nil && released == notOurs:
		lostErr = fmt.Errorf("%w: key %q: %s", ErrLockLost, l.key, lossUnknown)
	}
	if lostErr != nil && err != nil {
		return errors.Join(lostErr, err)
	}
	if lostErr != nil {
		return lostErr
	}
	return err
}

// releaseContext is the context of a release that must not be cut short
// by ctx's end: ctx's values, bounded by the lease, after which the key
// has expired anyway.
func (r *Registry) releaseContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), r.cfg.expireAfter)
}

// handoff returns the hold to pass, with the Redis key, to the next local
// waiter, or nil when h must go back to Redis: hand-offs are off, h may be
// lost, nobody waits, or the run of hand-offs reached its bound, after
// which other registries get their turn. If h has a token, the next hold's
// is one more: no other registry can draw a token meanwhile, as the key
// stays held, and the release stores the last one handed out. Otherwise
// the next hold draws its own if asked.
func (r *Registry) handoff(h *Hold, token int64, local *localLock) *Hold {
	if r.cfg.handoffMax == 0 || h.handoffs >= r.cfg.handoffMax || h.isLost() || h.leaseOver() ||
		time.Since(h.redisTaken) >= r.cfg.handoffFor || !local.waited() {
		return nil
	}
	next := &Hold{
		lock:       h.lock,
		local:      local,
		taken:      time.Now(),
		redisTaken: h.redisTaken,
		handoffs:   h.handoffs + 1,
		leaseEnd:   h.leaseEnd,
		lost:       make(chan struct{}),
	}
	if token != 0 {
		next.token = token + 1
	}
	return next
}

// closedSignal is what Lock.Lost returns to a goroutine that holds nothing.
var closedSignal = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

func (r *Registry) forEachHold(fn func(*Hold)) {
	r.locals.m.Range(func(_ string, l *localLock) bool {
		if h := l.hold.Load(); h != nil {
			fn(h)
		}
		return true
	})
}
