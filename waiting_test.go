package lockreg

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg/internal/protocol"
	"github.com/lockreg/lockreg/internal/redisstat"
	"github.com/lockreg/lockreg/internal/redistest"
)

func TestReleaseHandsOverWithoutWaitingForTheLease(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	r1 := newRegistry(t, client, WithExpireAfter(1000*time.Second))
	r2 := newRegistry(t, client, WithExpireAfter(1000*time.Second))
	for range 3 {
		r1.Obtain("k").Lock()
		require.False(t, r2.Obtain("k").TryLock())
		r1.Obtain("k").Unlock()
		require.True(t, r2.Obtain("k").TryLock(), "free right after unlock, not after the 1000s lease")
		r2.Obtain("k").Unlock()
	}
}

func TestNotificationWakesARemoteWaiterAtOnce(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	holder := newRegistry(t, client)
	waiter := newRegistry(t, client, WithRetryInterval(5*time.Second))
	holder.Obtain("k").Lock()

	taken := lockInBackground(context.Background(), waiter.Obtain("k"))
	waitUntilWaiting(t, waiter)
	released := time.Now()
	holder.Obtain("k").Unlock()
	at, ok := <-taken
	require.True(t, ok, "the waiter acquired")
	latency := at.Sub(released)
	t.Logf("release to acquisition: %v (retry interval 5s)", latency)
	require.Less(t, latency, time.Second, "woken by the notification, not the 5s retry")
	require.Equal(t, int64(1), waiter.Stats().Notifications)
}

// An acquisition makes its wake-up channel only when it first waits (an
// uncontended one never does): a release notification that comes between
// its start and that wait is kept for it, and one from before its start,
// which says nothing new, is not.
func TestAWakeUpBeforeTheFirstWaitIsKept(t *testing.T) {
	woken := func(l *localLock, w *wakeup) bool {
		select {
		case <-l.wakeChannel(w):
			return true
		default:
			return false
		}
	}
	var l localLock
	var w wakeup
	l.wakeUp()
	l.acquiring(&w)
	require.False(t, woken(&l, &w), "a notification from before the acquisition")
	l.wakeUp()
	require.True(t, woken(&l, &w), "a notification before the first wait")

	var next wakeup
	l.acquiring(&next)
	l.wakeUp()
	l.acquired(&w) // the first acquisition ends after the next began
	require.True(t, woken(&l, &next), "the next acquisition keeps its wake-up")
}

func TestLostNotificationCostsOnlyTheRetry(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	holder := newRegistry(t, srv.Client(t))
	const retry = 300 * time.Millisecond
	waiter := newRegistry(t, srv.Client(t), WithRetryInterval(retry))
	holder.Obtain("k").Lock()

	taken := lockInBackground(ctx, waiter.Obtain("k"))
	waitUntilWaiting(t, waiter)
	requireTracking(t, holder, waiter)
	killed, err := admin.ClientKillByFilter(ctx, "TYPE", "pubsub").Result()
	require.NoError(t, err)
	require.Equal(t, int64(4), killed, "the waiter's subscription and the holder's, and their trackers' targets")
	holder.Obtain("k").Unlock()
	select {
	case _, ok := <-taken:
		require.True(t, ok, "the waiter acquired")
	case <-time.After(2*retry + time.Second):
		t.Fatal("the waiter never acquired after its notification was lost")
	}
}

// TestResubscribedWaiterTriesAtOnce: a grant published while a waiter's
// subscription is down is lost, though the key is the waiter's. When
// go-redis resubscribes, the registry wakes its waiters, and the next
// attempt finds the key, instead of a retry interval later.
func TestResubscribedWaiterTriesAtOnce(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	holder := newRegistry(t, srv.Client(t))
	const retry = 5 * time.Second
	waiter := newRegistry(t, srv.Client(t), WithRetryInterval(retry))
	held := holder.Obtain("k")
	held.Lock()

	taken := lockInBackground(ctx, waiter.Obtain("k"))
	waitUntilWaiting(t, waiter)
	// The grant, without its message.
	require.NoError(t, admin.Set(ctx, held.keys().Lock(), waiter.clientID, time.Minute).Err())
	requireTracking(t, holder, waiter)
	killed, err := admin.ClientKillByFilter(ctx, "TYPE", "pubsub").Result()
	require.NoError(t, err)
	require.Equal(t, int64(4), killed, "the waiter's subscription and the holder's, and their trackers' targets")
	select {
	case _, ok := <-taken:
		require.True(t, ok, "the waiter acquired")
	case <-time.After(retry / 2):
		t.Fatalf("the waiter did not try again when its subscription came back (retry interval %v)", retry)
	}
	require.ErrorIs(t, held.UnlockContext(ctx), ErrLockLost)
}

