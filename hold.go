package lockreg

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/lockreg/lockreg/internal/protocol"
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
	taken instant // when this hold began (for WithMaxHold)
	// redisTaken is when the registry took the key in Redis; handoffs
	// counts the local hand-offs since. Both bound the run of hand-offs.
	redisTaken instant
	handoffs   int
	// tenure is the registry's holding of the key in Redis that this hold
	// is part of: holds handed on locally share it with the hold they came
	// from, as they share its Redis key (tenure.go).
	tenure *tenure

	// drawMu serializes token draws, so that a hold never has two tokens;
	// it is held across the draw's round trip, which is why mu is apart.
	drawMu sync.Mutex
	mu     sync.Mutex // guards what follows: short sections only
	token  int64      // the fencing token, 0 until drawn (see Token)
	// lostErr is the error a lost hold reports, made once at loss, so that
	// Do can tell it apart from the same news arriving by fn's error.
	lostErr error
	// onLoss, if set, is told of the loss (Do cancels fn's context).
	onLoss func(error)
	// lost and done are made when Lost and Done are first called: lost is
	// closed once the hold may be lost (lose), done once it ended
	// (released or lost).
	lost, done chan struct{}
	// shutDown is closed once the release Shutdown made of the key (see
	// keyReleased) is done, and the hold's error says what it found.
	shutDown chan struct{}

	// The bytes, side by side so that a Hold keeps to its size class (it is
	// allocated on every fresh acquisition): via, how it was taken, set
	// once; the rest guarded by mu.
	via   pathIndex
	cause LossCause // why the hold may be lost; lossNone while it is not
	// forced says that an operator forced the key open (ForceUnlock): a
	// loss found meanwhile names that cause.
	forced bool
	// released says that Release (or the last Unlock) has begun: a hold
	// is released once. keyReleased says that Shutdown released its key
	// in Redis already, so the owner's Release only unlocks it locally.
	// over says that the hold ended, and how is known (Done, Err): it was
	// lost, or its release is done.
	released, keyReleased, over bool
	// unclaimed says that no acquisition has returned the hold yet (see
	// claim); untold, that it was lost meanwhile and the hooks were not
	// told.
	unclaimed, untold bool
}

func newHold(l *Lock, token int64, sent time.Time, lease time.Duration) *Hold {
	h := &Hold{lock: l, via: viaRedis, token: token, taken: instantOf(sent), tenure: new(tenure), unclaimed: true}
	h.redisTaken = h.taken
	h.tenure.leaseEnd.Store(int64(instantOf(sent.Add(lease))))
	return h
}

// An instant is a monotonic reading of the clock, in ns since clockStart:
// a hold keeps its instants so, in 8 bytes where a time.Time takes 24,
// which keeps a held lock's Hold in a smaller size class.
type instant int64

var clockStart = time.Now()

func nowInstant() instant              { return instantOf(time.Now()) }
func instantOf(t time.Time) instant    { return instant(t.Sub(clockStart)) }
func (i instant) since() time.Duration { return time.Since(i.time()) }
func (i instant) time() time.Time      { return clockStart.Add(time.Duration(i)) }

// A nil *Hold, which HoldFor returns outside a Do of its key, holds
// nothing: its Release, Token and Err say ErrNotHeld, its Lost and Done
// channels are closed, and its Key is "", so that a misplaced
// HoldFor(ctx, key).Token(ctx) is an error, not a panic.
var errNoHold = fmt.Errorf("%w: no hold (HoldFor outside a Do of the key)", ErrNotHeld)

// Key returns the key the hold's lock was obtained for.
func (h *Hold) Key() string {
	if h == nil {
		return ""
	}
	return h.lock.key
}

// redisKey is the hold's key in Redis.
func (h *Hold) redisKey() string { return h.lock.keys().Lock() }

