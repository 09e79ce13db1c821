package lockreg

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg/internal/redistest"
)

// TestAForcedUnlockInAnotherDatabaseTakesNoHold: pub/sub is not per
// database. A copy of a holder's lock key in another database of its
// server (a staging database restored from production's dump, say),
// forced open there, sends the holder a note that names it and its key:
// its hold, still its own in its database, is kept, and a later loss of
// it names its own cause, not "forced".
func TestAForcedUnlockInAnotherDatabaseTakesNoHold(t *testing.T) {
	t.Parallel() // servers of its own, and a second or two
	for _, tracking := range []bool{false, true} {
		t.Run(map[bool]string{false: "pub/sub", true: "tracking"}[tracking], func(t *testing.T) {
			ctx := context.Background()
			srv := redistest.Start(t)
			rules := []string{"+@all"}
			if !tracking {
				rules = append(rules, "-client")
			}
			client := aclClient(t, srv, rules...)
			r := newRegistry(t, client, WithRenewal(false), WithPubSub(!tracking))
			h, err := r.Obtain("k").Acquire(ctx)
			require.NoError(t, err)
			ready := func() bool { return r.notes.subscribed.Load() }
			if tracking {
				ready = r.trackingUp
			}
			require.Eventually(t, ready, 5*time.Second, time.Millisecond)

			other := redis.NewClient(&redis.Options{Addr: srv.Addr(), DB: 1})
			t.Cleanup(func() { _ = other.Close() })
			require.NoError(t, other.Set(ctx, h.redisKey(), r.OwnerID(), time.Minute).Err(), "the copy")
			staging, err := New(other, r.namespace, WithLogger(r.cfg.logger))
			require.NoError(t, err)
			t.Cleanup(func() { _ = staging.Close() })
			found, err := staging.ForceUnlock(ctx, "k")
			require.NoError(t, err)
			require.True(t, found)

			// The note comes, and has the key checked: a second is plenty.
			for end := time.Now().Add(time.Second); !h.wasForced() && time.Now().Before(end); {
				time.Sleep(time.Millisecond)
			}
			for end := time.Now().Add(time.Second); h.wasForced() && time.Now().Before(end); {
				time.Sleep(time.Millisecond)
			}
			require.NoError(t, h.Err(), "the hold keeps its key")
			require.NoError(t, srv.Client(t).Set(ctx, h.redisKey(), "intruder", 0).Err())
			err = h.Release(ctx)
			require.ErrorIs(t, err, ErrLockLost)
			require.NotContains(t, err.Error(), LossForced.explain(), "its key was not forced open")
		})
	}
}
