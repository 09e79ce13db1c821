package lockreg

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg/internal/redistest"
)

// A Redis that restarts with its data (an RDB snapshot, an AOF) brings a
// held key back as it was when the data was written: the registry's, but
// with the time to live it had then, which renewals since have outrun. The
// holder, finding the key its own after the restart, keeps its hold and
// counts its lease from its last renewal; unless Redis's lease is made
// that long again, the key expires first, and another registry takes it
// while the holder's lease is live. Here the snapshot holds the key with
// a second and a half left, the holder's lease is 30 s, and the watchdog's
// next round is 10 s away. With tracking, the tracker's new connection
// checks the key; without (an ACL without CLIENT), the resubscription does.
func TestAKeyRestoredFromASnapshotKeepsItsHoldersLease(t *testing.T) {
	t.Parallel()
	for _, tracked := range []bool{true, false} {
		t.Run(map[bool]string{true: "tracked", false: "untracked"}[tracked], func(t *testing.T) {
			t.Parallel()
			restoredKeepsItsLease(t, tracked)
		})
	}
	// With renewal off, the lease is fixed: the key must live as long as
	// it, and no longer.
	t.Run("renewalOff", func(t *testing.T) {
		t.Parallel()
		restoredKeepsItsLease(t, true, WithRenewal(false))
	})
}

func restoredKeepsItsLease(t *testing.T, tracked bool, opts ...Option) {
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	const lease = 30 * time.Second
	client := srv.Client(t)
	if !tracked {
		client = aclClient(t, srv, "+@all", "-client")
	}
	r := newRegistry(t, client, append([]Option{WithExpireAfter(lease), WithRetryInterval(20 * time.Millisecond)}, opts...)...)
	if tracked {
		requireTracking(t, r)
	}
	h, err := r.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	// The snapshot of an older moment: the key as a renewal long ago left it.
	require.NoError(t, admin.PExpire(ctx, h.redisKey(), 1500*time.Millisecond).Err())
	require.NoError(t, admin.Save(ctx).Err())
	require.NoError(t, admin.PExpire(ctx, h.redisKey(), lease).Err())

	srv.Restart(t)
	if !tracked {
		aclClient(t, srv, "+@all", "-client") // ACL users are no data: made again
	}
	require.Equal(t, r.clientID, admin.Get(ctx, h.redisKey()).Val(), "the key came back with the snapshot")

	other := newRegistry(t, srv.Client(t), WithRetryInterval(20*time.Millisecond))
	waitCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	taken, err := other.Obtain("k").Acquire(waitCtx)
	if err == nil {
		lostFirst := false
		select {
		case <-h.Lost():
			lostFirst = true
		default:
		}
		require.NoError(t, taken.Release(ctx))
		require.Failf(t, "another registry took the key while the holder's lease was live",
			"the holder was told before: %v; the holder's error: %v", lostFirst, h.Err())
	}
	require.True(t, errors.Is(err, ErrNotObtained), "%v", err)
	requireOpen(t, h.Lost(), "the hold lives on")
	left := time.Until(instant(h.tenure.leaseEnd.Load()).time())
	ttl := admin.PTTL(ctx, h.redisKey()).Val()
	require.GreaterOrEqual(t, ttl, left-50*time.Millisecond, "Redis keeps the key as long as the hold counts its lease")
	require.LessOrEqual(t, ttl, lease)
	require.NoError(t, h.Release(ctx))
}

// A restart from a snapshot older than the tokens drawn since brings back
// an older fence: the next token is still above every earlier one, as a
// draw is never below the server clock in microseconds, which every token
// drawn is at most (docs/RELIABILITY.md, "A restart with its data").
func TestTokensRiseAcrossARestartFromAnOlderSnapshot(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	r := newRegistry(t, srv.Client(t))
	lock := r.Obtain("k")
	draw := func() int64 {
		h, err := lock.Acquire(ctx)
		require.NoError(t, err)
		token := mustHoldToken(t, h)
		require.NoError(t, h.Release(ctx))
		return token
	}
	snapshotted := draw()
	require.NoError(t, admin.Save(ctx).Err())
	last := snapshotted
	for range 5 {
		next := draw()
		require.Greater(t, next, last)
		last = next
	}

	srv.Restart(t)
	fence, err := admin.Get(ctx, lock.keys().Fence()).Int64()
	require.NoError(t, err)
	require.Equal(t, snapshotted, fence, "the snapshot's fence came back")
	require.Eventually(t, func() bool {
		h, err := lock.Acquire(ctx)
		if err != nil {
			return false
		}
		defer func() { _ = h.Release(ctx) }()
		token, err := h.Token(ctx)
		if err != nil {
			return false
		}
		require.Greater(t, token, last, "above every token drawn before the restart")
		return true
	}, 5*time.Second, 20*time.Millisecond)
}
