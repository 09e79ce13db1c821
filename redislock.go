package lockreg

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed token.lua
	tokenLua string
	//go:embed mark.lua
	markLua string
	//go:embed obtain.lua
	obtainLua string
	//go:embed release.lua
	releaseLua string
	//go:embed draw.lua
	drawLua string

	// Script.Run sends EVALSHA and falls back to EVAL on NOSCRIPT, so a
	// restarted Redis costs one extra round trip, once. The scripts draw
	// tokens with token.lua's function and mark waiting registries with
	// mark.lua's.
	obtainScript  = redis.NewScript(tokenLua + markLua + obtainLua)
	releaseScript = redis.NewScript(tokenLua + markLua + releaseLua)
	drawScript    = redis.NewScript(tokenLua + drawLua)
)

var _ sync.Locker = (*Lock)(nil)

// Lock is the distributed lock for one key of a Registry. It can be held
// two ways:
//
//   - Acquire returns a Hold, which belongs to no goroutine: any goroutine
//     may release it. Registry.Do and DoAll build on it.
//   - LockContext, Lock and TryLock make the calling goroutine the owner,
//     as Java's locks do threads: the owner may lock again (each lock
//     matched by an unlock, at no cost in Redis) and must unlock from the
//     same goroutine. Lock and Unlock make it a sync.Locker.
//
// Either way, while the key is held every other acquisition of it in the
// registry waits, in arrival order. All methods are safe for concurrent
// use, and all Locks of one key in one registry share one state.
type Lock struct {
	r    *Registry
	key  string
	keys []string // in Redis: the lock, its fence (token), its waiting marker and its queue
}

// Key returns the key the lock was obtained for.
func (l *Lock) Key() string { return l.key }

// Acquire waits until it holds the lock and returns the Hold, which any
// goroutine may release; or, when ctx ends first, an error matching both
// ErrNotObtained and ctx.Err() (joined with the last Redis error, if any).
// It fails with ErrClosed if the registry is or gets closed. It waits as
// LockContext does, but is not reentrant: a goroutine that holds the key
// (by any method) and calls Acquire waits for itself until ctx ends.
func (l *Lock) Acquire(ctx context.Context) (*Hold, error) {
	return l.acquireHold(ctx, true)
}

// Lock waits as long as it takes for the calling goroutine to hold the
// lock: it is the sync.Locker adapter; prefer Registry.Do or LockContext,
// which report errors. Redis errors while waiting are logged and retried.
//
// If the registry is closed, or closes while Lock waits (Close, Shutdown),
// Lock can neither hold the lock nor report it: it logs an error and
// blocks the calling goroutine for good, so that no critical section runs
// unlocked and a shutdown is not turned into a crash by a panic. A
// process that waits for such a goroutine before it exits would wait for
// ever: goroutines that a shutdown waits for should use LockContext or Do.
func (l *Lock) Lock() {
	if err := l.LockContext(context.Background()); err != nil {
		l.r.cfg.logger.Error("lockreg: Lock blocks for good: the registry is closed", "key", l.key)
		parkForever()
	}
}

// parkForever blocks the calling goroutine for the rest of the process.
func parkForever() { select {} }

// TryLock makes one attempt, without waiting, and reports whether the
// calling goroutine now holds the lock. It fails if another goroutine or
// Hold of this registry holds or is acquiring the lock, another owner
// holds the Redis key, Redis fails (logged), or the registry is closed.
func (l *Lock) TryLock() bool {
	return l.acquire(context.Background(), false) == nil
}

// LockContext waits until the calling goroutine holds the lock, retrying
// Redis every retry interval, and returns nil; or, when ctx ends first, an
// error matching both ErrNotObtained and ctx.Err() (joined with the last
// Redis error, if any). It fails with ErrClosed if the registry is or gets
// closed.
//
// It returns when ctx ends even while Redis hangs. For that, with a ctx
// that can end, its Redis calls run in a goroutine of their own, which
// costs a hand-off between goroutines each way. A client that ends its
// calls at ctx's deadline itself (go-redis's ContextTimeoutEnabled) saves
// that when ctx has a deadline: the first attempt, which takes a free key,
// then runs on the calling goroutine, and a cancellation before the
// deadline takes effect once that call returns.
func (l *Lock) LockContext(ctx context.Context) error {
	return l.acquire(ctx, true)
}

