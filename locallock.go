package lockreg

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/petermattis/goid"
	"github.com/puzpuzpuz/xsync/v3"
)

// errBusy is TryLock's answer when another goroutine holds the local mutex.
var errBusy = errors.New("lockreg: held by another goroutine")

// localLock is the in-process side of one key: a reentrant mutex owned by a
// goroutine, which waiters can abandon when their context ends. Only the
// owner talks to Redis for the key, so in-process contention and reentrancy
// cost no Redis traffic.
type localLock struct {
	// sem holds a token while some goroutine owns the key or is acquiring it
	// in Redis. Blocked senders are served in arrival order.
	sem chan struct{}
	// owner is the goroutine id of the holder, 0 while none holds the key
	// (also while the next owner is still acquiring it in Redis).
	owner atomic.Int64
	// depth counts the owner's unmatched locks. Only the owner touches it;
	// the hand-over through sem orders one owner's writes before the next's.
	depth int
	// hold is the current acquisition while some goroutine owns the key in
	// Redis; the watchdog reads it to renew the lease.
	hold atomic.Pointer[hold]
	// refs counts goroutines that hold or wait for the key. It is changed
	// only inside localLocks' Compute calls, which serialize per key.
	refs int
}

// lock takes the mutex, waiting unless wait is false (then errBusy), until
// ctx ends (ctx.Err()) or closed is closed (ErrClosed).
func (l *localLock) lock(ctx context.Context, closed <-chan struct{}, wait bool) error {
	select {
	case l.sem <- struct{}{}:
		return nil
	default:
	}
	if !wait {
		return errBusy
	}
	select {
	case l.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-closed:
		return ErrClosed
	}
}

func (l *localLock) unlock() { <-l.sem }

// localLocks holds the localLock of every key some goroutine holds or waits
// for, and drops it when the last one leaves, so memory follows the keys in
// use, not the keys ever seen. Join and leave are atomic per key: one key
// never has two localLocks, however joins and leaves interleave.
type localLocks struct {
	m *xsync.MapOf[string, *localLock]
}

func newLocalLocks() localLocks {
	return localLocks{m: xsync.NewMapOf[string, *localLock]()}
}

// join registers the calling goroutine as a holder or waiter of key.
func (ls localLocks) join(key string) *localLock {
	l, _ := ls.m.Compute(key, func(l *localLock, loaded bool) (*localLock, bool) {
		if !loaded {
			l = &localLock{sem: make(chan struct{}, 1)}
		}
		l.refs++
		return l, false
	})
	return l
}

// leave undoes one join, dropping the key's state when nobody is left.
func (ls localLocks) leave(key string) {
	ls.m.Compute(key, func(l *localLock, loaded bool) (*localLock, bool) {
		l.refs--
		return l, l.refs == 0
	})
}

// ownedBy returns key's localLock if goroutine gid owns it, else nil.
func (ls localLocks) ownedBy(key string, gid int64) *localLock {
	if l, ok := ls.m.Load(key); ok && l.owner.Load() == gid {
		return l
	}
	return nil
}

// size is the number of keys held or waited for.
func (ls localLocks) size() int { return ls.m.Size() }

// goroutineID identifies the calling goroutine. It reads the runtime's g
// struct (a few ns) rather than parsing runtime.Stack (about 2µs), which
// keeps reentrant re-locking far below a Redis round trip.
func goroutineID() int64 { return goid.Get() }