func TestOneSubscriptionPerRegistryWhateverTheKeys(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	holder := newRegistry(t, srv.Client(t))
	waiters := []*Registry{newRegistry(t, srv.Client(t)), newRegistry(t, srv.Client(t))}
	const keys = 50
	for i := range keys {
		holder.Obtain("k" + strconv.Itoa(i)).Lock()
	}
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, w := range waiters {
		for i := range keys {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = w.Obtain("k" + strconv.Itoa(i)).LockContext(wctx)
			}()
		}
	}
	// A registry subscribes after its first failed attempt: wait for both
	// subscriptions too, or the count below can run before the second.
	require.Eventually(t, func() bool {
		return waiters[0].Stats().FailedAttempts >= keys && waiters[1].Stats().FailedAttempts >= keys &&
			waiters[0].notes.subscribed.Load() && waiters[1].notes.subscribed.Load() && holder.notes.subscribed.Load()
	}, 5*time.Second, time.Millisecond)

	subs, err := admin.PubSubNumSub(ctx, protocol.ReleaseChannel(waiters[0].namespace)).Result()
	require.NoError(t, err)
	require.Equal(t, int64(3), subs[protocol.ReleaseChannel(waiters[0].namespace)], "one subscription per registry, for 50 keys each: the waiters' and the holder's")
	list, err := admin.ClientList(ctx).Result()
	require.NoError(t, err)
	require.Equal(t, 6, strings.Count(list, "sub=2"), "per registry, one subscribed connection to the shared channel and its grant channel, and its tracker's target, to the invalidations and its forced unlocks")
	for _, r := range append(waiters, holder) {
		grants := protocol.GrantChannel(r.namespace, r.clientID)
		subs, err := admin.PubSubNumSub(ctx, grants).Result()
		require.NoError(t, err)
		require.Equal(t, int64(1), subs[grants], "one subscription to a registry's grants, whatever the keys")
	}
	require.Equal(t, 0, strings.Count(list, "psub=1"), "no patterns")
	cancel()
	wg.Wait()
}

func TestWithoutPubSubWaitersOnlyPoll(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	holder := newRegistry(t, srv.Client(t))
	waiter := newRegistry(t, srv.Client(t), WithPubSub(false), WithRetryInterval(50*time.Millisecond))
	holder.Obtain("k").Lock()
	taken := lockInBackground(ctx, waiter.Obtain("k"))
	waitUntilWaiting(t, waiter)
	holder.Obtain("k").Unlock()
	_, ok := <-taken
	require.True(t, ok)
	subs, err := admin.PubSubNumSub(ctx, protocol.ReleaseChannel(holder.namespace)).Result()
	require.NoError(t, err)
	require.Equal(t, int64(1), subs[protocol.ReleaseChannel(holder.namespace)], "the holder's subscription alone")
	require.False(t, waiter.notes.subscribed.Load())
	require.Zero(t, waiter.Stats().Notifications)
}

// inFlight records, through its go-redis hook, how many acquisition
// scripts run at once.
type inFlight struct {
	now, max, total atomic.Int64
}

func (f *inFlight) hook() redis.Hook {
	return redistest.Hook{Process: func(next redis.ProcessHook) redis.ProcessHook {
		return func(ctx context.Context, cmd redis.Cmder) error {
			if cmd.Name() != "evalsha" && cmd.Name() != "eval" {
				return next(ctx, cmd)
			}
			f.total.Add(1)
			n := f.now.Add(1)
			for m := f.max.Load(); n > m && !f.max.CompareAndSwap(m, n); m = f.max.Load() {
			}
			// Widen the window in which a second caller would overlap.
			time.Sleep(2 * time.Millisecond)
			defer f.now.Add(-1)
			return next(ctx, cmd)
		}
	}}
}