// Unlock releases one level of the caller's hold; the last one releases
// the lock as Hold.Release does. Failures are logged; use UnlockContext
// to see them. Unlock by a goroutine that does not hold the lock panics
// with ErrNotHeld, as unlocking an unlocked sync.Mutex does.
func (l *Lock) Unlock() {
	err := l.UnlockContext(context.Background())
	switch {
	case err == nil:
	case errors.Is(err, ErrNotHeld):
		panic(err)
	default:
		l.r.cfg.logger.Warn("lockreg: unlock failed", "key", l.key, "error", err)
	}
}

// UnlockContext releases one level of the caller's hold. The last one
// releases the lock as Hold.Release does, with the same errors and the
// same use of ctx. It returns ErrNotHeld, changing nothing, if the caller
// does not hold the lock.
func (l *Lock) UnlockContext(ctx context.Context) error {
	local := l.r.locals.ownedBy(l.key, goroutineID())
	if local == nil {
		return fmt.Errorf("%w: key %q", ErrNotHeld, l.key)
	}
	local.depth--
	if local.depth > 0 {
		return nil
	}
	local.owner.Store(0)
	return local.hold.Load().release(ctx)
}

// acquire takes the lock for the calling goroutine: again, if it holds it.
func (l *Lock) acquire(ctx context.Context, wait bool) error {
	if l.r.closing() {
		return fmt.Errorf("%w: cannot lock %q", ErrClosed, l.key)
	}
	gid := goroutineID()
	if local := l.r.locals.ownedBy(l.key, gid); local != nil {
		local.depth++
		return nil
	}
	h, err := l.acquireHold(ctx, wait)
	if err != nil {
		return err
	}
	h.local.owner.Store(gid)
	h.local.depth = 1
	return nil
}

