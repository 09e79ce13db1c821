package lockreg

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg/internal/redisstat"
	"github.com/lockreg/lockreg/internal/redistest"
)

// TestAContendedKeySkipsThePlainSet: an attempt on a key this registry
// found taken goes straight to obtain.lua, as a plain SET would fail and
// cost a round trip, until a lease has passed without contention.
func TestAContendedKeySkipsThePlainSet(t *testing.T) {
	const lease = 300 * time.Millisecond
	var counter redisstat.Counter
	srv := redistest.Shared(t)
	client := srv.Client(t, &counter)
	loadScripts(t, client)
	r := newRegistry(t, client, WithExpireAfter(lease), WithRetryInterval(10*time.Millisecond))
	other := newRegistry(t, srv.Client(t))
	key := "c" + strconv.FormatInt(time.Now().UnixNano(), 10)
	calls := func() [2]int64 {
		c := counter.Commands()
		return [2]int64{c["set"], c["evalsha"]}
	}
	held := other.Obtain(key)
	held.Lock()
	lock := r.Obtain(key)
	require.False(t, lock.TryLock())
	require.Equal(t, [2]int64{1, 1}, calls(), "a plain SET, then obtain.lua to see whose the key is")
	require.False(t, lock.TryLock())
	require.Equal(t, [2]int64{1, 2}, calls(), "a key found taken: obtain.lua alone")
	held.Unlock()
	require.True(t, lock.TryLock())
	lock.Unlock() // nobody waits, but the key still counts as contended
	require.True(t, lock.TryLock())
	lock.Unlock()
	require.Equal(t, [2]int64{1, 6}, calls(), "obtain.lua and a release twice")

	time.Sleep(lease) // a lease without contention
	require.True(t, lock.TryLock())
	require.Equal(t, [2]int64{2, 6}, calls(), "uncontended again: a plain SET")
	lock.Unlock()
}

// TestAReleaseOthersWaitForLetsThemTakeTheKeyFirst is docs/PROTOCOL.md's
// yield rule: a release that deletes the key while another registry waits
// keeps the releaser's next acquisition of it back (for 2ms, or a retry
// interval with pub/sub off), so that the waiter gets its turn. The
// releasing goroutine, which needs no notification, would otherwise take
// the key again long before the waiter's next attempt.
func TestAReleaseOthersWaitForLetsThemTakeTheKeyFirst(t *testing.T) {
	_, waiter, lock, taken := releaseToAWaiter(t)
	lock.Lock() // at once, as a loop around the critical section would
	again := time.Now()
	lock.Unlock()

	at := requireTaken(t, taken)
	requireNoLocalState(t, waiter, "the waiter unlocked")
	require.True(t, at.Before(again), "the waiter took the key %v after the releaser took it back", at.Sub(again))
}

// TestTryLockDoesNotWaitOutAYield: TryLock makes one attempt without
// waiting, so the yield after a release that another registry waited for
// (a retry interval with pub/sub off) must not hold it back: it reports at
// once, and leaves the key to the waiter as the yield meant.
func TestTryLockDoesNotWaitOutAYield(t *testing.T) {
	releaser, waiter, lock, taken := releaseToAWaiter(t)
	var attempts atomic.Int32
	releaser.AddHooks(Hooks{AcquireAttempt: func(context.Context, string) { attempts.Add(1) }})
	start := time.Now()
	took := lock.TryLock()
	require.Less(t, time.Since(start), 500*time.Millisecond, "TryLock does not wait out the releaser's yield of a retry interval")
	require.False(t, took, "the yield leaves the key to the waiter")
	require.Zero(t, attempts.Load(), "nor does it attempt after the yield")
	requireTaken(t, taken)
	requireNoLocalState(t, waiter, "the waiter unlocked")
}

