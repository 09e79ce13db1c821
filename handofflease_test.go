package lockreg

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg/internal/redistest"
)

// A hold past WithMaxHold has stopped renewing its key, whose lease runs
// out soon: handed off locally (WithLocalHandoff's d past the max), the
// key would pass that dying lease on to a fresh hold, which the watchdog
// may not renew before it ends: lost long before its own max. It goes
// back to Redis instead, and the next hold takes it with a lease of its own.
func TestAHoldPastMaxHoldIsNotHandedOff(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	const lease, maxHold = 600 * time.Millisecond, 250 * time.Millisecond
	r := newRegistry(t, client, WithExpireAfter(lease), WithRetryInterval(20*time.Millisecond),
		WithMaxHold(maxHold), WithLocalHandoff(16, time.Minute))
	first, err := r.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	next := make(chan *Hold, 1)
	go func() {
		h, err := r.Obtain("k").Acquire(ctx)
		if err != nil {
			close(next)
			return
		}
		next <- h
	}()
	time.Sleep(maxHold + lease/3) // past the max, and past the renewal that followed it, if any
	// Into the last quarter of the lease that the last renewal left.
	time.Sleep(time.Until(instant(first.tenure.leaseEnd.Load()).time().Add(-lease / 4)))
	requireOpen(t, first.Lost(), "the lease still runs")
	require.NoError(t, first.Release(ctx))
	h, ok := <-next
	require.True(t, ok, "the waiter took the key")
	require.Greater(t, client.PTTL(ctx, h.redisKey()).Val(), lease/2, "the next hold has a lease of its own")
	time.Sleep(maxHold)
	requireOpen(t, h.Lost(), "and keeps the key for its own max hold")
	require.NoError(t, h.Release(ctx))
}

// With renewal off, nothing renews a lease a local hand-off passes on: a
// hold handed off late in it (WithLocalHandoff's d near the lease) would
// start with a sliver of the lease, lost at once, and the release that
// handed it off would wait for a read that comes too late. Late in the
// lease the key goes back to Redis, and the next hold gets a lease of
// its own.
func TestWithoutRenewalALateHoldIsNotHandedOff(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	const lease = 600 * time.Millisecond
	r := newRegistry(t, client, WithExpireAfter(lease), WithRetryInterval(20*time.Millisecond),
		WithRenewal(false), WithLocalHandoff(16, time.Minute))
	first, err := r.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	next := make(chan *Hold, 1)
	go func() {
		h, err := r.Obtain("k").Acquire(ctx)
		if err != nil {
			close(next)
			return
		}
		next <- h
	}()
	time.Sleep(lease * 4 / 5) // a fifth of the lease left
	require.NoError(t, first.Release(ctx))
	h, ok := <-next
	require.True(t, ok, "the waiter took the key")
	require.Greater(t, client.PTTL(ctx, h.redisKey()).Val(), lease/2, "the next hold has a lease of its own")
	time.Sleep(lease / 2)
	requireOpen(t, h.Lost(), "and keeps the key for it")
	require.NoError(t, h.Release(ctx))
}
