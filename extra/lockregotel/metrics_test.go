package lockregotel_test

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"

	"github.com/lockreg/lockreg"
	"github.com/lockreg/lockreg/extra/lockregotel"
	"github.com/lockreg/lockreg/internal/redistest"
)

// waitsInRedis waits until r has found key held in Redis and marked itself
// as waiting: a release of another registry will grant it the key.
func waitsInRedis(t *testing.T, r *lockreg.Registry, failedBefore int64) {
	t.Helper()
	require.Eventually(t, func() bool { return r.Stats().FailedAttempts > failedBefore }, 5*time.Second, time.Millisecond)
}

// subscribed waits until a registry of namespace has subscribed to its
// release notifications (docs/PROTOCOL.md), as one does once it holds a
// key.
func subscribed(t *testing.T, client *redis.Client, namespace string) {
	t.Helper()
	channel := namespace + ":released"
	require.Eventually(t, func() bool {
		return client.PubSubNumSub(context.Background(), channel).Val()[channel] > 0
	}, 5*time.Second, time.Millisecond)
}

// trackedKeys is how many keys the server tracks for its clients.
func trackedKeys(t *testing.T, client *redis.Client) int64 {
	t.Helper()
	info, err := client.Info(context.Background(), "stats").Result()
	require.NoError(t, err)
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "tracking_total_keys:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			require.NoError(t, err)
			return n
		}
	}
	t.Fatal("INFO stats has no tracking_total_keys")
	return 0
}

// waitsLocally waits until a goroutine waits for a local mutex, in line
// for a hand-off. A Registry does not tell; the goroutine's stack does.
func waitsLocally(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		buf := make([]byte, 1<<20)
		return strings.Contains(string(buf[:runtime.Stack(buf, true)]), "lockreg.(*localLock).lock(")
	}, 5*time.Second, time.Millisecond)
}

// acquireIn acquires key of r in a goroutine of its own, and sends the
// hold, or nil, on the channel it returns.
func acquireIn(t *testing.T, ctx context.Context, r *lockreg.Registry, key string) <-chan *lockreg.Hold {
	held := make(chan *lockreg.Hold, 1)
	go func() {
		h, err := r.Obtain(key).Acquire(ctx)
		assert.NoError(t, err)
		held <- h
	}()
	return held
}

// requireLost waits for h's loss, and for the metrics of it: the hooks
// hear of a loss just after Lost closes.
func (m *meters) requireLost(t *testing.T, h *lockreg.Hold) {
	t.Helper()
	requireFires(t, h.Lost(), 5*time.Second, "the hold was lost")
	require.Eventually(t, func() bool {
		points := m.collect(t)
		return total(t, points["lockreg.lost"]).value > 0 && total(t, points["lockreg.hold.duration"]).count > 0
	}, time.Second, time.Millisecond)
}

// TestMetricsOfAcquisitionsByPath: a key granted by another registry's
// release, handed off to the next local waiter, then taken from Redis;
// every hold released; Redis calls as Stats counts them.
func TestMetricsOfAcquisitionsByPath(t *testing.T) {
	ctx := context.Background()
	r, other, namespace, client := contenders(t, lockreg.WithLocalHandoff(16, time.Hour))
	m := newMeters(t, namespace)
	m.instrument(t, r)

	h, err := r.Obtain("first").Acquire(ctx)
	require.NoError(t, err)
	_, err = h.Token(ctx)
	require.NoError(t, err)
	require.NoError(t, h.Release(ctx))
	subscribed(t, client, namespace) // only r is: it hears grants from now on

	held, err := other.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	granted := acquireIn(t, ctx, r, "k")
	waitsInRedis(t, r, r.Stats().FailedAttempts)
	handedOff := acquireIn(t, ctx, r, "k")
	waitsLocally(t)
	require.NoError(t, held.Release(ctx))
	h = <-granted
	require.NotNil(t, h)
	require.EqualValues(t, 1, total(t, m.collect(t)["lockreg.holds"]).value)
	require.NoError(t, h.Release(ctx))
	h = <-handedOff
	require.NotNil(t, h)
	require.NoError(t, h.Release(ctx))

	points := m.collect(t)
	acquired := points["lockreg.acquire.duration"]
	require.Len(t, acquired, 3)
	for _, path := range []string{"grant", "handoff", "redis"} {
		require.EqualValues(t, 1, total(t, acquired, "lockreg.outcome", "acquired", "lockreg.path", path).count, path)
	}
	require.Positive(t, total(t, acquired, "lockreg.path", "grant").sum, "the grant waited")
	require.EqualValues(t, 0, total(t, points["lockreg.holds"]).value)
	require.EqualValues(t, 3, total(t, points["lockreg.hold.duration"]).count)
	require.Empty(t, points["lockreg.lost"])
	stats, calls := r.Stats(), points["lockreg.redis.calls"]
	require.Equal(t, stats.AcquireCalls, total(t, calls, "lockreg.operation", "acquire").value)
	require.Equal(t, stats.ReleaseCalls, total(t, calls, "lockreg.operation", "release").value)
	require.EqualValues(t, 1, total(t, calls, "lockreg.operation", "token").value)
}