func TestOnlyOneGoroutinePerRegistryPollsRedis(t *testing.T) {
	srv := redistest.Shared(t)
	holder := newRegistry(t, srv.Client(t))
	holder.Obtain("k").Lock()
	defer holder.Obtain("k").Unlock()

	var flight inFlight
	const interval = 20 * time.Millisecond
	waiters := newRegistry(t, srv.Client(t, flight.hook()), WithRetryInterval(interval))
	ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
	defer cancel()
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			assert.ErrorIs(t, waiters.Obtain("k").LockContext(ctx), ErrNotObtained)
		}()
	}
	wg.Wait()
	require.Equal(t, int64(1), flight.max.Load(), "at most one goroutine per registry and key talks to Redis")
	// One poller makes about 400ms/(20ms+2ms) attempts; eight would make
	// eight times as many.
	require.Less(t, flight.total.Load(), int64(2*400/20), "attempts grow with time, not with waiters")
	require.Greater(t, flight.total.Load(), int64(400/20/4), "the poller keeps retrying")
	requireNoLocalState(t, waiters)
}

func TestLocalHandoffIsBoundedSoRemoteWaitersGetTheirTurn(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	hot := newRegistry(t, client)
	remote := newRegistry(t, client)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lock := hot.Obtain("k")
			for {
				select {
				case <-stop:
					return
				default:
				}
				lock.Lock()
				lock.Unlock()
			}
		}()
	}
	defer func() { close(stop); wg.Wait() }()
	require.Eventually(t, func() bool { return hot.Stats().LocalHandoffs > 100 }, 5*time.Second, time.Millisecond)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for range 5 {
		start := time.Now()
		lock := remote.Obtain("k")
		require.NoError(t, lock.LockContext(ctx), "the remote waiter is not starved")
		waited := time.Since(start)
		lock.Unlock()
		t.Logf("remote waiter waited %v while 64 local goroutines hammered the key", waited)
		require.Less(t, waited, time.Second, "within the hand-off bound (16 or 10ms) plus a few round trips")
	}
}

func TestLocalHandoffRaisesTheToken(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client)
	other := newRegistry(t, client)
	lock := r.Obtain("k")
	var (
		mu     sync.Mutex
		tokens []int64
	)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				lock.Lock()
				mu.Lock()
				tokens = append(tokens, mustToken(t, lock))
				mu.Unlock()
				lock.Unlock()
			}
		}()
	}
	wg.Wait()
	require.Positive(t, r.Stats().LocalHandoffs)
	require.True(t, slices.IsSorted(tokens), "tokens rise with every hold")
	require.Len(t, slices.Compact(slices.Clone(tokens)), len(tokens), "and never repeat")
	// The release stored the last handed-out token: the next registry's
	// token is above it even within the same microsecond.
	other.Obtain("k").Lock()
	require.Greater(t, mustToken(t, other.Obtain("k")), tokens[len(tokens)-1])
	other.Obtain("k").Unlock()
}

func TestLocalWaitersAreServedInArrivalOrder(t *testing.T) {
	r := newRegistry(t, redistest.Shared(t).Client(t), WithLocalHandoff(0, 0))
	lock := r.Obtain("k")
	lock.Lock()
	local, _ := r.locals.m.Load("k")
	queued := func() int {
		local.mu.Lock()
		defer local.mu.Unlock()
		return len(local.queue)
	}
	var (
		mu    sync.Mutex
		order []int
		wg    sync.WaitGroup
	)
	const waiters = 10
	for i := range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lock.Lock()
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			lock.Unlock()
		}()
		require.Eventually(t, func() bool { return queued() == i+1 }, time.Second, time.Millisecond)
	}
	lock.Unlock()
	wg.Wait()
	require.Equal(t, []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, order)
}

