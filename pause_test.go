package lockreg

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg/internal/redistest"
)

// A server paused past a lease (CLIENT PAUSE, as a manual failover does)
// answers no renewal: the hold's lease runs out as the registry counts it,
// and once the pause ends the key is anyone's, its TTL having run too. The
// registry knows the instant, and Lost must fire then, not at the
// watchdog's next tick up to a renewal interval (lease/3) later, while the
// work under the hold goes on.
func TestLostFiresWhenTheLeaseRunsOutNotAtTheNextTick(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	const lease = 900 * time.Millisecond
	r := newRegistry(t, srv.Client(t), WithExpireAfter(lease))
	// The watchdog ticks every lease/3 from the first hold on; a hold
	// taken half a tick later has its lease end half a tick before one.
	first, err := r.Obtain("first").Acquire(ctx)
	require.NoError(t, err)
	time.Sleep(lease / 6)
	h, err := r.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	require.NoError(t, admin.Do(ctx, "CLIENT", "PAUSE", (2*lease).Milliseconds(), "ALL").Err())
	t.Cleanup(func() { _ = admin.Do(ctx, "CLIENT", "UNPAUSE").Err() })
	end := instant(h.tenure.leaseEnd.Load()).time()

	select {
	case <-h.Lost():
	case <-time.After(2 * lease):
		t.Fatal("Lost never fired")
	}
	late := time.Since(end)
	require.Less(t, late, lease/9, "Lost fired %v after the lease ran out", late)
	require.ErrorIs(t, h.Err(), ErrLockLost)
	require.ErrorIs(t, h.Release(ctx), ErrLockLost)
	require.ErrorIs(t, first.Release(ctx), ErrLockLost)
}

// A granted hold's lease is short (two retry intervals) until the grantee
// extends it; a server paused before that leaves it to run out between
// two of the watchdog's ticks, and Lost must fire then too.
func TestLostFiresWhenAGrantsLeaseRunsOut(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	const lease = 3 * time.Second // ticks a second apart
	holder := newRegistry(t, srv.Client(t), WithExpireAfter(lease))
	waiter := newRegistry(t, srv.Client(t), WithExpireAfter(lease), WithRetryInterval(50*time.Millisecond))
	held, err := holder.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	got := make(chan *Hold, 1)
	go func() {
		h, err := waiter.Obtain("k").Acquire(ctx)
		assert.NoError(t, err)
		got <- h
	}()
	waitUntilWaiting(t, waiter)
	require.NoError(t, held.Release(ctx))
	h := <-got
	require.Equal(t, viaGrant, h.via, "granted")
	require.NoError(t, admin.Do(ctx, "CLIENT", "PAUSE", 1000, "ALL").Err())
	t.Cleanup(func() { _ = admin.Do(ctx, "CLIENT", "UNPAUSE").Err() })
	end := instant(h.tenure.leaseEnd.Load()).time()

	select {
	case <-h.Lost():
	case <-time.After(2 * time.Second):
		t.Fatal("Lost never fired")
	}
	late := time.Since(end)
	require.Less(t, late, 300*time.Millisecond, "Lost fired %v after the grant's lease ran out", late)
	require.ErrorIs(t, h.Release(ctx), ErrLockLost)
}

// A release that a paused server holds up past the hold's lease finds the
// key gone: it expired meanwhile, and the release names it so, not
// "deleted", which would send an operator looking for who deleted it.
func TestAReleaseHeldUpPastTheLeaseNamesTheKeyExpired(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	const lease = 600 * time.Millisecond
	r := newRegistry(t, srv.Client(t), WithExpireAfter(lease))
	h, err := r.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	require.NoError(t, admin.Do(ctx, "CLIENT", "PAUSE", (2*lease).Milliseconds(), "ALL").Err())
	t.Cleanup(func() { _ = admin.Do(ctx, "CLIENT", "UNPAUSE").Err() })
	err = h.Release(ctx)
	require.ErrorIs(t, err, ErrLockLost)
	require.ErrorContains(t, err, LossExpired.explain())
	requireCause(t, h, LossExpired)
}

// TestAReleaseNamesTheLossThatStruckWhileItWasOnItsWay: tracking's read,
// sent before the release began (it holds the hold), found the key
// deleted, and its verdict struck the hold while the release's call was on
// its way; the release, which then finds the key not the registry's, names
// that loss, not a lapse of the lease (a struck tenure's lease reads as
// over). The verdict is given here as tracking gives it, at that moment.
func TestAReleaseNamesTheLossThatStruckWhileItWasOnItsWay(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	var releasing atomic.Bool
	var r *Registry
	var h *Hold
	client := srv.Client(t, redistest.Hook{Process: func(next redis.ProcessHook) redis.ProcessHook {
		return func(ctx context.Context, cmd redis.Cmder) error {
			if !releasing.CompareAndSwap(true, false) {
				return next(ctx, cmd)
			}
			require.NoError(t, admin.Del(ctx, h.redisKey()).Err())
			err := next(ctx, cmd)
			r.changedBehindItsBack(h, LossDeleted, true, false)
			return err
		}
	}})
	r = newRegistry(t, client, WithRenewal(false))
	var err error
	h, err = r.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	releasing.Store(true)
	err = h.Release(ctx)
	require.ErrorIs(t, err, ErrLockLost)
	require.ErrorContains(t, err, LossDeleted.explain())
	requireCause(t, h, LossDeleted)
}