// releaseToAWaiter releases, on a releaser's lock of key k, a key that a
// waiter's goroutine waits for (taken reports when it took it), with the
// yield rule's timing: with pub/sub off a release deletes the key rather
// than granting it, and the waiter hears of it only by polling, every
// 100ms; the releaser's next acquisition waits a retry interval of its
// own, 1s. The release comes just after one of the waiter's attempts
// failed: its mark, which that attempt renewed for two retry intervals,
// is live, and its next attempt is a retry interval away.
func releaseToAWaiter(t *testing.T) (releaser, waiter *Registry, lock *Lock, taken <-chan time.Time) {
	client := redistest.Shared(t).Client(t)
	releaser = newRegistry(t, client, WithPubSub(false), WithRetryInterval(time.Second))
	waiter = newRegistry(t, client, WithPubSub(false), WithRetryInterval(100*time.Millisecond))
	lock = releaser.Obtain("k")
	lock.Lock()
	taken = lockInBackground(context.Background(), waiter.Obtain("k"))
	waitUntilWaiting(t, waiter)
	failed := waiter.Stats().FailedAttempts
	require.Eventually(t, func() bool { return waiter.Stats().FailedAttempts > failed }, 5*time.Second, 100*time.Microsecond)
	lock.Unlock()
	return releaser, waiter, lock, taken
}

func TestFailedAttemptLeavesOwnerKeyUntouched(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	holder := newRegistry(t, client, WithExpireAfter(10*time.Second))
	other := newRegistry(t, client, WithExpireAfter(1000*time.Second), WithRetryInterval(10*time.Millisecond))
	redisKey := "lockreg-test:" + t.Name() + ":{k}"

	holder.Obtain("k").Lock()
	defer holder.Obtain("k").Unlock()
	require.NoError(t, client.PExpire(ctx, redisKey, 5*time.Second).Err())

	require.False(t, other.Obtain("k").TryLock())
	tctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, other.Obtain("k").LockContext(tctx), ErrNotObtained)

	require.Equal(t, holder.clientID, client.Get(ctx, redisKey).Val())
	ttl := client.PTTL(ctx, redisKey).Val()
	require.LessOrEqual(t, ttl, 5*time.Second, "failed attempts never extend another owner's lease")
	require.Greater(t, ttl, 4*time.Second)
	requireNoLocalState(t, other)

	// Nor does an unlock attempt by a registry that never held it.
	inGoroutine(func() {
		require.ErrorIs(t, other.Obtain("k").UnlockContext(ctx), ErrNotHeld)
	})
	require.Equal(t, holder.clientID, client.Get(ctx, redisKey).Val())
}

// contenderEnv makes the test binary a contender process instead of
// running tests (see TestMain): BenchmarkContention starts several.
const contenderEnv = "LOCKREG_CONTENDER"

// contentionRun is how long BenchmarkContention's processes contend.
const contentionRun = 2 * time.Second

// contenderSpec is what a contender process is told to do.
type contenderSpec struct {
	Addr, RegistryKey, Key string
	PubSub                 bool
	Start                  time.Time // all contenders begin together,
	Duration               time.Duration
}

// contenderResult is what it reports on stdout.
type contenderResult struct {
	Acquisitions int64
	RoundTrips   int64
	Holds        []heldTurn
	Stats        Stats
}

// heldTurn is one hold: its place in the order of all holds, and when it
// began (Lock returned) and ended (UnlockContext was called), in unix ns.
type heldTurn struct{ Seq, Acquired, Released int64 }

// runContender takes the lock for Duration, numbering each hold with
// INCR on a bookkeeping client (not counted), so that the hand-off times
// can be read off the merged holds of all processes.
func runContender(spec string) int {
	var s contenderSpec
	if err := json.Unmarshal([]byte(spec), &s); err != nil {
		fmt.Fprintln(os.Stderr, "contender:", err)
		return 2
	}
	ctx := context.Background()
	var counter redisstat.Counter
	lockClient := redis.NewClient(&redis.Options{Addr: s.Addr})
	lockClient.AddHook(&counter)
	defer lockClient.Close()
	books := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer books.Close()
	r, err := New(lockClient, s.RegistryKey, WithPubSub(s.PubSub))
	if err != nil {
		fmt.Fprintln(os.Stderr, "contender:", err)
		return 2
	}
	defer r.Close()
	seqKey := s.RegistryKey + ":seq"
	lock := r.Obtain(s.Key)
	time.Sleep(time.Until(s.Start))

	var res contenderResult
	for end := s.Start.Add(s.Duration); time.Now().Before(end); {
		if err := lock.LockContext(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "contender:", err)
			return 1
		}
		turn := heldTurn{Acquired: time.Now().UnixNano()}
		if turn.Seq, err = books.Incr(ctx, seqKey).Result(); err != nil {
			fmt.Fprintln(os.Stderr, "contender:", err)
			return 1
		}
		turn.Released = time.Now().UnixNano()
		if err := lock.UnlockContext(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "contender:", err)
			return 1
		}
		res.Holds = append(res.Holds, turn)
		res.Acquisitions++
	}
	res.RoundTrips = counter.RoundTrips()
	res.Stats = r.Stats()
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		return 1
	}
	return 0
}