// acquireHold takes the local mutex, then the key in Redis unless the
// mutex came with a hold, and returns the new hold.
func (l *Lock) acquireHold(ctx context.Context, wait bool) (*Hold, error) {
	r := l.r
	if r.closing() {
		return nil, fmt.Errorf("%w: cannot lock %q", ErrClosed, l.key)
	}
	start := time.Now()
	local := r.locals.join(l.key)
	got, err := local.lock(ctx, r.closed, wait)
	if err != nil {
		r.locals.leave(l.key)
		return nil, l.notAcquired(ctx, err, nil)
	}
	h, handedOver := got.hold, got.hold != nil
	if !handedOver {
		if h, err = l.obtainRedis(ctx, wait, local, got.mark); err != nil {
			return nil, err
		}
		h.local = local
	}
	local.hold.Store(h)
	r.stats.acquired(time.Since(start), handedOver)
	// Close signals the holds it finds, after closing: a hold stored once
	// it looked would never be signalled, nor renewed. Such an
	// acquisition, which Close (or Shutdown) overtook, fails as the
	// waiting ones do, and gives the key back.
	if r.closing() {
		_ = h.release(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("%w: cannot lock %q", ErrClosed, l.key)
	}
	r.subscribeSoon()
	return h, nil
}

// Token returns the fencing token of the calling goroutine's hold, as
// Hold.Token does; an ErrNotHeld error if the caller holds nothing.
func (l *Lock) Token(ctx context.Context) (int64, error) {
	local := l.r.locals.ownedBy(l.key, goroutineID())
	if local == nil {
		return 0, fmt.Errorf("%w: key %q: lock it before asking for its token", ErrNotHeld, l.key)
	}
	return local.hold.Load().Token(ctx)
}

// Lost returns the Lost channel of the calling goroutine's hold (see
// Hold.Lost). A goroutine that holds nothing, another goroutine than the
// owner included, gets a closed channel: to watch a hold from another
// goroutine, hold it with Acquire or Do.
func (l *Lock) Lost() <-chan struct{} {
	if local := l.r.locals.ownedBy(l.key, goroutineID()); local != nil {
		return local.hold.Load().lost
	}
	return closedSignal
}

// obtainRedis runs obtain.lua until it succeeds or, when wait is false,
// once; with a mark that a release left, it first waits for the grant the
// mark asks for. Called with the local mutex held; on failure it gives
// that up.
//
// A go-redis client need not honour ctx while Redis is slow to answer
// (ContextTimeoutEnabled is off by default), so with a cancellable ctx the
// Redis calls run in a goroutine of their own (see offCaller): if ctx ends
// while one is in flight, obtainRedis returns at once and leaves the local
// mutex to that goroutine, which gives it up when Redis answers, deleting
// the key (owner-checked) if the call took it. The waiting between
// attempts, and the taking of a grant, which need no call, stay on the
// caller's goroutine: a grant from another process then wakes the caller
// itself. Handing a call to another goroutine and back costs a wake-up
// each way, about 6% of an uncontended cycle on a 2-core VM
// (BenchmarkUncontendedWithContext), so the first attempt runs on the
// caller's goroutine when the client itself ends its calls at ctx's
// deadline (see tryInline).
func (l *Lock) obtainRedis(ctx context.Context, wait bool, local *localLock, mark waitMark) (*Hold, error) {
	a := &acquisition{
		l: l, ctx: ctx, wait: wait, local: local,
		due: mark.token == 0, marked: mark.token != 0, failed: mark.sent, failedToken: mark.token,
	}
	if err := a.begin(); err != nil {
		return nil, err
	}
	if ctx.Done() == nil {
		return a.run(a.calls)
	}
	if h, err := a.tryInline(); h != nil || err != nil {
		return h, err
	}
	return a.run(a.offCaller)
}

// waitMark is a mark of this registry as waiting for a key, left by a
// release of this registry that passed the key to another one while a
// goroutine of this one waited for it: the release was sent at sent, and
// token is the key's last token then (the grant's). It stands for the
// failed attempt that goroutine would have made (see acceptGrant).
type waitMark struct {
	sent  time.Time
	token int64
}

// acquisition is obtainRedis's state: the attempts of one acquisition of a
// key in Redis, made by one goroutine at a time.
type acquisition struct {
	l     *Lock
	ctx   context.Context
	wait  bool
	local *localLock
	// due says that an attempt is due before waiting: at first, unless a
	// mark awaits its grant, and after every wait.
	due bool
	// marked says that an attempt (or a mark) marked this registry as
	// waiting; failed is the latest attempt that found another owner, and
	// failedToken the last token it reported: see acceptGrant.
	marked      bool
	failed      time.Time
	failedToken int64
	err         error                 // the last attempt's error
	lastErr     atomic.Pointer[error] // the last Redis error, for the caller's error
	retry       *time.Timer
}

// begin readies the first attempt, or reports why the acquisition ended
// before it.
func (a *acquisition) begin() error {
	if a.due {
		err := a.l.awaitPending(a.ctx)
		if err == nil {
			err = a.l.yield(a.ctx)
		}
		if err != nil {
			a.l.free(a.local)
			return a.l.notAcquired(a.ctx, err, nil)
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
	if a.due {
		a.local.grantedToken.Store(0)
	}
	return nil
}

// run makes the attempts until one takes the key, or a grant gives it,
// or the acquisition ends; calls makes the Redis calls that are due.
func (a *acquisition) run(calls func() (*Hold, error)) (*Hold, error) {
	for {
		if h := a.takeGrant(); h != nil {
			return h, nil
		}
		if a.due {
			if h, err := calls(); h != nil || err != nil {
				return h, err
			}
		}
		if err := a.pause(); err != nil {
			return nil, err
		}
	}
}

// takeGrant returns the hold a grant that came gives, if it can be
// trusted; else, if a grant came, the key is ours, but since when is
// unknown, and an attempt is due to find out.
func (a *acquisition) takeGrant() *Hold {
	token := a.local.grantedToken.Swap(0)
	if token == 0 {
		return nil
	}
	if h := a.l.acceptGrant(a.local, token, a.failed, a.failedToken); h != nil {
		return h
	}
	a.due = true
	return nil
}

// calls makes the attempt that is due. If it fails while the registry has
// no subscription yet, it subscribes and, once subscribed, tries again at
// once: a release between the failed attempt and the subscription must
// not be missed. It returns the hold, or the error that ended the
// acquisition, or neither when it is time to wait.
func (a *acquisition) calls() (*Hold, error) {
	for {
		if h, err := a.attempt(); h != nil || err != nil {
			return h, err
		}
		r := a.l.r
		if !r.cfg.pubSub || r.subscribed.Load() || r.subscribe(a.ctx) != nil {
			return nil, nil
		}
		if h := a.takeGrant(); h != nil {
			return h, nil
		}
		a.due = true
	}
}

// offCaller is calls in a goroutine of its own, from which the caller
// returns when ctx ends; the goroutine then ends the acquisition when its
// calls return.
func (a *acquisition) offCaller() (*Hold, error) {
	type result struct {
		h   *Hold
		err error
	}
	answer, left := make(chan result), make(chan struct{})
	started := a.l.r.goBackground(func(stop context.Context) {
		h, err := a.calls()
		select {
		case answer <- result{h, err}:
		case <-left:
			switch {
			case h != nil:
				a.l.settle(stop, a.local, true)
			case err == nil:
				_ = a.giveUp(a.ctx.Err())
			}
		}
	})
	if !started {
		return nil, a.giveUp(ErrClosed)
	}
	select {
	case got := <-answer:
		return got.h, got.err
	case <-a.ctx.Done():
		close(left)
		return nil, a.l.notAcquired(a.ctx, a.ctx.Err(), a.lastError())
	}
}

// attempt makes the attempt that is due. It returns the hold, or the
// error that ended the acquisition (TryLock's attempt failed), or neither
// when the acquisition goes on.
func (a *acquisition) attempt() (*Hold, error) {
	sent := time.Now()
	h, lastToken, err := a.l.tryObtain(a.ctx, a.wait, a.marked)
	if h != nil {
		return h, nil
	}
	a.due, a.err = false, err
	if err == nil { // another owner held it: obtain.lua marked us if we wait
		a.marked, a.failed, a.failedToken = a.wait, sent, lastToken
	} else {
		a.failedWith(err)
	}
	if !a.wait {
		return nil, a.giveUp(errBusy)
	}
	return nil, nil
}

// tryInline makes the first attempt on the calling goroutine, if that
// cannot keep the caller past ctx's deadline: the client ends its calls at
// the deadline itself (go-redis's ContextTimeoutEnabled), the attempt is a
// plain SET (a key not seen contended, no WithWaitReplicas) and it can go
// out at once rather than queue behind other calls. A cancellation of ctx
// before its deadline then takes effect when the SET returns: one round
// trip, or while Redis hangs, the deadline. It returns the hold, or the
// error that ended the acquisition, or neither when the acquisition goes
// on in the background: the key was taken, the SET failed, or it did not
// run.
func (a *acquisition) tryInline() (*Hold, error) {
	l := a.l
	if _, ok := a.ctx.Deadline(); !ok || !l.r.callsEndAtDeadline || !a.due || !l.plainSetFirst(a.marked) {
		return nil, nil
	}
	sent := time.Now()
	reply, wentOut, err := l.setIfFree(a.ctx, false)
	switch {
	case !wentOut:
		return nil, nil
	case reply == 1:
		return l.took(sent), nil
	case err == nil:
		// Another owner holds the key: obtain.lua follows in the
		// background, marking this registry as waiting.
		l.sawContention()
		return nil, nil
	}
	l.r.stats.failed.Add(1)
	a.err = err
	a.failedWith(err)
	if a.ctx.Err() != nil {
		return nil, a.giveUp(a.ctx.Err())
	}
	a.due = false // the next attempt comes after a pause, as after any failed one
	return nil, nil
}

// failedWith records a Redis error of an attempt, logging it unless it
// repeats the last one or ctx ended (it then says nothing new).
func (a *acquisition) failedWith(err error) {
	if prev := a.lastError(); (prev == nil || prev.Error() != err.Error()) && a.ctx.Err() == nil {
		a.l.r.cfg.logger.Warn("lockreg: Redis error while acquiring; retrying", "key", a.l.key, "error", err)
	}
	a.lastErr.Store(&err)
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
		a.due = true
		return nil
	case <-a.local.wake:
		a.due = true
		return nil
	case <-a.ctx.Done():
		stop = a.ctx.Err()
	case <-r.closed:
		stop = ErrClosed
	}
	a.retry.Stop()
	return a.giveUp(stop)
}

// giveUp ends the acquisition for the reason stop: it withdraws its mark
// and frees the local mutex, first releasing the key if the last attempt
// or a grant may have taken it.
func (a *acquisition) giveUp(stop error) error {
	l := a.l
	// A grant that came meanwhile left the key to this registry.
	granted := a.local.grantedToken.Swap(0) != 0
	if a.marked {
		l.unmark()
	}
	l.abandon(a.local, mayHaveRun(a.err) || granted)
	return l.notAcquired(a.ctx, stop, a.lastError())
}

// tryObtain makes one attempt to take the key and returns the hold it
// took, or nil if another owner holds the key; then lastToken is the key's
// last token, if Redis has it (see acceptGrant). wait says that the caller
// will wait for the key, so that its mark may ask for a grant; marked,
// that an earlier attempt marked this registry as waiting, which a success
// must undo. With WithWaitReplicas, a hold too few replicas acknowledged
// is released again and reported as ErrNotReplicated.
//
// An unmarked attempt on a key this registry has not seen contended is a
// plain SET NX PX, the least Redis can do to take a key; only if that
// finds the key taken does obtain.lua follow, which marks this registry as
// waiting, or finds the key its own already.
func (l *Lock) tryObtain(ctx context.Context, wait, marked bool) (h *Hold, lastToken int64, err error) {
	r := l.r
	sent := time.Now()
	var reply int64 // obtain.lua's: 1 when held, else 0 or minus the last token
	switch {
	case r.cfg.waitReplicas > 0:
		reply, err = l.obtainReplicated(ctx, wait, marked)
	case l.plainSetFirst(marked):
		if reply, _, err = l.setIfFree(ctx, true); reply == 0 && err == nil {
			reply, err = l.obtainScripted(ctx, wait, marked)
		}
	default:
		reply, err = l.obtainScripted(ctx, wait, marked)
	}
	if reply <= 0 {
		r.stats.failed.Add(1)
		if err == nil {
			l.sawContention()
		}
		return nil, -reply, err
	}
	return l.took(sent), 0, nil
}

// plainSetFirst says whether an attempt starts with a plain SET: unmarked,
// on a key this registry has not seen contended, without WithWaitReplicas.
func (l *Lock) plainSetFirst(marked bool) bool {
	return l.r.cfg.waitReplicas == 0 && !marked && !l.looksContended()
}

// took returns the hold of an attempt, sent at sent, that took the key.
func (l *Lock) took(sent time.Time) *Hold {
	h := newHold(l, 0, sent, l.r.cfg.expireAfter)
	if h.leaseOver() {
		// The reply came a lease or more after the call was sent (Redis or
		// this process stalled): the key may have expired and passed on.
		h.lose(lossExpired)
	}
	return h
}

// setIfFree sets the key to the client id with the lease if no one holds
// it, and answers as obtain.lua does: 1 if it did, 0 if not. Unless queue
// is set, the SET goes out only if it need not queue behind other calls
// (see batcher.send); wentOut says whether it did.
func (l *Lock) setIfFree(ctx context.Context, queue bool) (reply int64, wentOut bool, err error) {
	r := l.r
	cmd, wentOut := r.calls.send(ctx, queue, nil, nil, "set", l.keys[0], r.clientIDArg, "px", r.leaseArg, "nx")
	if !wentOut {
		return 0, false, nil
	}
	r.stats.acquireCalls.Add(1)
	switch err := cmd.Err(); {
	case err == nil:
		return 1, true, nil
	case errors.Is(err, redis.Nil):
		return 0, true, nil
	default:
		return 0, true, fmt.Errorf("%w: obtain %q: %w", ErrRedis, l.key, err)
	}
}

// obtainScripted runs obtain.lua once.
func (l *Lock) obtainScripted(ctx context.Context, wait, marked bool) (int64, error) {
	l.r.stats.acquireCalls.Add(1)
	reply, err := l.runScript(ctx, obtainScript, l.keys, l.obtainArgs(wait, marked)...).Int64()
	if err != nil {
		return 0, fmt.Errorf("%w: obtain %q: %w", ErrRedis, l.key, err)
	}
	return reply, nil
}

// looksContended reports whether this registry found the key taken by
// another registry, or released it while another waited, within the last
// lease: its attempts then go straight to obtain.lua, as a plain SET would
// likely fail and cost a round trip, and its releases send release.lua all
// its arguments. A release nobody waited for does not end that: under
// intermittent contention, an extra round trip costs far more than the
// few microseconds the plain path saves.
func (l *Lock) looksContended() bool {
	until, ok := l.r.contended.Load(l.key)
	return ok && time.Now().Before(until)
}

func (l *Lock) sawContention() {
	l.r.contended.Store(l.key, time.Now().Add(l.r.cfg.expireAfter))
}

// acceptGrant returns the hold on a key another registry's release granted
// to this one with token, or nil if the grant cannot be trusted: the key
// is ours then, but since when is unknown, and the next attempt finds out.
// A grant answers the mark of a failed attempt. If it carries a larger
// token than the last one that attempt reported (failedToken), it came
// after that attempt ran, so after failed, and its lease runs at least
// until failed + grantLease. That makes the hold as safe as one obtained
// by a call sent at failed. The lease is then extended to the registry's
// own in the background if the key is still held later (see extendLater).
func (l *Lock) acceptGrant(local *localLock, token int64, failed time.Time, failedToken int64) *Hold {
	r := l.r
	if failedToken <= 0 || token <= failedToken {
		return nil
	}
	h := newHold(l, token, failed, r.grantLease)
	if h.leaseOver() {
		return nil
	}
	// The hold itself begins now, for WithMaxHold and the run of local
	// hand-offs.
	h.taken = time.Now()
	h.redisTaken = h.taken
	if !r.extendLater(local, h) {
		return nil // closing: the grant expires unextended
	}
	r.stats.grants.Add(1)
	return h
}

// extendLater extends a granted hold's short lease to the registry's own
// halfway through what is left of it, if the hold, or a hold handed on
// from it, still has the key then. Most holds end sooner and need no
// extension, which would cost a round trip; a timer, rather than a
// goroutine per grant, waits for that moment, so that short holds leave
// nothing running behind them. It reports false, and extends nothing,
// once the registry is closed.
func (r *Registry) extendLater(local *localLock, h *Hold) bool {
	if r.closing() {
		return false
	}
	time.AfterFunc(time.Until(time.Unix(0, h.leaseEnd.Load()))/2, func() {
		if current := local.hold.Load(); current != nil && current.leaseEnd == h.leaseEnd && !current.leaseOver() {
			r.goBackground(func(ctx context.Context) { r.renew(ctx, [][]*Hold{{current}}) })
		}
	})
	return true
}

// unmark withdraws, in the background, this registry's waiting mark on
// the key, so that releases stop passing the key to this registry, which
// would only give it back. The caller holds the key's local mutex: the
// withdrawal is pending before the next owner can attempt, and that owner
// waits for it (awaitPending), as its attempt marks the registry again,
// with the same mark, which a withdrawal landing later would take away,
// and with it the wake-up and the place in the queue.
func (l *Lock) unmark() {
	r := l.r
	finish := r.startPending(l.key)
	mark := l.obtainArgs(true, true)[4]
	if !r.goBackground(func(ctx context.Context) {
		defer finish()
		if _, err := r.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			p.ZRem(ctx, l.keys[2], mark)
			p.ZRem(ctx, l.keys[3], mark)
			return nil
		}); err != nil {
			r.cfg.logger.Debug("lockreg: could not withdraw a waiting mark; it lapses by itself", "key", l.key, "error", err)
		}
	}) {
		finish() // closed: the mark lapses by itself
	}
}