// TestMetricsOfFailedAcquisitions: a timeout while another registry holds
// the key, and a TryLock, are not obtained; the abandoned wait withdrew
// its mark from Redis.
func TestMetricsOfFailedAcquisitions(t *testing.T) {
	r, other, namespace, _ := contenders(t, lockreg.WithRetryInterval(20*time.Millisecond))
	m := newMeters(t, namespace)
	m.instrument(t, r)

	timesOut(t, r, other, "k")
	require.False(t, r.Obtain("k").TryLock())

	points := m.collect(t)
	failed := points["lockreg.acquire.duration"]
	require.Len(t, failed, 1, "one series: no path")
	require.Equal(t, map[string]string{"lockreg.registry": namespace, "lockreg.outcome": "not_obtained"}, failed[0].attrs)
	require.EqualValues(t, 2, failed[0].count)
	require.GreaterOrEqual(t, failed[0].sum, 0.1, "the timeout waited 100ms")
	require.EqualValues(t, 0, total(t, points["lockreg.holds"]).value, "nothing was held")
	require.Empty(t, points["lockreg.hold.duration"])
	// The abandoned acquisition withdraws its mark in the background.
	require.Eventually(t, func() bool {
		return total(t, m.collect(t)["lockreg.redis.calls"], "lockreg.operation", "withdraw").value > 0
	}, 5*time.Second, time.Millisecond)
}

// TestMetricsOfLosses: a hold lost for each cause the registry tells apart
// (and one its release found) counts once, and its duration ends at the
// loss; its owner's release ends it in lockreg.holds.
func TestMetricsOfLosses(t *testing.T) {
	const lease = 300 * time.Millisecond
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	var trackedBefore int64 // the server's tracked keys before the hold
	for _, tc := range []struct {
		name, cause string
		opts        []lockreg.Option
		// lose makes the hold of r (of namespace) lose its key; Lost
		// fires unless silent.
		lose   func(t *testing.T, namespace string)
		silent bool
	}{{
		name: "deleted", cause: "deleted",
		lose: func(t *testing.T, namespace string) {
			require.NoError(t, client.Del(ctx, namespace+":{k}").Err())
		},
	}, {
		// An operator's registry forces the key open; the holder hears of
		// it through its subscription. Its lease is long, so that no
		// renewal finds the key gone first (a deletion, to it).
		name: "forced", cause: "forced", opts: []lockreg.Option{lockreg.WithExpireAfter(time.Minute)},
		lose: func(t *testing.T, namespace string) {
			subscribed(t, client, namespace)
			// Tracking has read the key: a read after the DEL would find
			// it gone before the forced-unlock note came, and say deleted.
			require.Eventually(t, func() bool { return trackedKeys(t, client) > trackedBefore }, 5*time.Second, time.Millisecond)
			found, err := openRegistry(t, client, namespace).ForceUnlock(ctx, "k")
			require.NoError(t, err)
			require.True(t, found)
		},
	}, {
		name: "expired", cause: "expired", opts: []lockreg.Option{lockreg.WithRenewal(false)},
		lose: func(*testing.T, string) {}, // the lease runs out unrenewed
	}, {
		name: "max_hold", cause: "max_hold", opts: []lockreg.Option{lockreg.WithMaxHold(10 * time.Millisecond)},
		lose: func(*testing.T, string) {},
	}, {
		// Without renewal, nothing looks at the key before the release,
		// which finds it not the registry's.
		name: "found by the release", cause: "deleted", opts: []lockreg.Option{lockreg.WithRenewal(false), lockreg.WithExpireAfter(time.Minute)},
		lose: func(t *testing.T, namespace string) {
			require.NoError(t, client.Del(ctx, namespace+":{k}").Err())
		},
		silent: true,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			opts := append([]lockreg.Option{lockreg.WithExpireAfter(lease), lockreg.WithRetryInterval(20 * time.Millisecond)}, tc.opts...)
			r, namespace := newRegistry(t, client, opts...)
			m := newMeters(t, namespace)
			m.instrument(t, r)
			trackedBefore = trackedKeys(t, client)
			h, err := r.Obtain("k").Acquire(ctx)
			require.NoError(t, err)
			tc.lose(t, namespace)
			if !tc.silent {
				m.requireLost(t, h)
				points := m.collect(t)
				require.EqualValues(t, 1, total(t, points["lockreg.holds"]).value, "until its release")
				require.Equal(t, []point{{attrs: map[string]string{"lockreg.registry": namespace, "lockreg.cause": tc.cause}, value: 1}}, points["lockreg.lost"])
			} else {
				require.Empty(t, m.collect(t)["lockreg.lost"], "nothing has looked at the key yet")
			}
			require.ErrorIs(t, h.Release(ctx), lockreg.ErrLockLost)

			points := m.collect(t)
			require.EqualValues(t, 0, total(t, points["lockreg.holds"]).value)
			require.Equal(t, []point{{attrs: map[string]string{"lockreg.registry": namespace, "lockreg.cause": tc.cause}, value: 1}}, points["lockreg.lost"])
			ended := points["lockreg.hold.duration"]
			require.Len(t, ended, 1, "measured once, at the loss")
			require.Equal(t, tc.cause, ended[0].attrs["lockreg.cause"])
			require.EqualValues(t, 1, ended[0].count)
		})
	}
}

