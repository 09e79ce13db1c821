package lockreg

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockreg/lockreg/internal/protocol"
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
	r   *Registry
	key string
	// inRedis holds the key's names in Redis (keys), made when first
	// needed: a Lock whose goroutine only waits for the local mutex never
	// needs them, and each waiter obtains its own (#34: a waiting
	// goroutine's heap).
	inRedis atomic.Pointer[protocol.Keys]
}

// keys returns the key's names in Redis. Goroutines that race to make
// them make equal ones, so any may win.
func (l *Lock) keys() protocol.Keys {
	if k := l.inRedis.Load(); k != nil {
		return *k
	}
	k := l.r.peer.Keys(l.key)
	l.inRedis.Store(&k)
	return k
}

// Key returns the key the lock was obtained for.
func (l *Lock) Key() string { return l.key }

// Acquire waits until it holds the lock and returns the Hold, which any
// goroutine may release; or, when ctx ends first, an error matching both
// ErrNotObtained and ctx.Err() (joined with the last Redis error, if any).
// It fails with ErrClosed if the registry is or gets closed; with
// ErrServerEvicts on a server that may evict lock keys (see
// WithEvictionAllowed); and at once, with an error matching both
// ErrNotObtained and ErrRedis, if Redis refuses the attempt for good
// (WRONGTYPE, NOPERM, a closed client). It waits as LockContext does, but is not reentrant: a goroutine that holds the key
// (by any method) and calls Acquire waits for itself until ctx ends.
func (l *Lock) Acquire(ctx context.Context) (*Hold, error) {
	return l.acquireHold(ctx, true)
}

// Lock waits as long as it takes for the calling goroutine to hold the
// lock: it is the sync.Locker adapter; prefer Registry.Do or LockContext,
// which report errors. Redis errors while waiting are logged and retried.
// A goroutine that holds the lock locks again, even if its hold is lost:
// Lost and the outer Unlock tell it.
//
// If the registry is closed, or closes while Lock waits (Close, Shutdown),
// Lock, unless its goroutine holds the lock already (as above), can
// neither hold the lock nor report it: it logs an error and blocks the
// calling goroutine for good, so that no critical section runs unlocked
// and a shutdown is not turned into a crash by a panic. A
// process that waits for such a goroutine before it exits would wait for
// ever: goroutines that a shutdown waits for should use LockContext or Do.
func (l *Lock) Lock() {
	var told string // the refusal logged last
	for {
		err := l.LockContext(context.Background())
		if err == nil {
			return
		}
		if local := l.r.locals.ownedBy(l.key, goroutineID()); local != nil && (errors.Is(err, ErrLockLost) || errors.Is(err, ErrClosed)) {
			// The goroutine holds the lock already, and its hold is lost
			// (Close loses every hold): its outer section runs unprotected
			// as it is (Lost has told it, its Unlock will), and blocking it
			// for ever would turn a lost lock into a hang. Lock cannot
			// report, so it locks again.
			local.depth++
			return
		}
		switch {
		case errors.Is(err, ErrClosed):
			l.r.cfg.logger.Error("lockreg: Lock blocks for good: the registry is closed", "key", printedKey(l.key))
			parkForever()
		case errors.Is(err, ErrInvalidKey):
			panic(err)
		}
		// Redis refused the attempt for good (an ACL, a key of another
		// type): Lock cannot say so, but it can keep trying, and telling
		// once, as an acquisition does, not at every retry interval.
		if msg := err.Error(); msg != told {
			told = msg
			l.r.cfg.logger.Error("lockreg: Lock cannot take the key; retrying", "key", printedKey(l.key), "error", err)
		}
		time.Sleep(l.r.cfg.retryInterval)
	}
}

// parkForever blocks the calling goroutine for the rest of the process.
func parkForever() { select {} }

