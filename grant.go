package lockreg

import (
	"context"
	"sync"
	"time"

	"github.com/puzpuzpuz/xsync/v3"

	"github.com/lockreg/lockreg/internal/protocol"
)

// A grant passes a released key from one registry straight to another
// that waits for it, inside the release's script call, so that a hand-off
// between processes costs no acquisition call. For one waiting registry
// and key, the grant goes through these states (docs/PROTOCOL.md has the
// scripts' side):
//
//	unmarked ──failed attempt (obtain.lua), or a release of this
//	   │       registry with goroutines behind it (markNext)
//	   ▼
//	marked ───the acquisition ends (withdrawMark)──────────▶ withdrawn
//	   │   ───two retry intervals unrenewed─────────────────▶ lapsed
//	   │ another registry's release (release.lua): the key set to this
//	   │ registry's client id with the grant lease, a token drawn,
//	   ▼ 'g<token>:<client id>:<key>' published
//	granted ──its waiter takes it (takeGrant)──────────────▶ accepted
//	   │    ──nobody here waits, or a hold has the key──────▶ given back
//	   │      (giveBack: release.lua, owner- and token-checked)
//	   ▼
//	(a waiter that cannot trust it attempts: obtain.lua finds the key
//	its own, and takes it with a newer token)
//
// The trust rule. A grant answers a mark, which the call that set it
// (a failed attempt, or a release with markNext) reported with the key's
// last token then (the mark's token; obtain.lua stores one from the clock
// if none is stored). A grant whose token is larger came after that call,
// so after it was sent; its lease (the grant lease, from the mark) runs
// at least until then + the grant lease. Counted that way, the hold is as
// safe as one obtained by a call sent at the mark's sending, and its
// token keeps the fencing order. A grant that fails the rule only wakes
// the waiter, whose next attempt finds the key its own.
//
// A grant is made only to a registry that takes grants: one with pub/sub
// on (to hear them) and without WithWaitReplicas (a grant is not
// acknowledged by replicas). Its lease, grants.lease, is two retry
// intervals, at least 100ms: the grantee extends it to a full lease
// halfway through (extendLater), if it still holds the key then. An
// acquisition takes a grant in acquisition.takeGrant (acquire.go).

// waitMark is this registry's mark as waiting for a key, as the call that
// set it saw it: when the call was sent, and the key's last token then (0
// if unknown: no grant can be trusted against it). The zero waitMark is
// no mark.
type waitMark struct {
	sent  time.Time
	token int64
}

func (m waitMark) isSet() bool { return !m.sent.IsZero() }

// grants is a registry's side of the grants it takes.
type grants struct {
	lease time.Duration // the lease of a granted key, or 0 if the registry takes no grants
	// pending holds, by key, the calls on the key's state in Redis still
	// on their way that an acquisition's first attempt must not overtake:
	// withdrawals of this registry's mark, and give-backs. An attempt that
	// marks again would have its new mark withdrawn by the late call; a
	// plain SET NX that takes the key once a grant expired leaves the
	// grant's token the last, and would lose the key to a late give-back.
	pending *xsync.MapOf[string, *pendingCalls]
	// shortLeases tells the watchdog the end of a granted hold's lease,
	// which may come before its next tick (lapseTimer).
	shortLeases chan instant
}

func newGrants(lease time.Duration) grants {
	return grants{lease: lease, pending: xsync.NewMapOf[string, *pendingCalls](), shortLeases: make(chan instant, 16)}
}

// leaseEnds tells the watchdog that a granted hold's lease ends at end. A
// full queue drops it: the next tick finds that lease.
func (g *grants) leaseEnds(end instant) {
	select {
	case g.shortLeases <- end:
	default:
	}
}

// extendLater extends a granted hold's short lease to the registry's own
// halfway through what is left of it, if the hold, or a hold handed on
// from it, still has the key then. Most holds end sooner and need no
// extension, which would cost a round trip; a timer, rather than a
// goroutine per grant, waits for that moment, so that short holds leave
// nothing running behind them. It reports false, and extends nothing,
// once the registry is closing.
func (r *Registry) extendLater(local *localLock, h *Hold) bool {
	if r.closing() {
		return false
	}
	r.extendAt(local, h)
	return true
}

