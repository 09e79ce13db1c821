package lockreg

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg/internal/redistest"
)

func TestCancelWhileWaitingLocally(t *testing.T) {
	r := newRegistry(t, redistest.Shared(t).Client(t), WithRetryInterval(5*time.Second))
	lock := r.Obtain("k")
	lock.Lock()
	defer lock.Unlock()

	inGoroutine(func() {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(50*time.Millisecond, cancel)
		start := time.Now()
		err := lock.LockContext(ctx)
		require.ErrorIs(t, err, ErrNotObtained)
		require.ErrorIs(t, err, context.Canceled)
		require.Less(t, time.Since(start), time.Second, "returns well within one retry interval")
	})
	require.Equal(t, 1, refsOf(r, "k"), "the cancelled waiter left")
}

func TestCancelWhileSpinning(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	holder := newRegistry(t, client)
	waiter := newRegistry(t, client, WithRetryInterval(5*time.Second))
	holder.Obtain("k").Lock()
	defer holder.Obtain("k").Unlock()

	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	err := waiter.Obtain("k").LockContext(cctx)
	require.ErrorIs(t, err, ErrNotObtained)
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, ErrRedis, "no Redis error happened")
	require.Less(t, time.Since(start), time.Second, "returns well within one retry interval")
	requireNoLocalState(t, waiter)
	require.Equal(t, holder.clientID, client.Get(ctx, "lockreg-test:"+t.Name()+":{k}").Val())
}

// An acquisition whose caller left (ctx ended during its attempt, which
// runs aside) is done, and AcquireDone told: its goroutine, which finishes
// the attempt, makes no further one. Here the subscription it opens after
// the failed attempt was opened meanwhile by another goroutine (as
// subscribeSoon does for a holder), so its subscribe returns at once,
// with ctx ended.
func TestNoAttemptIsToldAfterItsAcquisitionIsDone(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	holder := newRegistry(t, client)
	r := newRegistry(t, client, WithRetryInterval(5*time.Second))
	holder.Obtain("k").Lock()
	defer holder.Obtain("k").Unlock()
	var done, late atomic.Bool
	r.AddHooks(Hooks{
		AcquireAttempt: func(context.Context, string) {
			if done.Load() {
				late.Store(true)
			}
		},
		AcquireDone: func(context.Context, AcquireEvent) { done.Store(true) },
	})

	n := &r.notes
	n.mu.Lock() // another goroutine is subscribing
	ctx, cancel := context.WithCancel(context.Background())
	ended := make(chan error, 1)
	go func() { ended <- r.Obtain("k").LockContext(ctx) }()
	require.Eventually(t, func() bool { return r.Stats().FailedAttempts > 0 }, 5*time.Second, time.Millisecond)
	cancel()
	require.ErrorIs(t, <-ended, context.Canceled)
	require.True(t, done.Load())
	// The other goroutine's subscription is confirmed.
	sub := client.Subscribe(context.Background(), n.names...)
	for range n.names {
		_, err := sub.ReceiveTimeout(context.Background(), 5*time.Second)
		require.NoError(t, err)
	}
	require.True(t, r.goBackground(func(stop context.Context) { r.route(stop, sub) }))
	n.sub = sub
	n.subscribed.Store(true)
	n.mu.Unlock()

	requireNoLocalState(t, r)
	require.False(t, late.Load(), "an attempt was told after AcquireDone")
}

// An acquisition whose ctx ended before it began sends Redis nothing: no
// attempt, and so no release or withdrawal of what it might have taken.
func TestAnAcquisitionWhoseContextEndedSendsRedisNothing(t *testing.T) {
	r := newRegistry(t, redistest.Shared(t).Client(t))
	var calls atomic.Int64
	r.AddHooks(Hooks{RedisCalls: func(_ RedisOp, n int) { calls.Add(int64(n)) }})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, r.Obtain("k").LockContext(ctx), context.Canceled)
	require.ErrorIs(t, r.Obtain("k").LockContext(ctx), ErrNotObtained)
	requireNoLocalState(t, r)
	require.Zero(t, calls.Load())
}