// TryLock makes one attempt, without waiting, and reports whether the
// calling goroutine now holds the lock. It fails if another goroutine or
// Hold of this registry holds or is acquiring the lock, another owner
// holds the Redis key, a release of this registry just left the key to
// another that waited (the yield, docs/PROTOCOL.md), Redis fails (logged),
// the registry is closed, or the calling goroutine holds the lock already
// but its hold is lost.
func (l *Lock) TryLock() bool {
	return l.acquire(context.Background(), false) == nil
}

// LockContext waits until the calling goroutine holds the lock, retrying
// Redis every retry interval, and returns nil; or, when ctx ends first, an
// error matching both ErrNotObtained and ctx.Err(), joined with the last
// attempt's Redis error if it failed (an attempt that ctx cut short counts
// only if no attempt ended before it). It fails as Acquire does otherwise
// (ErrClosed, ErrServerEvicts, a refusal matching ErrRedis); and, at once,
// with an error matching both ErrNotObtained and ErrLockLost if the
// calling goroutine holds the lock already but its hold is lost (as a
// nested Do does).
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
		l.r.cfg.logger.Warn("lockreg: unlock failed", "key", printedKey(l.key), "error", err)
	}
}

// UnlockContext releases one level of the caller's hold. The last one
// releases the lock as Hold.Release does, with the same errors and the
// same use of ctx. It returns ErrNotHeld, changing nothing, if the caller
// does not hold the lock.
func (l *Lock) UnlockContext(ctx context.Context) error {
	if ctx == nil {
		return errNilContext
	}
	local := l.r.locals.ownedBy(l.key, goroutineID())
	if local == nil {
		return fmt.Errorf("%w: key %q", ErrNotHeld, printedKey(l.key))
	}
	local.depth--
	if local.depth > 0 {
		return nil
	}
	local.owner.Store(0)
	return local.hold.Load().release(ctx)
}

// acquire takes the lock for the calling goroutine: again, if it holds it,
// even while a Shutdown waits for that goroutine's work, but not once the
// registry is closed (acquireHold refuses the rest).
func (l *Lock) acquire(ctx context.Context, wait bool) error {
	gid := goroutineID()
	if local := l.r.locals.ownedBy(l.key, gid); local != nil && ctx != nil && l.r.life.stopCtx.Err() == nil {
		if lost := local.hold.Load().lossNow(); lost != nil {
			// As a nested Do refuses: the section would run unprotected.
			return errors.Join(fmt.Errorf("%w: key %q: the goroutine's hold is lost", ErrNotObtained, printedKey(l.key)), lost)
		}
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

// Token returns the fencing token of the calling goroutine's hold, as
// Hold.Token does; an ErrNotHeld error if the caller holds nothing.
func (l *Lock) Token(ctx context.Context) (int64, error) {
	if ctx == nil {
		return 0, errNilContext
	}
	local := l.r.locals.ownedBy(l.key, goroutineID())
	if local == nil {
		return 0, fmt.Errorf("%w: key %q: lock it before asking for its token", ErrNotHeld, printedKey(l.key))
	}
	return local.hold.Load().Token(ctx)
}

// Lost returns the Lost channel of the calling goroutine's hold (see
// Hold.Lost). A goroutine that holds nothing, another goroutine than the
// owner included, gets a closed channel: to watch a hold from another
// goroutine, hold it with Acquire or Do.
func (l *Lock) Lost() <-chan struct{} {
	if local := l.r.locals.ownedBy(l.key, goroutineID()); local != nil {
		return local.hold.Load().Lost()
	}
	return closedSignal
}

// checkAcquisition refuses bad input, or a closed registry, at once.
func (l *Lock) checkAcquisition(ctx context.Context) error {
	switch {
	case l.key == "":
		return fmt.Errorf("%w: empty key", ErrInvalidKey)
	case ctx == nil:
		return errNilContext
	case l.r.closing():
		return fmt.Errorf("%w: cannot lock %q", ErrClosed, printedKey(l.key))
	}
	return nil
}
