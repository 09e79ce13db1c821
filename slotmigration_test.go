package lockreg

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
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

// splits are the ways a test splits a slot while it migrates: nothing
// moved yet (the marker and the queue, which do not exist, split it
// already), the lock key moved, or its fence.
var splits = []string{"nothing", "lock", "fence"}

// beginSplit marks lock's slot migrating and moves the key split names.
func beginSplit(t *testing.T, addrs []string, lock *Lock, split string) *redistest.SlotMigration {
	t.Helper()
	m := redistest.BeginSlotMigration(t, addrs, protocol.Slot(lock.keys().Lock()))
	switch split {
	case "lock":
		m.MoveThisKey(t, lock.keys().Lock())
	case "fence":
		m.MoveThisKey(t, lock.keys().Fence())
	}
	return m
}

// handOffUnhurried lets a hold be handed off locally however long the
// tenure has lasted: handOffOnce's hand-off must not depend on how soon a
// loaded machine gets through the tenure's first hold.
var handOffUnhurried = WithLocalHandoff(16, time.Hour)

// handOffOnce takes lock, draws its token and hands the hold off locally
// to a second acquisition, which it returns with both tokens.
func handOffOnce(t *testing.T, lock *Lock) (*Hold, int64, int64) {
	t.Helper()
	ctx := context.Background()
	handoffs := lock.r.Stats().LocalHandoffs
	first, err := lock.Acquire(ctx)
	require.NoError(t, err)
	token := mustHoldToken(t, first)
	next := make(chan *Hold, 1)
	go func() {
		h, err := lock.Acquire(ctx)
		assert.NoError(t, err)
		next <- h
	}()
	require.Eventually(t, func() bool {
		local, _ := lock.r.locals.m.Load(lock.key)
		return local != nil && local.waited()
	}, 5*time.Second, time.Millisecond)
	require.NoError(t, first.Release(ctx))
	second := <-next
	require.NotNil(t, second, "the second acquisition")
	require.Equal(t, handoffs+1, lock.r.Stats().LocalHandoffs, "a local hand-off")
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
	r := newRegistry(t, client, handOffUnhurried)
	for _, split := range splits {
		lock := r.Obtain("migrating-" + split)
		aheadOfTheClock(t, client, lock)
		h, first, handedOut := handOffOnce(t, lock)
		require.Equal(t, first+1, handedOut)
		m := beginSplit(t, addrs, lock, split)
		require.NoError(t, h.Release(ctx), split)
		m.Finish(t)
		other := newRegistry(t, client).Obtain(lock.Key())
		next, err := other.Acquire(ctx)
		require.NoError(t, err)
		require.Greater(t, mustHoldToken(t, next), handedOut, "%s moved: a token handed out is drawn again", split)
		require.NoError(t, next.Release(ctx))
	}
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
	r := newRegistry(t, client, handOffUnhurried)
	operator := newRegistry(t, client)
	for _, split := range splits {
		lock := r.Obtain("migrating-" + split)
		aheadOfTheClock(t, client, lock)
		h, _, handedOut := handOffOnce(t, lock)
		m := beginSplit(t, addrs, lock, split)
		found, err := operator.ForceUnlock(ctx, lock.Key())
		require.NoError(t, err)
		require.True(t, found, split)
		m.Finish(t)
		next, err := operator.Obtain(lock.Key()).Acquire(ctx)
		require.NoError(t, err)
		require.Greater(t, mustHoldToken(t, next), handedOut, "%s moved: a token handed out is drawn again", split)
		require.NoError(t, next.Release(ctx))
		requireFires(t, h.Lost(), 5*time.Second, "the holder heard")
		require.ErrorIs(t, h.Release(ctx), ErrLockLost)
	}
}
