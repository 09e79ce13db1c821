package lockreg

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
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
// release does. It tells the holder's registry, which, with pub/sub on,
// signals the hold lost within about a second (else at its next renewal);
// the holder's release then returns ErrLockLost and leaves the next
// owner's key alone. It logs a warning naming the key and the previous
// owner.
//
// An empty key is an ErrInvalidKey error; a Redis failure, an ACL that
// forbids EVALSHA among them, an ErrRedis error. It works on a closed
// registry too.
func (r *Registry) ForceUnlock(ctx context.Context, key string) (bool, error) {
	if key == "" {
		return false, fmt.Errorf("%w: ForceUnlock with an empty key", ErrInvalidKey)
	}
	l := r.Obtain(key)
	args := forceUnlockArgs(releaseChannel(r.registryKey), key, maxHandoffs, forcedFenceTTL)
	holder, err := l.runScript(ctx, forceUnlockScript, lockAndFence(l.keys), args...).Text()
	switch {
	case errors.Is(err, redis.Nil):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("%w: force %q open: %w", ErrRedis, key, err)
	}
	names, err := r.ownerNames(ctx, []string{holder})
	if err != nil {
		names = map[string]string{} // the warning goes out all the same
	}
	r.cfg.logger.Warn("lockreg: lock forced open", "key", key, "owner", names[holder], "owner_id", holder)
	return true, nil
}

// receiveForced acts on news that a hold of this registry on key was
// forced open: once Redis confirms that the key is not this registry's,
// the hold is signalled lost. (A hold that took the key since keeps it.)
func (r *Registry) receiveForced(key string) {
	local, ok := r.locals.m.Load(key)
	if !ok {
		return
	}
	h := local.hold.Load()
	if h == nil {
		return
	}
	r.goBackground(func(ctx context.Context) {
		r.called(OpCheck, 1)
		owner, err := r.client.Get(ctx, h.redisKey()).Result()
		switch {
		case err == nil && owner == r.clientID:
		case err == nil || errors.Is(err, redis.Nil):
			h.endLease(LossForced)
		default:
			r.cfg.logger.Debug("lockreg: could not check a key forced open; the renewal will", "key", key, "error", err)
		}
	})
}
