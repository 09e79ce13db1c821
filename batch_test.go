package lockreg

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg/internal/protocol"
	"github.com/lockreg/lockreg/internal/redisstat"
	"github.com/lockreg/lockreg/internal/redistest"
)

// TestQueuedCallsLeaveAsOnePipeline fills the registry's calls in flight,
// queues obtain calls for many keys behind them, and lets them go: they
// leave as one pipeline, every caller gets its own reply, even after Redis
// forgot the script, and even though the caller that sends the pipeline had
// its context cancelled as it did; a queued call whose context ended
// before left the queue unsent.
func TestQueuedCallsLeaveAsOnePipeline(t *testing.T) {
	ctx := context.Background()
	var sent redisstat.Counter
	srv := redistest.Shared(t)
	client := srv.Client(t)
	r := newRegistry(t, client)
	client.AddHook(&sent) // after New's look at the server
	require.NoError(t, srv.Client(t).ScriptFlush(ctx).Err(), "the pipeline must reload the script")

	b := &r.batcher
	b.mu.Lock()
	b.inFlight = protocol.MaxInFlight // as if that many calls were on the wire
	b.mu.Unlock()
	// The first queued call leads the pipeline; its caller's context ends
	// once it does.
	leading, cancel := context.WithCancel(ctx)

	const callers = 10
	prefix := "queued-" + strconv.FormatInt(time.Now().UnixNano(), 36) + "-" // the keys of this run
	tokens := make([]int64, callers)
	errs := make([]error, callers)
	var wg sync.WaitGroup
	for i := range callers {
		lock := r.Obtain(prefix + strconv.Itoa(i))
		callCtx := ctx
		if i == 0 {
			callCtx = leading
		}
		queued := len(b.queue)
		wg.Go(func() {
			tokens[i], errs[i] = b.run(callCtx, r.peer.Obtain(lock.keys(), false, false)).Int64()
		})
		require.Eventually(t, func() bool {
			b.mu.Lock()
			defer b.mu.Unlock()
			return len(b.queue) == queued+1
		}, 5*time.Second, time.Millisecond, "call %d queued behind the full calls in flight", i)
	}
	require.Zero(t, sent.RoundTrips(), "nothing is sent while the calls in flight are full")
	// A queued call whose context ends leaves the queue, unsent.
	given, giveUp := context.WithCancel(ctx)
	queued := len(b.queue)
	var gaveUp error
	wg.Go(func() { gaveUp = b.run(given, r.peer.Obtain(r.Obtain(prefix+"gave-up").keys(), false, false)).Err() })
	require.Eventually(t, func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.queue) == queued+1
	}, 5*time.Second, time.Millisecond, "the call that gives up queued")
	giveUp()
	require.Eventually(t, func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.queue) == queued
	}, 5*time.Second, time.Millisecond, "the call that gave up left the queue")

	b.next() // a call in flight returns
	cancel()
	wg.Wait()
	require.ErrorIs(t, gaveUp, context.Canceled)
	for i := range callers {
		require.NoError(t, errs[i], "caller %d", i)
		require.Positive(t, tokens[i], "caller %d got a token", i)
		owner, err := srv.Client(t).Get(ctx, r.Obtain(prefix+strconv.Itoa(i)).keys().Lock()).Result()
		require.NoError(t, err)
		require.Equal(t, r.clientID, owner)
	}
	// One pipeline of EVALSHAs, answered NOSCRIPT, then one of EVALs.
	require.Equal(t, int64(2), sent.RoundTrips())
	require.Equal(t, map[string]int64{"evalsha": callers, "eval": callers}, sent.Commands())

	b.mu.Lock()
	defer b.mu.Unlock()
	require.Equal(t, protocol.MaxInFlight-1, b.inFlight, "the pipeline's slot is freed, the others are still taken")
	require.Empty(t, b.queue)
	b.inFlight = 0
}

// TestParallelCallsArePipelined runs many goroutines on keys of their own,
// more than the calls a registry keeps in flight: they share round trips,
// and every lock still excludes another registry.
func TestParallelCallsArePipelined(t *testing.T) {
	var sent redisstat.Counter
	srv := redistest.Shared(t)
	client := srv.Client(t)
	r := newRegistry(t, client)
	client.AddHook(&sent) // after New's look at the server
	other := newRegistry(t, srv.Client(t))
	const goroutines, cycles = 32, 50
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			lock := r.Obtain("parallel-" + strconv.Itoa(g))
			for range cycles {
				lock.Lock()
				if other.Obtain(lock.Key()).TryLock() {
					t.Errorf("another registry took %q while held", lock.Key())
				}
				lock.Unlock()
			}
		})
	}
	wg.Wait()
	commands := sent.Commands()
	calls := commands["set"] + commands["evalsha"]
	require.Equal(t, int64(goroutines*cycles), commands["set"], "one SET NX per cycle: the keys are not contended")
	require.Equal(t, int64(2*goroutines*cycles), calls, "and one release")
	require.Less(t, sent.RoundTrips(), calls, "calls shared round trips")
	t.Logf("%d calls in %d round trips", calls, sent.RoundTrips())
	requireNoLocalState(t, r)
}

// A release queued behind MaxInFlight calls to a Redis that hangs ends
// with its ctx, as far as the client honours it (ContextTimeoutEnabled):
// it does not wait for the calls before it, nor go out in a pipeline
// without a deadline.
func TestAQueuedCallEndsWithItsContext(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, ReadTimeout: 10 * time.Second, MaxRetries: -1})
	t.Cleanup(func() { _ = client.Close() })
	r := newRegistry(t, client)
	holds := make([]*Hold, protocol.MaxInFlight+1)
	for i := range holds {
		h, err := r.Obtain("k" + strconv.Itoa(i)).Acquire(ctx)
		require.NoError(t, err)
		holds[i] = h
	}
	srv.Pause(t)
	var inFlight sync.WaitGroup
	for _, h := range holds[:protocol.MaxInFlight] {
		inFlight.Go(func() { _ = h.Release(ctx) })
	}
	require.Eventually(t, func() bool {
		r.batcher.mu.Lock()
		defer r.batcher.mu.Unlock()
		return r.batcher.inFlight == protocol.MaxInFlight
	}, 5*time.Second, time.Millisecond, "the slots are taken")
	deadline, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := holds[protocol.MaxInFlight].Release(deadline)
	took := time.Since(start)
	srv.Resume(t)
	inFlight.Wait()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Less(t, took, 5*time.Second, "bounded by its ctx, not by the calls before it (ReadTimeout 10 s)")
}
