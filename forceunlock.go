package lockreg

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/lockreg/lockreg/internal/protocol"
)

// forcedFenceTTL is the least time to live of a fence ForceUnlock raised:
// far longer than the clock takes to pass it (a millisecond at most).
const forcedFenceTTL = 2 * time.Second

// ForceUnlock deletes key's lock whoever holds it, and reports whether
// anyone did: the way out when a holder is stuck, or dead and its lease
// long. Use it only when the holder must not go on: its critical section
// may still be running.
//
// It keeps fencing sound: it raises the key's last token past every token
// handed out, those a holder hands off locally without Redis included
// (WithLocalHandoff bounds a run of them), so that the next holder's
// token is above the old holder's. It wakes the key's waiters, as a
// release does. It tells the holder's registry, which signals the hold
// lost at once where it tracks its keys (the default), else by pub/sub
// within about a second, or at its next renewal with pub/sub off (a hold
// of this very registry hears at once, whatever its options); the
// holder's release then returns ErrLockLost and leaves the next
// owner's key alone. It logs a warning naming the key and the previous
// owner.
//
// An empty key is an ErrInvalidKey error; a Redis failure, an ACL that
// forbids EVALSHA among them, an ErrRedis error. It works on a closed
// registry too.
func (r *Registry) ForceUnlock(ctx context.Context, key string) (bool, error) {
	if err := checkForceUnlock(ctx, key, "ForceUnlock"); err != nil {
		return false, err
	}
	return r.forceUnlock(ctx, key, "")
}

// ForceUnlockHeldBy is ForceUnlock, but only if the registry of client id
// ownerID (LockInfo.OwnerID) holds key: it reports false, changing
// nothing, if the key is free or another registry holds it. An operator
// who decided from what Inspect showed so never forces open another
// registry's hold that took the key since; a hold of the same registry
// that did (its next job on the key, a local hand-off) is forced open, as
// the client id names a registry, not a hold. An empty ownerID is an
// ErrInvalidArgument error.
func (r *Registry) ForceUnlockHeldBy(ctx context.Context, key, ownerID string) (bool, error) {
	if err := checkForceUnlock(ctx, key, "ForceUnlockHeldBy"); err != nil {
		return false, err
	}
	if ownerID == "" {
		return false, fmt.Errorf("%w: ForceUnlockHeldBy with an empty owner id", ErrInvalidArgument)
	}
	return r.forceUnlock(ctx, key, ownerID)
}

// checkForceUnlock refuses a forced unlock's key, then its context, in
// the order every call checks them (Do: the key, the context, then the
// rest), so that the same bad call gets the same error from each.
func checkForceUnlock(ctx context.Context, key, call string) error {
	if key == "" {
		return fmt.Errorf("%w: %s with an empty key", ErrInvalidKey, call)
	}
	if ctx == nil {
		return errNilContext
	}
	return nil
}

// forceUnlock forces key open if only holds it, or whoever does if only
// is "".
func (r *Registry) forceUnlock(ctx context.Context, key, only string) (bool, error) {
	l := r.Obtain(key)
	fence := func() protocol.Call { return r.peer.ForceUnlockFence(l.keys(), maxHandoffs, forcedFenceTTL) }
	r.forcing.begin(key)
	holder, held, err := protocol.ReadForceUnlock(l.runScript(ctx, r.peer.ForceUnlock(l.keys(), key, maxHandoffs, forcedFenceTTL, only), fence))
	r.forcing.end(key)
	switch {
	case err != nil:
		return false, fmt.Errorf("%w: force %q open: %w", ErrRedis, printedKey(key), l.cutKeys(err))
	case !held:
		return false, nil
	}
	if holder == r.clientID {
		// Its own hold: no need to wait for Redis to tell it (with pub/sub
		// and tracking off, nothing would before the lease ran out). This
		// comes after the reply; a loss found before it was named by
		// r.forcing.
		r.receiveForced(key)
	}
	owners, _ := protocol.ReadOwners(ctx, r.client, r.namespace, []string{holder}) // the warning goes out all the same
	// The owner's name is what its registry wrote (WithOwner), of any
	// length: cut as a key is.
	r.cfg.logger.Warn("lockreg: lock forced open", "key", printedKey(key), "owner", printedKey(owners[holder].Name), "owner_id", holder)
	return true, nil
}

// receiveForced acts on news that a hold of this registry on key was
// forced open: once Redis confirms that the key is not this registry's,
// the hold is signalled lost. The hold is marked first, so that the
// invalidation of its key, which may be read before the confirmation,
// names the same cause. A hold that took the key since keeps it, and
// loses the mark (spareForced): the news, late (a copy on the second
// channel, the reply of this registry's own ForceUnlock), was of an
// earlier hold, and a later loss of this one has a cause of its own.
func (r *Registry) receiveForced(key string) {
	local, ok := r.locals.m.Load(key)
	if !ok {
		return
	}
	h := local.hold.Load()
	if h == nil {
		return
	}
	h.mu.Lock()
	h.forced = true
	h.mu.Unlock()
	r.verify(h, LossForced)
}

// spareForced withdraws the mark of receiveForced from h, whose key a
// read for a forced unlock's news, sent after the news came, found still
// this registry's: the forced unlock's DEL came before its news, so h
// took the key after it.
func spareForced(h *Hold, cause LossCause) {
	if cause != LossForced {
		return
	}
	h.mu.Lock()
	h.forced = false
	h.mu.Unlock()
}

// ownForces counts, per key, the registry's own forced unlocks in flight.
// Its tracker can find a key it holds gone before such a call's reply
// comes back: the DEL's invalidation, or the arming read of a hold just
// taken, races the reply, and with pub/sub off no note of the forced
// unlock comes first. A key found gone meanwhile is taken to be forced
// open by the call (changedBehindItsBack); a deletion by anything else in
// the same round trip would be named forced too.
type ownForces struct {
	mu   sync.Mutex
	keys map[string]int
}

func (f *ownForces) begin(key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.keys == nil {
		f.keys = make(map[string]int)
	}
	f.keys[key]++
}

func (f *ownForces) end(key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.keys[key]--; f.keys[key] == 0 {
		delete(f.keys, key)
	}
}

func (f *ownForces) inFlight(key string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.keys[key] > 0
}
