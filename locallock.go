package lockreg

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/petermattis/goid"
	"github.com/puzpuzpuz/xsync/v3"
)

// errBusy is TryLock's answer when the lock is held: by another hold of
// this registry, or another registry. Hooks see it (AcquireEvent.Err), so
// it wraps ErrNotObtained, as every error lockreg hands out wraps a sentinel.
var errBusy = fmt.Errorf("%w: held", ErrNotObtained)

// localLock is the in-process side of one key: a mutex owned by a hold,
// which waiters can abandon when their context ends. Only the owner talks
// to Redis for the key, so in-process contention costs no Redis traffic.
// Waiters are served in arrival order, and an unlock passes the mutex
// straight to the longest waiter, so nobody can barge in. A hold of Lock
// or LockContext also names its goroutine, which may lock again, at no
// cost (owner, depth).
type localLock struct {
	mu sync.Mutex
	// queue holds the channels of the acquisitions waiting for the mutex,
	// oldest first: each receives the mutex through its own, with what
	// the unlock hands off, or refusedHandoff once the registry refuses
	// acquisitions.
	queue []chan *handoff
	// owner is the goroutine id of a goroutine-owned hold, 0 while there
	// is none (a Hold value owns the mutex, or nothing does).
	owner atomic.Int64
	// hold is the current hold while the key is held in Redis; the
	// watchdog reads it to renew the lease.
	hold atomic.Pointer[Hold]
	// wake carries release notifications to the acquisition taking the key
	// in Redis (one per registry and key, as it owns the mutex). Guarded by
	// mu: the acquisition sets it as it begins and drops it as it ends, so
	// that a held key keeps none.
	wake *wakeup
	// grantedToken is the token of a grant (grant.go) that came with the
	// last wake, or 0.
	grantedToken atomic.Int64
	// The 4-byte fields close the struct, side by side, so that a
	// localLock, which the registry keeps for every key held, fits in 80
	// bytes.
	//
	// depth counts the owner goroutine's unmatched locks. Only it touches
	// depth; the hand-off through mu orders one owner's writes before the
	// next's.
	depth int32
	// refs counts the holds and acquisitions of the key. It is changed
	// only inside localLocks' Compute calls, which serialize per key.
	refs int32
	// unchecked counts the changes of the key that tracking (tracking.go)
	// has not checked yet: while one is, the key may have changed behind
	// the holder's back, and a release goes to Redis, whose owner check
	// tells the releasing hold, rather than hand the key off unseen.
	unchecked atomic.Int32
	locked    bool // a hold owns the mutex, or an acquisition takes the key in Redis
}

// handoff is what an unlock passes to the next owner of the mutex: the
// Redis hold it inherits (a local hand-off), or nil if it must take the
// key in Redis itself; then mark, if set, is the waiting mark its release
// left for it.
type handoff struct {
	hold *Hold
	mark waitMark
}

// copyOf moves next to the heap, for a waiter's channel: made by hand
// only as the mutex passes, since taking next's address would move every
// unlock's argument there.
func copyOf(next handoff) *handoff {
	p := new(handoff)
	*p = next
	return p
}

// refusedHandoff tells a waiter that the registry refuses acquisitions
// (refuseWaiters); the mutex stays with its owner.
var refusedHandoff = new(handoff)

