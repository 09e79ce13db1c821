package lockregtest_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/lockreg/lockreg"
	"github.com/lockreg/lockreg/extra/lockregtest"
	"github.com/lockreg/lockreg/internal/redistest"
)

// TestLoseFailsTheTestUnlessTheRegistryHoldsTheKey: Lose fails the test,
// saying why, when the registry does not hold the key.
func TestLoseFailsTheTestUnlessTheRegistryHoldsTheKey(t *testing.T) {
	onBoth(t, func(t *testing.T, srv server) {
		ctx := context.Background()
		a := srv.newRegistry(t)
		b := lockregtest.Another(t, a)
		lose := func(r *lockreg.Registry, key string) string {
			return fatalOf(t, func(t testing.TB) { lockregtest.Lose(t, r, key) })
		}
		one, two := t.Name()+"#1", t.Name()+"#2"

		require.Equal(t, `lockregtest.Lose: `+one+` does not hold "never" (nobody holds it)`, lose(a, "never"))

		h, err := b.Obtain("theirs").Acquire(ctx)
		require.NoError(t, err)
		holder(t, a, "theirs")
		require.Equal(t, `lockregtest.Lose: `+one+` does not hold "theirs" (it is held by `+two+`)`, lose(a, "theirs"))
		require.NoError(t, h.Release(ctx))

		h, err = a.Obtain("released").Acquire(ctx)
		require.NoError(t, err)
		require.NoError(t, h.Release(ctx))
		require.Equal(t, `lockregtest.Lose: `+one+` does not hold "released" (nobody holds it)`, lose(a, "released"))

		h, err = a.Obtain("lost").Acquire(ctx)
		require.NoError(t, err)
		require.Empty(t, lose(a, "lost"))
		require.Equal(t, `lockregtest.Lose: `+one+` does not hold "lost" (nobody holds it)`, lose(a, "lost"), "a hold lost already")
		require.ErrorIs(t, h.Release(ctx), lockreg.ErrLockLost)
	})
}

// TestLoseLeavesAnotherRegistrysHold: a registry whose hold was forced
// open unnoticed (pub/sub off, no tracking on the embedded server), and
// whose key another registry took since, under owner names of the user's:
// Lose fails the test, and leaves the other registry's hold alone.
func TestLoseLeavesAnotherRegistrysHold(t *testing.T) {
	ctx := context.Background()
	a := lockregtest.New(t, lockreg.WithOwner("worker-a"), lockreg.WithPubSub(false))
	b := lockregtest.Another(t, a, lockreg.WithOwner("worker-b"))
	_, err := a.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	forced, err := b.ForceUnlock(ctx, "k")
	require.NoError(t, err)
	require.True(t, forced)
	taken, err := b.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	holder(t, a, "k") // worker-b's owner name is written soon after, not with, its key
	require.Equal(t, `lockregtest.Lose: `+t.Name()+`#1 holds "k", but in Redis it is held by worker-b: its hold is lost already, and it has not noticed yet`,
		fatalOf(t, func(t testing.TB) { lockregtest.Lose(t, a, "k") }))
	select {
	case <-taken.Lost():
		t.Fatal("Lose forced worker-b's hold open")
	default:
	}
}

// TestLoseOfAClosedRegistrysKey: Close leaves its keys held in Redis
// until their leases run out, and ends their holds: Lose fails the test,
// saying that the key is the registry's still, but that no hold of it is
// live (not "it is held by" the very registry it says does not hold it).
func TestLoseOfAClosedRegistrysKey(t *testing.T) {
	ctx := context.Background()
	r := lockregtest.New(t)
	h, err := r.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	require.NoError(t, r.Close())
	require.ErrorIs(t, h.Err(), lockreg.ErrLockLost)
	require.Equal(t, `lockregtest.Lose: `+t.Name()+`#1 does not hold "k" (its key is in Redis still, left by a hold that ended unreleased: its registry was closed, or it lost the hold)`,
		fatalOf(t, func(t testing.TB) { lockregtest.Lose(t, r, "k") }))
}