// Lost returns a channel that is closed when the hold may have been lost:
// renewal found the Redis key gone or owned by someone else, Redis came
// back from a restart or failover without it, an operator forced it open
// (ForceUnlock), the lease ran out unrenewed (renewal off, past
// WithMaxHold, Redis unreachable), or the registry closed. Where the
// registry tracks its keys (the default), it fires within a round trip or
// two of a change of the key (a DEL, an overwrite, a flush, an eviction)
// and of Redis answering again after a restart or failover; without
// tracking, within one renewal interval (expireAfter/3). A lease that
// runs out unrenewed closes it at its end. It is closed already when the
// acquisition's reply came a lease or more after it was sent. Stop the
// protected work when it fires; Release then reports ErrLockLost.
//
// Release does not close it: a goroutine that watches it should also
// watch for the end of the work (Do does both for you), or watch Done.
// The channel is made when Lost is first called.
func (h *Hold) Lost() <-chan struct{} {
	if h == nil {
		return closedSignal
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lost == nil {
		if h.cause != lossNone {
			return closedSignal
		}
		h.lost = make(chan struct{})
	}
	return h.lost
}

// Done returns a channel that is closed when the hold ends, for any
// reason: its Release (or its hand-off to the next local holder), a loss
// (see Lost), Close or Shutdown. A goroutine that watches a hold watches
// Done, and so ends with it; Err then says how the hold ended. Done costs
// nothing until it is called.
func (h *Hold) Done() <-chan struct{} {
	if h == nil {
		return closedSignal
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.done == nil {
		h.done = make(chan struct{})
		if h.over {
			close(h.done)
		}
	}
	return h.done
}

// Err is nil while the hold is held, its release until that is done
// included. Once it ended it says how: an error wrapping ErrLockLost,
// naming the cause, if it was lost (before its release or as the release
// found), else ErrNotHeld after its release.
func (h *Hold) Err() error {
	if h == nil {
		return errNoHold
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.lostErr != nil:
		return h.lostErr
	case h.over:
		return ErrNotHeld
	}
	return nil
}

// ended closes Done's channel, if made, as the hold ends: it was lost, or
// its release is done, so that Err says how; h.mu is held.
func (h *Hold) ended() {
	if h.over {
		return
	}
	h.over = true
	if h.done != nil {
		close(h.done)
	}
}

// Release releases the hold: it passes the key to a goroutine of this
// registry that waits for it, within the WithLocalHandoff bounds, or
// deletes the Redis key if this registry still owns it (owner-checked: a
// key another owner took since is left alone). Either way the lock is
// unlocked locally.
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
// ReadTimeout and WriteTimeout), and a local hand-off's wait for the read
// that confirms it (an ErrRedis error if ctx ends first). A ctx that has
// ended already does not stop the release: it then runs bounded by the
// lease, after which the key would have expired anyway, so a cancelled
// request context never leaves a key held.
func (h *Hold) Release(ctx context.Context) error {
	switch {
	case ctx == nil:
		return errNilContext
	case h == nil:
		return errNoHold
	}
	return h.release(ctx)
}

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
// stop the protected work; and an ErrRedis error if Redis failed, or the
// key's slot is moving between Redis Cluster nodes, when no token can be
// drawn that is sure to rise (the hold is unchanged: call again). Like Release, it is bounded by ctx only
// as far as the client honours it.
func (h *Hold) Token(ctx context.Context) (int64, error) {
	switch {
	case ctx == nil:
		return 0, errNilContext
	case h == nil:
		return 0, errNoHold
	}
	h.drawMu.Lock()
	defer h.drawMu.Unlock()
	token, err := h.usableToken()
	if err != nil || token != 0 {
		return token, err
	}
	l := h.lock
	l.r.countCalls(OpToken, 1)
	token, err = protocol.ReadToken(l.runScript(ctx, l.r.peer.DrawToken(l.keys()), nil))
	if gone := err == nil && token == 0; gone || protocol.WrongType(err) {
		// The key is gone, or of another type (the owner check met it), no
		// registry's: the hold is lost, named as a renewal names it (its
		// lapse or a forced unlock first); drawing again would fail alike.
		l.r.changedBehindItsBack(h, LossDeleted, gone, false)
		if err := h.lossNow(); err != nil {
			return 0, err
		}
		// A hold released while the draw ran is not lost, its release
		// deleted the key: it ended.
		return 0, errReleasedWhileDrawn(l.key)
	}
	if err != nil {
		return 0, fmt.Errorf("%w: draw the token of %q: %w", ErrRedis, printedKey(l.key), l.cutKeys(err))
	}
	// A reply after the lease found the key the registry's, but it may
	// have lapsed and come back since (a grant): it carries no hold on.
	if err := h.lossNow(); err != nil {
		return 0, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.released {
		// Released while the draw ran: the next holder draws its own.
		return 0, errReleasedWhileDrawn(l.key)
	}
	h.token = token
	return token, nil
}

func errReleasedWhileDrawn(key string) error {
	return fmt.Errorf("%w: key %q: released while its token was drawn", ErrNotHeld, printedKey(key))
}

// usableToken returns the hold's token, or 0 if it has none yet, or why
// it cannot have one.
func (h *Hold) usableToken() (int64, error) {
	h.mu.Lock()
	switch {
	case h.released:
		h.mu.Unlock()
		return 0, fmt.Errorf("%w: key %q: the hold was released", ErrNotHeld, printedKey(h.lock.key))
	case h.cause != lossNone:
		h.mu.Unlock()
		return 0, h.lostErr
	}
	token := h.token
	h.mu.Unlock()
	// A lease that ran out (or a tenure a loss struck) before the
	// watchdog's tick signals it is signalled now, naming its cause
	// (lossNow): else Token would call the hold lost, as expired, while
	// Lost stayed open and Err, then Release, named another cause (past
	// WithMaxHold, say).
	if err := h.lossNow(); err != nil {
		return 0, err
	}
	return token, nil
}

// wasReleased reports whether h's Release ran: a hold fn released early
// through HoldFor protects no nested call.
func (h *Hold) wasReleased() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.released
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