// lock takes the mutex, waiting unless wait is false (then errBusy), until
// ctx ends (ctx.Err()) or the registry refuses acquisitions (ErrClosed:
// closing is closed). It returns what was handed off with the mutex, if
// anything.
//
// A waiter selects on its channel and ctx only: Close and Shutdown hand
// every queued waiter refusedHandoff (refuseWaiters) rather than have each
// also wait on closing, as every case of a select keeps a sudog of about
// 100 bytes for as long as it waits (#34: a waiting goroutine's heap).
func (l *localLock) lock(ctx context.Context, closing <-chan struct{}, wait bool) (handoff, error) {
	l.mu.Lock()
	if !l.locked {
		l.locked = true
		l.mu.Unlock()
		return handoff{}, nil
	}
	if !wait {
		l.mu.Unlock()
		return handoff{}, errBusy
	}
	// refuseWaiters closes closing before it takes mu to empty the queue:
	// a waiter that queues after that finds closing closed here.
	if isClosed(closing) {
		l.mu.Unlock()
		return handoff{}, ErrClosed
	}
	// One slot of buffer lets an unlock pass the mutex without waiting
	// for the waiter; a pointer keeps the slot, and the channel, small.
	passed := make(chan *handoff, 1)
	l.queue = append(l.queue, passed)
	l.mu.Unlock()

	select {
	case got := <-passed:
		return got.taken()
	case <-ctx.Done():
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if i := slices.Index(l.queue, passed); i >= 0 {
		l.queue = slices.Delete(l.queue, i, i+1)
		return handoff{}, ctx.Err()
	}
	// The mutex was passed to us as we left: it is ours after all.
	return (<-passed).taken()
}

// taken is what a waiter makes of what it received: the mutex, with what
// came with it, or ErrClosed.
func (h *handoff) taken() (handoff, error) {
	if h == refusedHandoff {
		return handoff{}, ErrClosed
	}
	return *h, nil
}

// refuseWaiters ends every wait for the mutex with ErrClosed, once the
// registry's closing is closed.
func (l *localLock) refuseWaiters() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, passed := range l.queue {
		passed <- refusedHandoff
	}
	l.queue = nil
}

// wakeup is how release notifications reach an acquisition taking the key
// in Redis. Its channel is made when the acquisition first waits: most
// acquisitions never do, and a channel per acquisition would cost an
// uncontended cycle an allocation. A notification that comes before it is
// remembered (early), and waits in the channel once it is made. Guarded by
// the localLock's mu.
type wakeup struct {
	ch    chan struct{}
	early bool
}

// wakeUp tells the goroutine acquiring the key in Redis, if any, to try
// again now.
func (l *localLock) wakeUp() {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch w := l.wake; {
	case w == nil: // nobody to wake
	case w.ch == nil:
		w.early = true
	default:
		select {
		case w.ch <- struct{}{}:
		default: // already woken
		}
	}
}

// acquiring makes w the wake-up of the acquisition that takes the key in
// Redis, with no notification in it: one from before says nothing new.
// acquired takes it back.
func (l *localLock) acquiring(w *wakeup) {
	l.mu.Lock()
	*w = wakeup{}
	l.wake = w
	l.mu.Unlock()
}

func (l *localLock) acquired(w *wakeup) {
	l.mu.Lock()
	if l.wake == w { // the next acquisition may have begun already
		l.wake = nil
	}
	l.mu.Unlock()
}

// wakeChannel is the channel of w (the acquisition's wake-up, which it
// waits on), made at the first call.
func (l *localLock) wakeChannel(w *wakeup) <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if w.ch == nil {
		w.ch = make(chan struct{}, 1)
		if w.early {
			w.ch <- struct{}{}
		}
	}
	return w.ch
}

// waited reports whether some goroutine waits for the mutex.
func (l *localLock) waited() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.queue) > 0
}

// unlock passes the mutex, with next, to the longest waiter and reports
// true; with nobody waiting it unlocks the mutex, unless next has a hold or
// a mark to hand off, in which case the caller keeps the mutex (and must
// release the hold, or withdraw the mark, itself).
func (l *localLock) unlock(next handoff) (handedOff bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.queue) > 0 {
		passed := l.queue[0]
		if next.hold != nil {
			// The hold handed off is current from now on: no instant
			// without one, in which a grant would seem to be for a waiter.
			l.hold.Store(next.hold)
		}
		l.queue[0] = nil
		l.queue = l.queue[1:]
		passed <- copyOf(next)
		return true
	}
	if next.hold == nil && !next.mark.isSet() {
		l.locked = false
	}
	return false
}

// unlockLocal unlocks the local mutex, with nothing to hand off, and ends
// the caller's part in the key's local state.
func (l *Lock) unlockLocal(local *localLock) {
	local.unlock(handoff{})
	l.r.leave(l.key)
}

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
			l = new(localLock)
		}
		l.refs++
		return l, false
	})
	return l
}

// leave undoes one join, dropping the key's state when nobody is left. A
// grant that came for a waiter that left meanwhile (receiveGrant) is
// returned, to be given back.
func (ls localLocks) leave(key string) (orphanedGrant int64) {
	ls.m.Compute(key, func(l *localLock, loaded bool) (*localLock, bool) {
		l.refs--
		if l.refs == 0 {
			orphanedGrant = l.grantedToken.Swap(0)
		}
		return l, l.refs == 0
	})
	return orphanedGrant
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
