package lockreg

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
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
	keys lockKeys // in Redis
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
// mutex came with a hold, and returns the new hold. It tells the hooks.
func (l *Lock) acquireHold(ctx context.Context, wait bool) (*Hold, error) {
	r := l.r
	if r.closing() {
		return nil, fmt.Errorf("%w: cannot lock %q", ErrClosed, l.key)
	}
	start := time.Now()
	hooks := r.hooks.all()
	for _, hk := range hooks {
		if hk.AcquireStart != nil {
			ctx = hk.AcquireStart(ctx, l.key)
		}
	}
	h, err := l.takeHold(ctx, wait, start)
	if hooks != nil {
		e := AcquireEvent{Key: l.key, Wait: time.Since(start), Outcome: OutcomeAcquired, Err: err}
		switch {
		case err == nil:
			e.Path = h.via.path()
		case errors.Is(err, ErrClosed):
			e.Outcome = OutcomeClosed
		case errors.Is(err, ErrNotObtained) || err == errBusy:
			e.Outcome = OutcomeNotObtained
		default:
			e.Outcome = OutcomeError
		}
		for _, hk := range hooks {
			if hk.AcquireDone != nil {
				hk.AcquireDone(ctx, e)
			}
		}
	}
	return h, err
}

// takeHold is acquireHold's work, begun at start.
func (l *Lock) takeHold(ctx context.Context, wait bool, start time.Time) (*Hold, error) {
	r := l.r
	r.publishSoon() // waiters are named to inspectors too
	local := r.locals.join(l.key)
	got, err := local.lock(ctx, r.life.closed, wait)
	if err != nil {
		r.locals.leave(l.key)
		return nil, l.notAcquired(ctx, err, nil)
	}
	h, handedOff := got.hold, got.hold != nil
	if !handedOff {
		if h, err = l.obtainRedis(ctx, wait, local, got.mark); err != nil {
			return nil, err
		}
		h.local = local
	}
	local.hold.Store(h)
	r.stats.acquired(time.Since(start), handedOff)
	// Close signals the holds it finds, after closing: a hold stored once
	// it looked would never be signalled, nor renewed. Such an
	// acquisition, which Close (or Shutdown) overtook, fails as the
	// waiting ones do, and gives the key back.
	if r.closing() {
		_, _ = h.releaseKey(context.WithoutCancel(ctx))
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
		cmd = l.r.calls.run(ctx, script, lockKeyOnly(keys), args...)
	}
	return cmd
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
