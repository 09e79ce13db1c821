package lockreg

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg/internal/protocol"
	"github.com/lockreg/lockreg/internal/redistest"
)

// TestARenewalThatFindsTheKeyGoneNamesTheCauseWhateverTheServer: a
// renewal sent after the process stood still past the lease finds the key
// gone, as Redis expired it: the hold is lost as expired, its own lapse,
// not as deleted behind its back, whether renew.lua or SET ... IFEQ
// (Valkey 8.1) renewed it; and a key found gone after a forced unlock
// whose note came first is lost as forced. make test runs this on Valkey
// 8.1 too.
func TestARenewalThatFindsTheKeyGoneNamesTheCauseWhateverTheServer(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	// Untracked (an ACL without CLIENT), once it said so: the registry's
	// client renews, and no check of the refusal reads the keys.
	r := untrackedRegistry(t, srv)
	lapsed, forced := lapsedAndForced(t, r) // as the watchdog's round was under way
	require.False(t, r.tracking.on.Load(), "untracked")
	info, err := admin.Info(ctx, "server").Result()
	require.NoError(t, err)
	require.Equal(t, protocol.RenewsNatively(info), r.servers.native.Load(), "the registry knows what the server has")

	require.NoError(t, admin.Del(ctx, lapsed.redisKey(), forced.redisKey()).Err())
	r.renew(ctx, [][]*Hold{{lapsed}, {forced}})
	requireCause(t, forced, LossForced)
	requireCause(t, lapsed, LossExpired)
}

// TestARenewalAnsweredAfterTheLeaseCarriesNothing: a renewal sent within
// the lease whose reply came after it ran out found the key the
// registry's, but it may have reached Redis after the key lapsed there
// and came back to the registry (a grant), which the owner check cannot
// tell: it carries the hold on no more than one sent after the lease
// would, and the hold is lost, as an acquisition answered after its lease
// is.
func TestARenewalAnsweredAfterTheLeaseCarriesNothing(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	r := newRegistry(t, srv.Client(t))
	const lease = 100 * time.Millisecond
	h := unarmedHold(r, "late", lease)
	require.NoError(t, admin.Set(ctx, h.redisKey(), r.OwnerID(), time.Minute).Err())
	// Redis answers the renewal, on whichever connection, after the lease,
	// which is counted from now: in Redis the key outlives it.
	require.NoError(t, admin.Do(ctx, "CLIENT", "PAUSE", (3*lease).Milliseconds(), "ALL").Err())
	h.tenure.leaseEnd.Store(int64(instantOf(time.Now().Add(lease))))
	r.renew(ctx, [][]*Hold{{h}})
	require.True(t, h.isLost(), "a renewal answered after the lease carried the hold on")
	requireCause(t, h, LossExpired)
}

// TestARenewalThatFindsAKeyOfAnotherTypeNamesTheCause: a key found of
// another type is no registry's, as a key found gone is: a hold whose
// lease had run out is lost as expired, and one whose forced unlock's
// note came first as forced, whether renew.lua or SET ... IFEQ renewed it.
func TestARenewalThatFindsAKeyOfAnotherTypeNamesTheCause(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	lapsed, forced := lapsedAndForced(t, untrackedRegistry(t, srv)) // as the watchdog's round was under way
	r := lapsed.lock.r
	for _, h := range []*Hold{lapsed, forced} {
		require.NoError(t, admin.Del(ctx, h.redisKey()).Err())
		require.NoError(t, admin.HSet(ctx, h.redisKey(), "f", "v").Err())
	}
	r.renew(ctx, [][]*Hold{{lapsed}, {forced}})
	requireCause(t, forced, LossForced)
	requireCause(t, lapsed, LossExpired)
}

// TestARenewalCountsItsLeaseFromWhenItWasSent: a renewal that Redis
// answers late (a paused server, a slow network) extends the lease from
// when it was sent, not from its reply: Redis counted the key's new time
// to live from the moment it ran, which may be any time in between, so a
// lease counted from the reply could outlive the key. So on the registry's
// client and on a tracking connection, which stamp their sends apart.
func TestARenewalCountsItsLeaseFromWhenItWasSent(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	tracked := newRegistry(t, srv.Client(t))
	requireTracking(t, tracked)
	for name, r := range map[string]*Registry{"tracked": tracked, "untracked": untrackedRegistry(t, srv)} {
		h := unarmedHold(r, "answered-late", r.cfg.expireAfter)
		require.NoError(t, admin.Set(ctx, h.redisKey(), r.OwnerID(), time.Minute).Err())
		const pause = time.Second
		require.NoError(t, admin.Do(ctx, "CLIENT", "PAUSE", pause.Milliseconds(), "ALL").Err())
		before := time.Now()
		r.renew(ctx, [][]*Hold{{h}})
		require.False(t, h.isLost(), "%s: a renewal answered within the lease carries the hold on", name)
		// The renewal went out just after before; its reply, a pause later.
		require.Less(t, h.tenure.leaseEnd.Load(), int64(instantOf(before.Add(r.cfg.expireAfter+pause/2))),
			"%s: the lease was counted from the renewal's reply, not from when it was sent", name)
	}
}

// TestTheLapseTimerIsSetToTheFirstLeaseToEnd: the watchdog's lapse timer
// fires at the end of the first live lease, so that a lease that runs out
// unrenewed is lost then, not up to a renewal interval later; set to a
// later lease's end, it would leave the first to the next tick.
func TestTheLapseTimerIsSetToTheFirstLeaseToEnd(t *testing.T) {
	ctx := context.Background()
	r := newRegistry(t, redistest.Shared(t).Client(t))
	now := time.Now()
	var first int64
	for i, after := range []time.Duration{2 * time.Minute, time.Minute, 3 * time.Minute} {
		h, err := r.Obtain(string(rune('a' + i))).Acquire(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = h.Release(ctx) })
		end := int64(instantOf(now.Add(after)))
		h.tenure.leaseEnd.Store(end)
		if first == 0 || end < first {
			first = end
		}
	}
	lapse := newLapseTimer()
	defer lapse.timer.Stop()
	r.nextLapse(lapse)
	require.Equal(t, first, lapse.at, "the lapse timer waits for a later lease than the first to end")
}
