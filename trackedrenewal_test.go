package lockreg

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg/internal/redistest"
)

// TestATrackedRenewalKeepsItsKeyTrackedWithoutAVerify: a renewal of a
// tracked key runs on the tracking connection, by renew.lua, which reads
// the key again, or where the server has SET ... IFEQ, by that SET with a
// GET after it: the key stays tracked, and the renewal costs no verify,
// which the invalidation of a renewal from another connection would ask
// for. make test runs this on Valkey 8.1 too.
func TestATrackedRenewalKeepsItsKeyTrackedWithoutAVerify(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	const lease = 300 * time.Millisecond
	r := newRegistry(t, client, WithExpireAfter(lease))
	reads := trackingReads(r)
	h, err := r.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return reads.Load() >= 1 }, time.Second, time.Millisecond, "armed")
	// The new tracking connection's check of the held keys is over.
	requireTracking(t, r)
	for last := int64(-1); last != reads.Load(); time.Sleep(20 * time.Millisecond) {
		last = reads.Load()
	}
	armed, renewals := reads.Load(), r.Stats().RenewCalls
	time.Sleep(lease) // about three ticks
	require.Greater(t, r.Stats().RenewCalls, renewals+1, "renewed")
	require.Equal(t, armed, reads.Load(), "no verify after the renewals")
	require.NoError(t, client.Del(ctx, h.redisKey()).Err())
	requireFires(t, h.Lost(), blindLimit, "the key is still tracked after its renewals")
	requireCause(t, h, LossDeleted)
}

// TestANativeRenewalNamesTheCauseAVerifyWould: a renewal on the tracking
// connection that finds the key another's names the loss as a verify of
// the key's invalidation would, overwritten, as it may come first. A
// server without SET ... IFEQ refuses the renewal, and the registry turns
// back to renew.lua.
func TestANativeRenewalNamesTheCauseAVerifyWould(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client)
	lock := r.Obtain("k")
	lock.Lock()
	defer lock.Unlock()
	requireTracking(t, r)
	tr := r.trackerFor(lock.keys().Lock())
	require.NotNil(t, tr)

	// A hold of a key that nobody armed, so that only the renewal reads it.
	other := r.Obtain("overwritten")
	require.NoError(t, client.Set(ctx, other.keys().Lock(), "another owner", time.Minute).Err())
	h := newHold(other, 0, time.Now(), r.cfg.expireAfter)
	h.local = &localLock{}
	native := r.servers.native.Load()
	left, ok := r.renewTurn(ctx, tr, []*Hold{h})
	if !native {
		require.False(t, ok, "SET ... IFEQ refused")
		require.False(t, r.servers.native.Load())
		return
	}
	require.True(t, ok)
	require.Empty(t, left)
	requireCause(t, h, LossOverwritten)
}
