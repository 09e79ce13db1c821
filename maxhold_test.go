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
