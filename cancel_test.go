package lockreg

import (
	"context"
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