// TestLoseTellsAHolderThatRedisTellsNothing: a registry with pub/sub off
// on the embedded server, which has no CLIENT TRACKING, would hear of a
// deleted key only at its next renewal, a third of its lease: with a
// lease of a minute, past Lose's 5 seconds. Lose forces the key open from
// the holder's own registry, which tells the holder at once.
func TestLoseTellsAHolderThatRedisTellsNothing(t *testing.T) {
	ctx := context.Background()
	r := lockregtest.New(t, lockreg.WithPubSub(false), lockreg.WithExpireAfter(time.Minute))
	h, err := r.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	lockregtest.Lose(t, r, "k")
	require.ErrorIs(t, h.Err(), lockreg.ErrLockLost)
	require.ErrorContains(t, h.Err(), "forced")
	require.ErrorIs(t, h.Release(ctx), lockreg.ErrLockLost)
}

// TestLoseAfterAReleaseThatPanicked: the release of a hold Lose took,
// which a hook of the user's cut short by a panic, ends that hold once
// for the kit: Lose takes the next hold of the key as it would any.
func TestLoseAfterAReleaseThatPanicked(t *testing.T) {
	ctx := context.Background()
	r := lockregtest.New(t)
	var panicking atomic.Bool
	r.AddHooks(lockreg.Hooks{ReleaseStart: func(ctx context.Context, _ string) context.Context {
		if panicking.Swap(false) {
			panic("hook")
		}
		return ctx
	}})
	h, err := r.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	lockregtest.Lose(t, r, "k")
	panicking.Store(true)
	require.PanicsWithValue(t, "hook", func() { _ = h.Release(ctx) })

	h, err = r.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	require.Empty(t, fatalOf(t, func(t testing.TB) { lockregtest.Lose(t, r, "k") }))
	require.ErrorIs(t, h.Release(ctx), lockreg.ErrLockLost)
}