// TestMetricsOfARestart: Redis came back from a restart without the key;
// the holder hears of it when its subscription reconnects.
func TestMetricsOfARestart(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	client := srv.Client(t)
	r, namespace := newRegistry(t, client)
	m := newMeters(t, namespace)
	m.instrument(t, r)
	h, err := r.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	subscribed(t, client, namespace)
	srv.Stop(t)
	time.Sleep(time.Second) // down for a while: the subscription retries meanwhile
	require.NoError(t, srv.Relaunch())
	relaunched := time.Now()
	m.requireLost(t, h) // the holder heard of the restart
	// A go-redis pool that failed to dial probes the server once a second,
	// in a goroutine of its own that ends at its first success, or at its
	// next probe after Close: one still asleep when the package's tests end
	// is taken for a leak (TestMain). Its first probe after the relaunch
	// succeeds.
	defer func() { time.Sleep(time.Until(relaunched.Add(1100 * time.Millisecond))) }()
	require.ErrorIs(t, h.Release(ctx), lockreg.ErrLockLost)

	points := m.collect(t)
	require.Equal(t, []point{{attrs: map[string]string{"lockreg.registry": namespace, "lockreg.cause": "restart"}, value: 1}}, points["lockreg.lost"])
	require.EqualValues(t, 0, total(t, points["lockreg.holds"]).value)
	// With tracking on, the registry checks its keys on its tracking
	// connection ("track"); without, on the client ("check").
	checked := total(t, points["lockreg.redis.calls"], "lockreg.operation", "check").value +
		total(t, points["lockreg.redis.calls"], "lockreg.operation", "track").value
	require.Positive(t, checked, "the key was checked")
}

// TestMetricsOfClose: Close ends a waiting acquisition (closed) and loses
// the holds (closed); later acquisitions are refused at once, unmeasured.
func TestMetricsOfClose(t *testing.T) {
	ctx := context.Background()
	r, other, namespace, _ := contenders(t)
	m := newMeters(t, namespace)
	m.instrument(t, r)

	h, err := r.Obtain("mine").Acquire(ctx)
	require.NoError(t, err)
	_, err = other.Obtain("theirs").Acquire(ctx)
	require.NoError(t, err)
	refused := make(chan error, 1)
	go func() {
		_, err := r.Obtain("theirs").Acquire(ctx)
		refused <- err
	}()
	waitsInRedis(t, r, 0)
	require.NoError(t, r.Close())
	require.ErrorIs(t, <-refused, lockreg.ErrClosed)
	requireFires(t, h.Lost(), time.Second, "Close loses the holds")
	_, err = r.Obtain("later").Acquire(ctx)
	require.ErrorIs(t, err, lockreg.ErrClosed)
	require.ErrorIs(t, h.Release(ctx), lockreg.ErrLockLost)

	points := m.collect(t)
	require.EqualValues(t, 1, total(t, points["lockreg.acquire.duration"], "lockreg.outcome", "closed").count)
	require.EqualValues(t, 2, total(t, points["lockreg.acquire.duration"]).count, "the first, and the one Close ended")
	require.Equal(t, []point{{attrs: map[string]string{"lockreg.registry": namespace, "lockreg.cause": "closed"}, value: 1}}, points["lockreg.lost"])
	require.EqualValues(t, 0, total(t, points["lockreg.holds"]).value)
}

