package lockreg

import (
	"bytes"
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg/internal/redistest"
)

// TestATrackedRenewalKeepsItsKeyTrackedWithoutAVerify: a renewal of a
// tracked key runs on the tracking connection, by renew.lua, which reads
// the key again, whatever the server: the key stays tracked, and the renewal costs no verify,
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
	readsSettled(reads)
	armed, renewals := reads.Load(), r.Stats().RenewCalls
	time.Sleep(lease) // about three ticks
	require.Greater(t, r.Stats().RenewCalls, renewals+1, "renewed")
	require.Equal(t, armed, reads.Load(), "no verify after the renewals")
	require.NoError(t, client.Del(ctx, h.redisKey()).Err())
	requireFires(t, h.Lost(), blindLimit, "the key is still tracked after its renewals")
	requireCause(t, h, LossDeleted)
}

// TestARenewalNamesTheCauseAVerifyWould: a renewal on the tracking
// connection that finds the key another's names the loss as a verify of
// the key's invalidation would, overwritten, as it may come first; one
// that finds it gone, deleted.
func TestARenewalNamesTheCauseAVerifyWould(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client)
	tr := trackerOfAHeldKey(t, r)
	// Holds of keys that nobody armed, so that only the renewal reads them.
	overwritten := unarmedHold(r, "overwritten", r.cfg.expireAfter)
	deleted := unarmedHold(r, "deleted", r.cfg.expireAfter)
	require.NoError(t, client.Set(ctx, overwritten.redisKey(), "another owner", time.Minute).Err())
	left, ran := r.renewTurn(ctx, tr, [][]*Hold{{overwritten}, {deleted}}, time.Second)
	require.True(t, ran)
	require.Empty(t, left)
	requireCause(t, overwritten, LossOverwritten)
	requireCause(t, deleted, LossDeleted)
}

// TestARenewalThatAKeyOfAnotherTypeFailsLeavesTheOthersTracked: renew.lua
// on the tracking connection fails its whole call with WRONGTYPE on a key
// of another type; the keys it had renewed before it must not be left
// untracked (the PEXPIRE ended their tracking, and the connection's NOLOOP
// told nobody), or a change to them would go untold until the next round.
func TestARenewalThatAKeyOfAnotherTypeFailsLeavesTheOthersTracked(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client, WithExpireAfter(10*time.Second))
	reads := trackingReads(r)
	held, err := r.Obtain("held").Acquire(ctx)
	require.NoError(t, err)
	requireTracking(t, r)
	require.Eventually(t, func() bool { return reads.Load() >= 1 }, time.Second, time.Millisecond, "armed")
	// The new tracking connection's check of the held keys is over.
	readsSettled(reads)
	tr := r.trackerFor(held.redisKey())
	require.NotNil(t, tr)

	// A hold whose key is now a list, renewed in the same call, after it.
	list := unarmedHold(r, "list", r.cfg.expireAfter)
	t.Cleanup(func() { client.Del(ctx, held.redisKey(), list.redisKey()) })
	require.NoError(t, client.RPush(ctx, list.redisKey(), "x").Err())
	left, ran := r.renewTurn(ctx, tr, [][]*Hold{{held, list}}, time.Second)
	require.True(t, ran)
	r.renewByScript(ctx, left) // as renew does with what is left
	requireCause(t, list, LossOverwritten)
	require.NoError(t, held.Err(), "the held key was renewed")

	require.NoError(t, client.Set(ctx, held.redisKey(), "another owner", time.Minute).Err())
	requireFires(t, held.Lost(), blindLimit, "the held key is still tracked after the failed call")
	requireCause(t, held, LossOverwritten)
}

// TestARoundLosesAKeyOfAnotherTypeAsOverwrittenWhateverTheServer: the
// batch that a key of another type fails on the tracking connection goes
// to the registry's client, natively where the server has SET ... IFEQ
// (Valkey 8.1); that key, no registry's, must be lost there too, as
// overwritten, not renewed in vain until its lease runs out. make test
// runs this on Valkey 8.1 too.
func TestARoundLosesAKeyOfAnotherTypeAsOverwrittenWhateverTheServer(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client, WithExpireAfter(10*time.Second))
	held, err := r.Obtain("held").Acquire(ctx)
	require.NoError(t, err)
	requireTracking(t, r)
	// A hold whose key is now a hash, which nobody armed: only the
	// renewal reads it.
	hash := unarmedHold(r, "hash", r.cfg.expireAfter)
	t.Cleanup(func() { client.Del(ctx, hash.redisKey()) })
	require.NoError(t, client.HSet(ctx, hash.redisKey(), "not", "a lock").Err())
	r.renew(ctx, [][]*Hold{{held, hash}})
	require.True(t, hash.isLost(), "the hold of a key made a hash outlived its renewal")
	requireCause(t, hash, LossOverwritten)
	require.NoError(t, held.Err(), "the held key was renewed")
	require.NoError(t, held.Release(ctx))
}