// extendAt is extendLater's timer. An extension that did not extend
// (Redis failed it), or that found a local hand-off under way, is tried
// again halfway through what is left then, until Close: the watchdog's
// next round may be a renewal interval away, far past the grant's lease,
// and a Shutdown waits for the hold, renewing it meanwhile.
func (r *Registry) extendAt(local *localLock, h *Hold) {
	left := time.Until(instant(h.tenure.leaseEnd.Load()).time())
	if left < minExtensionWait {
		return // too late to help: the grant's lease runs out
	}
	time.AfterFunc(left/2, func() {
		// Renewal stops at WithMaxHold, this extension too: the grant's
		// short lease then runs out, as the watchdog's renewal would let it.
		if r.cfg.maxHold > 0 && h.taken.since() >= r.cfg.maxHold || h.tenure.loss() != lossNone || r.life.stopCtx.Err() != nil {
			return
		}
		current := local.hold.Load()
		switch {
		case current == nil:
			// Between two holds of a local hand-off, or released: the key's
			// local state lives on only in the first case, or with a waiter
			// that takes the key anew (and then has a hold of its own).
			if still, ok := r.locals.m.Load(h.lock.key); ok && still == local {
				r.extendAt(local, h)
			}
		case current.tenure == h.tenure && !current.leaseOver():
			r.goBackground(func(ctx context.Context) {
				end := h.tenure.leaseEnd.Load()
				r.renew(ctx, [][]*Hold{{current}})
				if h.tenure.leaseEnd.Load() == end {
					r.extendAt(local, current)
				}
			})
		}
	})
}

// minExtensionWait is the least of a grant's lease worth extending: below
// it an extension's round trip would come too late.
const minExtensionWait = 2 * time.Millisecond

// withdrawMark withdraws, in the background, this registry's mark on the
// key, so that releases stop granting the key to this registry, which
// would only give it back. The caller owns the key's local mutex: the
// withdrawal is pending before the next owner can attempt, and that owner
// waits for it (awaitPending), as its attempt marks the registry again,
// with the same mark, which a withdrawal landing later would take away,
// and with it the wake-up and the place in the queue.
func (l *Lock) withdrawMark() {
	r := l.r
	finish := r.startPending(l.key)
	if !r.goBackground(func(ctx context.Context) {
		defer finish()
		calls := r.peer.Withdraw(l.keys())
		if r.countCallsAside(OpWithdraw, calls) == nil {
			protocol.RunPipeline(ctx, r.client, calls)
		}
		for _, c := range calls {
			if err := c.Cmd.Err(); err != nil {
				r.cfg.logger.Debug("lockreg: could not withdraw a waiting mark; it lapses by itself", "key", printedKey(l.key), "error", err)
				break
			}
		}
	}) {
		finish() // closed: the mark lapses by itself
	}
}

// receiveGrant acts on a grant of key to this registry: it wakes the
// acquisition that waits for the key with the token, or, if none waits
// (it was abandoned, or the mark outlived an earlier acquisition), gives the
// key back at once, so that it goes on to the next waiter instead of
// blocking everyone until the grant lease ends. So does a grant that
// finds the key held here: the holder's own attempt found the key granted
// and took it with a newer token, which the give-back spares; or the key
// went through another registry since the holder took it (its lease ran
// out, or Redis lost the key), and keeping the grant would hide that from
// the holder's renewals and release.
func (r *Registry) receiveGrant(key string, token int64) {
	// Pending before the look for a waiter, so that an acquisition of this
	// registry that comes after the look waits for the give-back before its
	// first attempt.
	finish := r.startPending(key)
	// The token is left for the waiter inside the map's lock of the key,
	// so that the last leave, which takes it too, finds it (leave gives it
	// back): left in a key's state that was dropped, it would block the
	// key for the grant lease.
	var waiter *localLock
	var holder *Hold
	r.locals.m.Compute(key, func(local *localLock, loaded bool) (*localLock, bool) {
		if loaded {
			if holder = local.hold.Load(); holder == nil {
				local.grantedToken.Store(token)
				waiter = local
			}
		}
		return local, !loaded
	})
	if waiter != nil {
		finish()
		waiter.wakeUp()
		return
	}
	r.giveBackLater(key, token, holder, finish)
}

// giveBackLater gives a grant of key back in the background; holder, if
// not nil, is the hold that was current as the grant landed (its release
// waits for the give-back); finish, if not nil, records the give-back done
// (see startPending).
func (r *Registry) giveBackLater(key string, token int64, holder *Hold, finish func()) {
	received := time.Now()
	if finish == nil {
		finish = r.startPending(key)
	}
	if !r.goBackground(func(ctx context.Context) {
		defer finish()
		r.giveBack(ctx, key, token, holder, received)
	}) {
		finish()
	}
}

// leave ends the caller's part in key's local state, giving back a grant
// that came for a waiter that is gone.
func (r *Registry) leave(key string) {
	if token := r.locals.leave(key); token != 0 {
		r.giveBackLater(key, token, nil, nil)
	}
	r.tellShutdown()
}