// TestAClosedRegistryIsLetGo: a closed registry is no longer observed,
// and its meter provider does not keep it: an application that makes and
// closes registries (one per tenant, or per test) leaks none.
func TestAClosedRegistryIsLetGo(t *testing.T) {
	ctx := context.Background()
	// Not openRegistry's: its cleanup would keep the registry.
	namespace := fmt.Sprintf("lockregotel-test:%s", t.Name())
	r, err := lockreg.New(redistest.Shared(t).Client(t), namespace, lockreg.WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	m := newMeters(t, namespace)
	m.instrument(t, r)
	h, err := r.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	require.NoError(t, h.Release(ctx))
	require.NotEmpty(t, m.collect(t)["lockreg.redis.calls"])
	freed := make(chan struct{})
	runtime.AddCleanup(r, func(freed chan struct{}) { close(freed) }, freed)
	require.NoError(t, r.Close())
	r, h = nil, nil // for the collector
	require.Eventually(t, func() bool {
		points := m.collect(t)
		return len(points["lockreg.holds"]) == 0 && len(points["lockreg.redis.calls"]) == 0
	}, 5*time.Second, 10*time.Millisecond, "the closed registry is still observed")
	require.Eventually(t, func() bool {
		runtime.GC()
		select {
		case <-freed:
			return true
		default:
			return false
		}
	}, 5*time.Second, 10*time.Millisecond, "the meter provider keeps the closed registry")
}

// TestMetricsWithLockKeysAndAttributes: with WithLockKeys every
// measurement of a lock names its key; WithAttributes' go on all.
func TestMetricsWithLockKeysAndAttributes(t *testing.T) {
	ctx := context.Background()
	r, namespace := newRegistry(t, redistest.Shared(t).Client(t))
	m := newMeters(t, namespace)
	m.keys = true
	m.instrument(t, r, lockregotel.WithLockKeys(), lockregotel.WithAttributes(attribute.String("deployment", "blue")))
	for _, key := range []string{"order-42", "order-43"} {
		require.NoError(t, r.Do(ctx, key, func(context.Context) error {
			want := point{attrs: map[string]string{"lockreg.registry": namespace, "lockreg.key": key, "deployment": "blue"}, value: 1}
			require.Equal(t, []point{want}, m.collect(t)["lockreg.holds"])
			return nil
		}))
	}

	points := m.collect(t)
	for _, key := range []string{"order-42", "order-43"} {
		for _, name := range []string{"lockreg.acquire.duration", "lockreg.hold.duration"} {
			require.EqualValues(t, 1, total(t, points[name], "lockreg.key", key, "deployment", "blue").count, name)
		}
	}
	require.Empty(t, points["lockreg.holds"], "a key held no more has no series")
	require.Positive(t, total(t, points["lockreg.redis.calls"], "deployment", "blue").value)
}

// TestMetricsOfAHoldTakenBeforeInstrumenting: a registry instrumented
// while it holds a key reports what it does from then on: the release of
// the earlier hold does not take lockreg.holds below zero, with or
// without WithLockKeys.
func TestMetricsOfAHoldTakenBeforeInstrumenting(t *testing.T) {
	for _, keys := range []bool{false, true} {
		t.Run(fmt.Sprint("keys=", keys), func(t *testing.T) {
			ctx := context.Background()
			r, namespace := newRegistry(t, redistest.Shared(t).Client(t))
			h, err := r.Obtain("k").Acquire(ctx)
			require.NoError(t, err)
			m := newMeters(t, namespace)
			m.keys = keys
			var opts []lockregotel.Option
			if keys {
				opts = append(opts, lockregotel.WithLockKeys())
			}
			m.instrument(t, r, opts...)
			require.NoError(t, h.Release(ctx))
			require.NoError(t, r.Do(ctx, "k", func(context.Context) error {
				require.EqualValues(t, 1, total(t, m.collect(t)["lockreg.holds"]).value)
				return nil
			}))
			for _, p := range m.collect(t)["lockreg.holds"] {
				require.Zero(t, p.value, "%v", p.attrs)
			}
		})
	}
}