// TestATrackedRenewalSentAfterTheLeaseRanOutCarriesNothing: a turn waits
// in the tracker's queue behind its other work (arming, verifying,
// reconnecting) before it goes on the wire; a renewal that went out after
// the lease ran out must not carry the hold on, as the key may have
// passed through other owners and come back meanwhile. Its lease is
// counted from when it went out.
func TestATrackedRenewalSentAfterTheLeaseRanOutCarriesNothing(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client)
	tr := trackerOfAHeldKey(t, r)
	// A hold of a key that is the registry's in Redis, whose lease (as the
	// registry counts it) runs out while its renewal waits in the queue.
	const lease = 200 * time.Millisecond
	h := unarmedHold(r, "late", lease)
	require.NoError(t, client.Set(ctx, h.redisKey(), r.OwnerID(), time.Minute).Err())
	t.Cleanup(func() { client.Del(ctx, h.redisKey()) })
	tr.mu.Lock() // armLoop is busy: the turn waits
	done := make(chan struct{})
	go func() {
		defer close(done)
		left, ran := r.renewTurn(ctx, tr, [][]*Hold{{h}}, time.Second)
		assert.True(t, ran)
		assert.Empty(t, left)
	}()
	time.Sleep(lease + 100*time.Millisecond)
	tr.mu.Unlock()
	<-done
	require.True(t, h.isLost(), "a renewal sent after the lease ran out carried the hold on")
	requireCause(t, h, LossExpired)
}

// TestAGrantsExtensionWaitsForABusyTrackerNoLongerThanItsLeaseAllows: a
// granted hold's short lease is extended halfway through it, by a round
// of its one key, whose turn on the tracking connection may wait behind
// the tracker's other work. A sixth of the registry's lease (5s of the
// default 30s) is far past the grant's (200ms): the turn must give up in
// time for the registry's client to extend the lease, or the hold is lost
// to a busy tracker.
func TestAGrantsExtensionWaitsForABusyTrackerNoLongerThanItsLeaseAllows(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Shared(t)
	// A tracking connection (one that sent CLIENT TRACKING) writes slowly
	// while slow is set: its tracker is busy, the registry's client not.
	var slow atomic.Bool
	client := redis.NewClient(&redis.Options{
		Addr: srv.Addr(),
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			var tracking atomic.Bool
			return writeHook{Conn: conn, before: func(b []byte) {
				if bytes.Contains(bytes.ToLower(b), []byte("$8\r\ntracking\r\n")) { // not renew.lua's text, which EVAL sends
					tracking.Store(true)
				}
				if tracking.Load() && slow.Load() {
					time.Sleep(time.Second)
				}
			}}, nil
		},
	})
	t.Cleanup(func() { _ = client.Close() })
	holder, waiter := newRegistry(t, srv.Client(t)), newRegistry(t, client)
	trackerOfAHeldKey(t, waiter)
	t.Cleanup(func() { slow.Store(false) })
	h := grantedHold(t, holder, waiter, "g", func() { slow.Store(true) })
	time.Sleep(2 * waiter.grants.lease)
	require.NoError(t, h.lossNow(), "the granted hold outlives its grant's lease")
	require.Greater(t, srv.Client(t).PTTL(ctx, h.redisKey()).Val(), waiter.grants.lease, "extended to the registry's lease")
	slow.Store(false)
	require.NoError(t, h.Release(ctx))
}

// trackerOfAHeldKey holds a key of r until the test ends, and returns its
// tracker once tracking is on.
func trackerOfAHeldKey(t *testing.T, r *Registry) *tracker {
	t.Helper()
	lock := r.Obtain("k")
	lock.Lock()
	t.Cleanup(lock.Unlock)
	requireTracking(t, r)
	tr := r.trackerFor(lock.keys().Lock())
	require.NotNil(t, tr)
	return tr
}

// unarmedHold is a hold of key, with lease, that nobody armed: only a
// renewal reads its key.
func unarmedHold(r *Registry, key string, lease time.Duration) *Hold {
	h := newHold(r.Obtain(key), 0, time.Now(), lease)
	h.local = &localLock{}
	return h
}