// giveBack releases a key granted to this registry that nobody here waited
// for, unless an acquisition of this registry has taken the key since and
// keeps it. One that began once the grant came waits for the give-back
// (receiveGrant makes it pending). For one under way, or a holder,
// release.lua checks that the key's last token is still the grant's (an
// attempt that found the key its own drew a newer one) and that its time
// to live is within the grant lease (a plain SET NX sets a full lease;
// with a lease as short as the grant's, that check cannot tell the two
// apart).
//
// A hold that predates the grant had its key pass through another owner
// (its lease ran out, or Redis lost the key) before the grant brought it
// back: it is broken, though the key is this registry's again. If its
// renewal extended the grant's lease before the give-back, the TTL check
// spares the key; the key's last token, still the grant's, then tells,
// and the hold is lost.
//
// A give-back that takes the key (it was the grant's still) takes it from
// holder too, which is lost at once: another registry may take the key.
// Either loss is named as a key found another's: by its lapse, or a
// forced unlock, where that came first.
//
// The hold judged is holder, the one current as the grant landed, if any:
// its release, which may have cleared the key's current hold meanwhile,
// waits for the give-back and reads the tenure's loss.
func (r *Registry) giveBack(ctx context.Context, key string, token int64, holder *Hold, received time.Time) {
	l := r.Obtain(key)
	ctx, cancel := context.WithTimeout(ctx, r.cfg.expireAfter)
	defer cancel()
	found, err := l.releaseRedisAside(ctx, protocol.Release{GiveBack: token})
	if err != nil {
		r.cfg.logger.Debug("lockreg: could not give a granted key back; it expires after its grant lease", "key", printedKey(key), "error", err)
		return
	}
	if found.Outcome != protocol.NotOurs {
		// The key went back: a hold current as the grant landed no longer
		// has it (its release waits for this give-back; a hand-off keeps
		// the tenure), and another registry may take it now.
		if holder != nil {
			r.changedBehindItsBack(holder, LossOverwritten, false, false)
		}
		return
	}
	h := holder
	if h == nil {
		local, ok := r.locals.m.Load(key)
		if !ok {
			return
		}
		h = local.hold.Load()
	}
	if h != nil && h.redisTaken.time().Before(received) && r.grantIsLast(ctx, l, token) {
		r.changedBehindItsBack(h, LossOverwritten, false, false)
	}
}

// grantIsLast reports whether l's key's last fencing token is still token,
// a grant's: nothing has drawn one since, as an attempt of this registry
// that found the key its own would have (so a grant's note that came late
// does not count).
func (r *Registry) grantIsLast(ctx context.Context, l *Lock, token int64) bool {
	last := r.peer.LastToken(l.keys())
	// In a pipeline: on Redis Cluster that reads the key's primary, where a
	// client that reads from replicas (ReadOnly) would read one that may lag.
	protocol.RunPipeline(ctx, r.client, []*protocol.Call{last})
	n, err := protocol.ReadToken(last.Cmd)
	return err == nil && n == token
}

// pendingCalls counts a key's pending calls (see grants.pending); done
// closes when the count drops to zero.
type pendingCalls struct {
	n    int
	done chan struct{}
}

// startPending records a call on key's state as pending; finish, which
// may be called more than once, records it done.
func (r *Registry) startPending(key string) (finish func()) {
	var p *pendingCalls
	r.grants.pending.Compute(key, func(calls *pendingCalls, loaded bool) (*pendingCalls, bool) {
		if !loaded {
			calls = &pendingCalls{done: make(chan struct{})}
		}
		calls.n++
		p = calls
		return calls, false
	})
	return sync.OnceFunc(func() {
		r.grants.pending.Compute(key, func(_ *pendingCalls, _ bool) (*pendingCalls, bool) {
			p.n--
			if p.n > 0 {
				return p, false
			}
			close(p.done)
			return p, true
		})
		r.tellShutdown()
	})
}

// settlePending waits, in a release, for the calls on the key's state
// that are pending, until ctx ends (its error): whether the registry
// closes or not, as each of them ends by Close.
func (l *Lock) settlePending(ctx context.Context) error {
	p, ok := l.r.grants.pending.Load(l.key)
	if !ok {
		return nil
	}
	return waitFor(ctx, nil, p.done)
}

// awaitPending waits, before an acquisition's first attempt, for the
// calls on the key's state that are pending.
func (l *Lock) awaitPending(ctx context.Context) error {
	p, ok := l.r.grants.pending.Load(l.key)
	if !ok {
		return nil
	}
	return waitFor(ctx, l.r.life.closing, p.done)
}