// TestOnlyTheKitsRegistries: Lose and Another refuse a registry the kit
// did not make, which it knows nothing of.
func TestOnlyTheKitsRegistries(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // nothing listens; nothing is sent
	defer client.Close()
	foreign, err := lockreg.New(client, "foreign", lockreg.WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	defer foreign.Close()
	require.Equal(t, `lockregtest.Lose: the registry "foreign" was not made by lockregtest, or its test has ended`,
		fatalOf(t, func(t testing.TB) { lockregtest.Lose(t, foreign, "k") }))
	require.Equal(t, `lockregtest.Another: the registry "foreign" was not made by lockregtest, or its test has ended`,
		fatalOf(t, func(t testing.TB) { lockregtest.Another(t, foreign) }))
	require.Equal(t, `lockregtest.Lose: the registry is nil`,
		fatalOf(t, func(t testing.TB) { lockregtest.Lose(t, nil, "k") }))
}

// TestNewAtFailsTheTestWhenNoRedisAnswers: NewAt on an address where no
// Redis answers fails the test at once, saying so, rather than return a
// registry whose acquisitions retry until their contexts end (for ever,
// with context.Background()).
func TestNewAtFailsTheTestWhenNoRedisAnswers(t *testing.T) {
	msg := fatalOf(t, func(t testing.TB) { lockregtest.NewAt(t, "127.0.0.1:1") }) // nothing listens
	require.Contains(t, msg, `lockregtest: NewAt("127.0.0.1:1"): no Redis answers there: `)
	addr := redistest.Shared(t).Addr()
	msg = fatalOf(t, func(t testing.TB) { lockregtest.NewAt(t, "redis://nobody:wrong@"+addr+"/0") }) // no such user
	require.Contains(t, msg, `lockregtest: NewAt("redis://nobody:xxxxx@`+addr+`/0"): no Redis answers there: `, "the password stays out")
}

// TestNewAtKeepsThePasswordOfAnUnparsableURLOut: a password that is not
// percent-encoded (a '%', '#', '/', '?' or space in it) makes the URL
// unparsable; the failure says so without showing the password, or any
// part of it, as the test's output may be a public CI log.
func TestNewAtKeepsThePasswordOfAnUnparsableURLOut(t *testing.T) {
	for _, password := range []string{"p%ss-word", "pa#ss-word", "pa/ss-word", "pa?ss-word", "pa ss-word"} {
		msg := fatalOf(t, func(t testing.TB) { lockregtest.NewAt(t, "redis://user:"+password+"@127.0.0.1:1/0") })
		require.Contains(t, msg, `lockregtest: NewAt("redis://user:xxxxx@127.0.0.1:1/0"): `, password)
		for _, part := range []string{password, password[:4], "-word"} {
			require.NotContains(t, msg, part, "the password, or part of it, shows")
		}
	}
}

// TestNewNeedsNoRedisServer: the embedded server is all New needs.
func TestNewNeedsNoRedisServer(t *testing.T) {
	t.Setenv("PATH", "")
	t.Setenv("REDIS_ADDR", "")
	a, b := lockregtest.NewPair(t)
	ctx := context.Background()
	require.NoError(t, a.Do(ctx, "k", func(context.Context) error { return nil }))
	require.NoError(t, b.Do(ctx, "k", func(context.Context) error { return nil }))
}

// TestTrackingOnlyOnRedis: the embedded server has no CLIENT TRACKING,
// as the package doc says; a registry on Redis has it.
func TestTrackingOnlyOnRedis(t *testing.T) {
	ctx := context.Background()
	embedded := lockregtest.New(t)
	onRedis := lockregtest.NewAt(t, redistest.Shared(t).Addr())
	for _, r := range []*lockreg.Registry{embedded, onRedis} {
		require.NoError(t, r.Do(ctx, "k", func(context.Context) error { return nil }))
	}
	require.Eventually(t, func() bool { return onRedis.Stats().Tracking }, 5*time.Second, time.Millisecond)
	require.False(t, embedded.Stats().Tracking)
}

// TestTheRegistriesLogToTheTest: what a registry logs at WARN and above
// goes to the test's output, a forced unlock's warning among it.
func TestTheRegistriesLogToTheTest(t *testing.T) {
	out := &outputRecorder{TB: t}
	r := lockregtest.New(out)
	_, err := r.Obtain("k").Acquire(context.Background())
	require.NoError(t, err)
	holder(t, r, "k") // the warning names the owner once its name is written
	lockregtest.Lose(t, r, "k")
	require.Contains(t, out.String(), `level=WARN msg="lockreg: lock forced open" key=k owner=TestTheRegistriesLogToTheTest#1`)
	require.NotContains(t, out.String(), "time=")
}

// outputRecorder is t, but for its output, which it keeps.
type outputRecorder struct {
	testing.TB
	mu  sync.Mutex
	buf bytes.Buffer
}

func (o *outputRecorder) Output() io.Writer { return o }

func (o *outputRecorder) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.Write(p)
}

func (o *outputRecorder) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

// TestEachRegistryOfATestHasANameOfItsOwn: the kit numbers a test's
// registries in the order it makes them, whichever function makes them.
func TestEachRegistryOfATestHasANameOfItsOwn(t *testing.T) {
	onBoth(t, func(t *testing.T, srv server) {
		registries := []*lockreg.Registry{srv.newRegistry(t), srv.newRegistry(t)}
		registries = append(registries, lockregtest.Another(t, registries[1]))
		for i, r := range registries {
			key := fmt.Sprint("k", i)
			_, err := r.Obtain(key).Acquire(context.Background())
			require.NoError(t, err)
			require.Equal(t, fmt.Sprintf("%s#%d", t.Name(), i+1), holder(t, r, key).Owner)
		}
	})
}

// TestGoleakInACleanupBeforeTheKitsFindsNothing: the check doc.go advises
// runs after the kit closed its registries, clients and servers.
func TestGoleakInACleanupBeforeTheKitsFindsNothing(t *testing.T) {
	onBoth(t, func(t *testing.T, srv server) {
		t.Run("test", func(t *testing.T) {
			before := goleak.IgnoreCurrent() // the other tests' goroutines, the shared server's
			t.Cleanup(func() { goleak.VerifyNone(t, before) })
			r := srv.newRegistry(t)
			lockregtest.Another(t, r)
			_, err := r.Obtain("k").Acquire(context.Background())
			require.NoError(t, err)
		})
	})
}