// BenchmarkContention has 2 and 4 processes, one registry and one
// goroutine each, take turns on one key for contentionRun (run it with
// -benchtime 1x: b.N plays no part). handoff-p50/p99 is the time from a release to the next
// owner's acquisition when that owner is another process; roundtrips/op is
// what the lock's clients sent per acquisition (each process's one
// SUBSCRIBE, outside the hook, aside). handoff-p50-rtts divides the median
// by the median PING round trip measured alongside, under the same load;
// remote-share is the fraction of acquisitions that followed another
// process's release; acq/s counts all processes' acquisitions.
func BenchmarkContention(b *testing.B) {
	self, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	srv := redistest.Shared(b)
	for _, procs := range []int{2, 4} {
		for _, pubSub := range []bool{true, false} {
			name := fmt.Sprintf("procs=%d/pubsub=%v", procs, pubSub)
			b.Run(name, func(b *testing.B) {
				spec := contenderSpec{
					Addr: srv.Addr(), RegistryKey: "lockreg-bench:" + b.Name(), Key: "hot",
					PubSub: pubSub, Start: time.Now().Add(300 * time.Millisecond), Duration: contentionRun,
				}
				raw, _ := json.Marshal(spec)
				results := make([]contenderResult, procs)
				errs := make([]error, procs)
				var wg sync.WaitGroup
				// The yardstick: a PING round trip, measured under the same load.
				pinger := srv.Client(b)
				pingCtx, stopPinging := context.WithCancel(context.Background())
				var pings []time.Duration
				wg.Go(func() {
					for pingCtx.Err() == nil {
						start := time.Now()
						if pinger.Ping(pingCtx).Err() == nil {
							pings = append(pings, time.Since(start))
						}
						time.Sleep(time.Millisecond)
					}
				})
				var contenders sync.WaitGroup
				b.ResetTimer()
				for i := range procs {
					contenders.Go(func() {
						cmd := exec.Command(self)
						cmd.Env = append(os.Environ(), contenderEnv+"="+string(raw))
						cmd.Stderr = os.Stderr
						out, err := cmd.Output()
						if err == nil {
							err = json.Unmarshal(out, &results[i])
						}
						errs[i] = err
					})
				}
				contenders.Wait()
				b.StopTimer()
				stopPinging()
				wg.Wait()
				var acquisitions, trips int64
				type owned struct {
					heldTurn
					proc int
				}
				var holds []owned
				for i, res := range results {
					if errs[i] != nil {
						b.Fatalf("contender %d: %v", i, errs[i])
					}
					acquisitions += res.Acquisitions
					trips += res.RoundTrips
					for _, h := range res.Holds {
						holds = append(holds, owned{h, i})
					}
				}
				slices.SortFunc(holds, func(a, b owned) int { return int(a.Seq - b.Seq) })
				var handoffs []int64
				for i := 1; i < len(holds); i++ {
					if prev, next := holds[i-1], holds[i]; prev.proc != next.proc {
						handoffs = append(handoffs, next.Acquired-prev.Released)
					}
				}
				slices.Sort(handoffs)
				slices.Sort(pings)
				if len(handoffs) > 0 && len(pings) > 0 {
					p50 := handoffs[len(handoffs)/2]
					b.ReportMetric(float64(p50)/1e3, "handoff-p50-µs")
					b.ReportMetric(float64(handoffs[len(handoffs)*99/100])/1e3, "handoff-p99-µs")
					b.ReportMetric(float64(p50)/float64(pings[len(pings)/2]), "handoff-p50-rtts")
				}
				b.ReportMetric(float64(trips)/float64(acquisitions), "roundtrips/op")
				b.ReportMetric(float64(acquisitions)/contentionRun.Seconds(), "acq/s")
				b.ReportMetric(float64(len(handoffs))/float64(acquisitions), "remote-share")
			})
		}
	}
}
