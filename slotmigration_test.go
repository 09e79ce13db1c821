package lockreg

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/redis/go-redis/v9"

	"github.com/lockreg/lockreg/internal/protocol"
	"github.com/lockreg/lockreg/internal/redistest"
)

// aheadOfTheClock stores a last token for lock far ahead of the server's
// clock, as a node whose clock runs ahead of the next one's leaves it: the
// next draws are then last + 1, and only the stored token keeps them from
// repeating one handed out.
func aheadOfTheClock(t *testing.T, client redis.UniversalClient, lock *Lock) int64 {
	t.Helper()
	ahead := time.Now().Add(24 * time.Hour).UnixMicro()
	require.NoError(t, client.Set(context.Background(), lock.keys().Fence(), strconv.FormatInt(ahead, 10), time.Minute).Err())
	return ahead
}

// handOffOnce takes lock, draws its token and hands the hold off locally
// to a second acquisition, which it returns with both tokens.
func handOffOnce(t *testing.T, lock *Lock) (*Hold, int64, int64) {
	t.Helper()
	ctx := context.Background()
	first, err := lock.Acquire(ctx)
	require.NoError(t, err)
	token := mustHoldToken(t, first)
	next := make(chan *Hold, 1)
	go func() {
		h, err := lock.Acquire(ctx)
		require.NoError(t, err)
		next <- h
	}()
	require.Eventually(t, func() bool {
		local, _ := lock.r.locals.m.Load(lock.key)
		return local != nil && local.waited()
	}, 5*time.Second, time.Millisecond)
	require.NoError(t, first.Release(ctx))
	second := <-next
	require.Equal(t, int64(1), lock.r.Stats().LocalHandoffs)
	return second, token, mustHoldToken(t, second)
}

// A release while the key's slot migrates runs on the lock's key alone,
// which cannot reach the fence: the tokens its hold handed out locally
// must still be stored before the key is freed, or the next hold, after
// the move, draws one of them again.
func TestAReleaseDuringASlotMigrationStoresTheTokensHandedOut(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	addrs := redistest.StartCluster(t, 3)
	client := clusterClient(t, addrs)
	r := newRegistry(t, client)
	lock := r.Obtain("migrating")
	aheadOfTheClock(t, client, lock)
	h, first, handedOut := handOffOnce(t, lock)
	require.Equal(t, first+1, handedOut)
	m := redistest.BeginSlotMigration(t, addrs, protocol.Slot(h.redisKey()))
	_, moved := m.MoveKey(t) // the lock or its fence moved: a split slot
	require.True(t, moved)
	require.NoError(t, h.Release(ctx))
	m.Finish(t)
	other := newRegistry(t, client).Obtain("migrating")
	next, err := other.Acquire(ctx)
	require.NoError(t, err)
	require.Greater(t, mustHoldToken(t, next), handedOut, "a token handed out is drawn again")
	require.NoError(t, next.Release(ctx))
}

// A forced unlock while the key's slot migrates runs on the lock's key
// alone: it must still raise the fence past the tokens the holder's
// registry handed out locally before it frees the key, or the next hold,
// after the move, draws one of them again while the forced holder, not
// yet told, may still use it.
func TestAForcedUnlockDuringASlotMigrationRaisesTheFence(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	addrs := redistest.StartCluster(t, 3)
	client := clusterClient(t, addrs)
	r := newRegistry(t, client)
	operator := newRegistry(t, client)
	lock := r.Obtain("migrating")
	aheadOfTheClock(t, client, lock)
	h, _, handedOut := handOffOnce(t, lock)
	m := redistest.BeginSlotMigration(t, addrs, protocol.Slot(h.redisKey()))
	_, moved := m.MoveKey(t) // the lock or its fence moved: a split slot
	require.True(t, moved)
	found, err := operator.ForceUnlock(ctx, "migrating")
	require.NoError(t, err)
	require.True(t, found)
	m.Finish(t)
	next, err := operator.Obtain("migrating").Acquire(ctx)
	require.NoError(t, err)
	require.Greater(t, mustHoldToken(t, next), handedOut, "a token handed out is drawn again")
	require.NoError(t, next.Release(ctx))
	requireFires(t, h.Lost(), 5*time.Second, "the holder heard")
	require.ErrorIs(t, h.Release(ctx), ErrLockLost)
}
