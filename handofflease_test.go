package lockreg

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg/internal/redistest"
)

// handOffLeaseLease is the lease of the tests below: long enough that a
// loaded machine's stalls stay well within the margins they keep.
const handOffLeaseLease = 3 * time.Second

// holdWithAWaiter has a registry on a server of its own, with opts, hold
// "k" while a second acquisition of it waits. It returns the hold, the
// channel the waiter's hold comes on (closed if its acquisition failed)
// and an admin client.
func holdWithAWaiter(t *testing.T, opts ...Option) (*Hold, <-chan *Hold, *redis.Client) {
	t.Helper()
	ctx := context.Background()
	srv := redistest.Start(t)
	opts = append([]Option{WithExpireAfter(handOffLeaseLease), WithRetryInterval(20 * time.Millisecond), WithLocalHandoff(16, time.Minute)}, opts...)
	r := newRegistry(t, srv.Client(t), opts...)
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
	return first, next, srv.Client(t)
}

// requireALeaseOfItsOwn releases first and checks that the waiter, next,
// took the key with a lease of its own, which it keeps for keep.
func requireALeaseOfItsOwn(t *testing.T, first *Hold, next <-chan *Hold, admin *redis.Client, keep time.Duration) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, first.Release(ctx))
	h, ok := <-next
	require.True(t, ok, "the waiter took the key")
	require.Greater(t, admin.PTTL(ctx, h.redisKey()).Val(), handOffLeaseLease/2, "the next hold has a lease of its own")
	time.Sleep(keep)
	requireOpen(t, h.Lost(), "and keeps the key")
	require.NoError(t, h.Release(ctx))
}

// A hold past WithMaxHold has stopped renewing its key, whose lease runs
// out soon: handed off locally (WithLocalHandoff's d past the max), the
// key would pass that dying lease on to a fresh hold, which the watchdog
// may not renew before it ends: lost long before its own max. It goes
// back to Redis instead, and the next hold takes it with a lease of its own.
func TestAHoldPastMaxHoldIsNotHandedOff(t *testing.T) {
	t.Parallel()
	const maxHold = handOffLeaseLease / 3
	first, next, admin := holdWithAWaiter(t, WithMaxHold(maxHold))
	time.Sleep(maxHold + handOffLeaseLease/3) // past the max, and past the renewal that followed it, if any
	// Into the last quarter of the lease that the last renewal left.
	time.Sleep(time.Until(instant(first.tenure.leaseEnd.Load()).time().Add(-handOffLeaseLease / 4)))
	requireOpen(t, first.Lost(), "the lease still runs")
	requireALeaseOfItsOwn(t, first, next, admin, maxHold)
}

// With renewal off, nothing renews a lease a local hand-off passes on: a
// hold handed off late in it (WithLocalHandoff's d near the lease) would
// start with a sliver of the lease, lost at once, and the release that
// handed it off would wait for a read that comes too late. Late in the
// lease the key goes back to Redis, and the next hold gets a lease of
// its own.
func TestWithoutRenewalALateHoldIsNotHandedOff(t *testing.T) {
	t.Parallel()
	first, next, admin := holdWithAWaiter(t, WithRenewal(false))
	time.Sleep(handOffLeaseLease * 4 / 5) // a fifth of the lease left
	requireALeaseOfItsOwn(t, first, next, admin, handOffLeaseLease/2)
}

// A key whose change tracking has not read yet (an invalidation on its
// way to its verify) may have passed to another owner already: handed off
// locally, the change would go on unseen under the next hold. Its release
// goes to Redis instead, whose owner check tells the releasing hold, and
// the waiter takes the key in Redis.
func TestAKeyWithAnUncheckedChangeIsNotHandedOff(t *testing.T) {
	t.Parallel()
	first, next, _ := holdWithAWaiter(t)
	require.Eventually(t, first.local.waited, 5*time.Second, time.Millisecond, "the second acquisition waits")
	first.local.unchecked.Add(1) // as an invalidation does until its read
	require.NoError(t, first.Release(context.Background()))
	h, ok := <-next
	require.True(t, ok, "the waiter took the key")
	first.local.unchecked.Add(-1)
	require.NotEqual(t, viaHandoff, h.via, "the key was handed off with a change unchecked")
	require.NoError(t, h.Release(context.Background()))
}