func TestLocalWaitsStayNearTheMeanUnderContention(t *testing.T) {
	r := newRegistry(t, redistest.Shared(t).Client(t))
	var (
		mu    sync.Mutex
		waits []time.Duration
		wg    sync.WaitGroup
	)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lock := r.Obtain("k")
			for range 100 {
				start := time.Now()
				lock.Lock()
				w := time.Since(start)
				time.Sleep(100 * time.Microsecond)
				lock.Unlock()
				mu.Lock()
				waits = append(waits, w)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	var total time.Duration
	for _, w := range waits {
		total += w
	}
	mean := total / time.Duration(len(waits))
	longest := slices.Max(waits)
	t.Logf("%d waits: mean %v, longest %v (%.1fx)", len(waits), mean, longest, float64(longest)/float64(mean))
	// FIFO service bounds a wait by the seven goroutines ahead; the slack
	// covers Redis round trips every 16 hand-offs and a noisy machine.
	require.Less(t, longest, 10*mean)
}

func TestStatsMatchTheCommandsSent(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	var counter redisstat.Counter
	client := srv.Client(t, &counter)
	r := newRegistry(t, client, WithExpireAfter(300*time.Millisecond), WithRetryInterval(20*time.Millisecond))
	other := newRegistry(t, srv.Client(t))
	// Loaded, the scripts draw no NOSCRIPT retries below.
	loadScripts(t, client)
	calls := func() int64 { c := counter.Commands(); return c["set"] + c["evalsha"] + c["eval"] }
	before, statsBefore := calls(), r.Stats()

	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lock := r.Obtain("k")
			for range 20 {
				assert.NoError(t, lock.LockContext(ctx))
				time.Sleep(time.Millisecond)
				assert.NoError(t, lock.UnlockContext(ctx))
			}
		}()
	}
	for range 5 {
		lock := other.Obtain("k")
		lock.Lock()
		time.Sleep(30 * time.Millisecond)
		lock.Unlock()
	}
	hold := r.Obtain("held")
	hold.Lock()
	time.Sleep(400 * time.Millisecond) // renewals
	hold.Unlock()
	wg.Wait()

	s := r.Stats()
	counted := (s.AcquireCalls - statsBefore.AcquireCalls) + (s.ReleaseCalls - statsBefore.ReleaseCalls)
	if !r.tracking.on.Load() {
		// A tracked key is renewed on the tracking connection
		// (trackedrenewal.go), which the client's hooks do not see.
		counted += s.RenewCalls - statsBefore.RenewCalls
	}
	require.Equal(t, calls()-before, counted, "every call is in Stats, pipelined or not")
	require.Positive(t, counter.Commands()["set"], "uncontended attempts are plain SETs")
	require.Equal(t, statsBefore.Acquisitions+8*20+1, s.Acquisitions)
	require.Positive(t, s.LocalHandoffs)
	require.Positive(t, s.FailedAttempts)
	require.Positive(t, s.RenewCalls)
	require.Positive(t, s.Notifications, "other's releases woke r's waiter")
	require.Zero(t, s.Held)
	require.Zero(t, s.Tracked)
	require.Equal(t, s.Acquisitions, s.Wait.Count)
	require.Positive(t, s.Wait.Max)
	require.LessOrEqual(t, s.Wait.Mean, s.Wait.Max)
	require.LessOrEqual(t, s.Wait.P50, s.Wait.P99)

	hold.Lock()
	require.Equal(t, int64(1), r.Stats().Held)
	require.Equal(t, 1, r.Stats().Tracked)
	hold.Unlock()
}

var handoffOptionCases = []struct {
	n    int
	d    time.Duration
	want string
}{
	{-1, time.Millisecond, "WithLocalHandoff(-1, 1ms)"},
	{4, 0, "WithLocalHandoff(4, 0s)"},
}

func TestLocalHandoffOptionIsValidated(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	for _, tc := range handoffOptionCases {
		_, err := New(client, "k", WithLocalHandoff(tc.n, tc.d))
		require.ErrorIs(t, err, ErrInvalidOption)
		require.ErrorContains(t, err, tc.want)
	}
	r, err := New(client, "k", WithLocalHandoff(0, 0))
	require.NoError(t, err)
	require.NoError(t, r.Close())
}

// TestAWaiterThatQueuesOnceTheRegistryRefusesIsRefused: Close and Shutdown
// hand the queued waiters ErrClosed (refuseWaiters); a goroutine that
// reaches the queue after that must not wait for a hand-off that nothing
// will make.
func TestAWaiterThatQueuesOnceTheRegistryRefusesIsRefused(t *testing.T) {
	closing := make(chan struct{})
	l := &localLock{locked: true}
	queued := make(chan error, 1)
	go func() {
		_, err := l.lock(context.Background(), closing, true)
		queued <- err
	}()
	require.Eventually(t, func() bool { l.mu.Lock(); defer l.mu.Unlock(); return len(l.queue) == 1 }, time.Second, time.Millisecond)
	close(closing)
	l.refuseWaiters()
	require.ErrorIs(t, <-queued, ErrClosed, "a queued waiter")

	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err := l.lock(ctx, closing, true)
	require.ErrorIs(t, err, ErrClosed, "a waiter that comes after")
	require.True(t, l.locked, "the mutex stays with its owner")
}