// pendingCalls counts a key's pending calls (see Registry.pending); done
// closes when the count drops to zero.
type pendingCalls struct {
	n    int
	done chan struct{}
}

// startPending records a call on key's state as pending; finish, which
// may be called more than once, records it done.
func (r *Registry) startPending(key string) (finish func()) {
	var p *pendingCalls
	r.pending.Compute(key, func(calls *pendingCalls, loaded bool) (*pendingCalls, bool) {
		if !loaded {
			calls = &pendingCalls{done: make(chan struct{})}
		}
		calls.n++
		p = calls
		return calls, false
	})
	return sync.OnceFunc(func() {
		r.pending.Compute(key, func(_ *pendingCalls, _ bool) (*pendingCalls, bool) {
			p.n--
			if p.n > 0 {
				return p, false
			}
			close(p.done)
			return p, true
		})
	})
}

// awaitPending waits, before an acquisition's first attempt, for the
// calls on the key's state that are pending (see Registry.pending).
func (l *Lock) awaitPending(ctx context.Context) error {
	p, ok := l.r.pending.Load(l.key)
	if !ok {
		return nil
	}
	return waitFor(ctx, l.r.closed, p.done)
}

// waitFor waits until done delivers or closes (nil), ctx ends (ctx.Err())
// or the registry closes (ErrClosed).
func waitFor[T any](ctx context.Context, closed <-chan struct{}, done <-chan T) error {
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-closed:
		return ErrClosed
	}
}

// obtainArgs are obtain.lua's arguments.
func (l *Lock) obtainArgs(wait, marked bool) []any {
	return l.r.obtainArgs[b2i(wait)][b2i(marked)]
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// obtainReplicated sends obtain.lua and WAIT in one pipeline, on one
// connection to the key's primary, as WAIT counts the acknowledgements of
// that connection's writes.
func (l *Lock) obtainReplicated(ctx context.Context, wait, marked bool) (int64, error) {
	r := l.r
	node := redis.Cmdable(r.client)
	if cluster, ok := r.client.(*redis.ClusterClient); ok {
		primary, err := cluster.MasterForKey(ctx, l.keys[0])
		if err != nil {
			return 0, fmt.Errorf("%w: obtain %q: %w", ErrRedis, l.key, err)
		}
		node = primary
	}
	r.stats.acquireCalls.Add(1)
	var obtained, acks *redis.Cmd
	run := func() {
		// Each command's own error is read below; Pipelined's is the first.
		_, _ = node.Pipelined(ctx, func(p redis.Pipeliner) error {
			obtained = obtainScript.EvalSha(ctx, p, l.keys, l.obtainArgs(wait, marked)...)
			acks = p.Do(ctx, "WAIT", r.cfg.waitReplicas, r.cfg.waitTimeout.Milliseconds())
			return nil
		})
	}
	run()
	if redis.HasErrorPrefix(obtained.Err(), "NOSCRIPT") {
		if err := obtainScript.Load(ctx, node).Err(); err != nil {
			return 0, fmt.Errorf("%w: obtain %q: %w", ErrRedis, l.key, err)
		}
		run()
	}
	token, err := obtained.Int64()
	if err != nil {
		return 0, fmt.Errorf("%w: obtain %q: %w", ErrRedis, l.key, err)
	}
	acked, err := acks.Int64()
	if token <= 0 || (err == nil && acked >= int64(r.cfg.waitReplicas)) {
		return token, nil
	}
	// Too few replicas have the key: a failover now could lose it. Give it
	// back rather than hold a lock that might not survive.
	if _, err := l.releaseRedis(ctx, 0, false); err != nil {
		return 0, err
	}
	return 0, errors.Join(fmt.Errorf("%w: %d of %d replicas acknowledged %q within %v", ErrNotReplicated, acked, r.cfg.waitReplicas, l.key, r.cfg.waitTimeout), err)
}

// runScript runs one of the lock's scripts on keys, the lock's key first.
// While the lock's slot moves between Redis Cluster nodes, Redis refuses a
// script whose keys are split between the nodes or partly missing, which
// the waiting marker, the queue and the fence usually are; the script then
// runs on the lock's key alone (no marker, no queue, no fence: see the
// scripts), which Redis always serves, so locks keep working during a
// migration.
func (l *Lock) runScript(ctx context.Context, script *redis.Script, keys []string, args ...any) *redis.Cmd {
	cmd := l.r.calls.run(ctx, script, keys, args...)
	if slotMigrating(cmd.Err()) {
		cmd = l.r.calls.run(ctx, script, keys[:1], args...)
	}
	return cmd
}

// What release.lua found.
const (
	notOurs             = 0 // the key had expired or has another owner
	releasedAlone       = 1 // released, and no other registry waits
	releasedWhileWaited = 2 // released, and another registry waits for it
	granted             = 3 // passed to the registry that has waited longest
	waitedFor           = 4 // nothing done: another registry waits, and release.lua needs all its arguments
	// Below zero: passed on as granted, and this registry marked as
	// waiting (markNext); minus the grant's token.
)

// releaseRedis runs release.lua for a hold that handed out tokens up to
// handedOutToken locally (or 0), or for an attempt that may have taken
// the key; with a grant ('<token>:<lease ms>'), for a grant
// nobody here took (see giveBack). With markNext, a release that grants
// the key to another registry marks this one as waiting.
//
// release.lua gets the client id alone unless the registry expects the
// rest of its arguments to be needed: a local hand-off raised the token, a
// grant goes back, or the key looks contended. Four arguments fewer make an
// uncontended release about as cheap for Redis as the minimal owner-checked
// GET and DEL (BenchmarkServerTime). A release that finds a waiter without
// them changes nothing and is sent again with them, one more round trip
// the first time a key turns contended.
func (l *Lock) releaseRedis(ctx context.Context, handedOutToken int64, markNext bool, grant ...string) (int64, error) {
	r := l.r
	args := r.releaseArgs
	if handedOutToken != 0 || len(grant) > 0 || markNext || l.looksContended() {
		args = l.fullReleaseArgs(handedOutToken, markNext, grant)
	}
	for {
		r.stats.releaseCalls.Add(1)
		found, err := l.runScript(ctx, releaseScript, l.keys, args...).Int64()
		if err != nil {
			return notOurs, fmt.Errorf("%w: release %q: %w", ErrRedis, l.key, err)
		}
		if found != waitedFor {
			return found, nil
		}
		l.sawContention()
		args = l.fullReleaseArgs(handedOutToken, markNext, grant)
	}
}

func (l *Lock) fullReleaseArgs(handedOutToken int64, markNext bool, grant []string) []any {
	r := l.r
	args := []any{r.clientIDArg, handedOutToken, r.leaseArg, r.channelArg, l.key}
	switch {
	case len(grant) > 0:
		args = append(args, grant[0])
	case markNext:
		waiting := l.obtainArgs(true, true) // the mark a failed attempt leaves, and how long it lasts
		args = append(args, "", waiting[4], waiting[2])
	}
	return args
}

// yield waits, before the first Redis attempt, while this registry's last
// release of the key asked to leave it to another registry for a moment.
func (l *Lock) yield(ctx context.Context) error {
	until, ok := l.r.yields.LoadAndDelete(l.key)
	if !ok || !time.Now().Before(until) {
		return nil
	}
	t := time.NewTimer(time.Until(until))
	defer t.Stop()
	return waitFor(ctx, l.r.closed, t.C)
}

// abandon gives up an acquisition that holds the local mutex but not the
// Redis key, settling it in the background if a release is needed.
func (l *Lock) abandon(local *localLock, mayHoldKey bool) {
	if mayHoldKey && l.r.goBackground(func(ctx context.Context) { l.settle(ctx, local, true) }) {
		return
	}
	l.free(local)
}

// settle frees the local mutex of a given-up acquisition. If the attempt
// may have taken the Redis key, it deletes the key (owner-checked) first:
// freeing first would let the next local owner take the key (it carries the
// same client id) and then lose it to this release.
func (l *Lock) settle(ctx context.Context, local *localLock, mayHoldKey bool) {
	if mayHoldKey {
		ctx, cancel := context.WithTimeout(ctx, l.r.cfg.expireAfter)
		defer cancel()
		if _, err := l.releaseRedis(ctx, 0, false); err != nil {
			l.r.cfg.logger.Debug("lockreg: could not clear an abandoned attempt; its key expires after the lease", "key", l.key, "error", err)
		}
	}
	l.free(local)
}

// free releases the local mutex and the caller's place in the registry.
func (l *Lock) free(local *localLock) {
	local.unlock(handover{})
	l.r.locals.leave(l.key)
}

// notAcquired turns the reason an acquisition stopped into its error.
func (l *Lock) notAcquired(ctx context.Context, reason, lastErr error) error {
	switch {
	case reason == errBusy:
		return errBusy
	case errors.Is(reason, ErrClosed):
		return fmt.Errorf("%w: cannot lock %q", ErrClosed, l.key)
	default:
		return errors.Join(fmt.Errorf("%w: key %q: %w", ErrNotObtained, l.key, ctx.Err()), lastErr)
	}
}

// mayHaveRun reports whether a failed call may have run its script after
// all: a timeout, a cancelled context or a broken connection can come after
// Redis ran it. An error reply from Redis, or no connection to be had,
// means it did not.
func mayHaveRun(err error) bool {
	if err == nil || errors.Is(err, ErrNotReplicated) {
		return false
	}
	var reply redis.Error
	var netErr *net.OpError
	return !errors.As(err, &reply) && !errors.Is(err, redis.ErrPoolTimeout) &&
		!(errors.As(err, &netErr) && netErr.Op == "dial")
}
