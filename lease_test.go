package lockreg

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
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

func TestRenewalKeepsAHoldFiveTimesTheLease(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	const lease = 300 * time.Millisecond
	r := newRegistry(t, client, WithExpireAfter(lease), WithRetryInterval(10*time.Millisecond))
	other := newRegistry(t, client)
	lock := r.Obtain("k")
	lock.Lock()

	for end := time.Now().Add(5 * lease); time.Now().Before(end); time.Sleep(lease / 4) {
		require.False(t, other.Obtain("k").TryLock(), "the renewed lease keeps other owners out")
		requireOpen(t, lock.Lost(), "a renewed hold was reported lost")
	}
	require.NoError(t, lock.UnlockContext(ctx))
}

func TestLeaseRunsOutWithoutRenewal(t *testing.T) {
	ctx := context.Background()
	const lease = 200 * time.Millisecond
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client, WithExpireAfter(lease), WithRetryInterval(10*time.Millisecond), WithRenewal(false))
	lock := r.Obtain("k")
	start := time.Now()
	lock.Lock()
	first := mustToken(t, lock)

	requireFires(t, lock.Lost(), lease+lease/3+500*time.Millisecond, "lease ran out")
	require.GreaterOrEqual(t, time.Since(start), lease, "not before the lease ends")
	// The signal counts the lease from when the acquisition was sent, so it
	// may come a moment before Redis expires the key.
	require.Eventually(t, func() bool {
		return client.Exists(ctx, "lockreg-test:"+t.Name()+":{k}").Val() == 0
	}, 100*time.Millisecond, time.Millisecond)
	require.ErrorIs(t, lock.UnlockContext(ctx), ErrLockLost)

	// Nothing stale is left: the next hold is fresh.
	lock.Lock()
	requireOpen(t, lock.Lost(), "a fresh hold starts unlost")
	require.Greater(t, mustToken(t, lock), first)
	lock.Unlock()
}

func TestKeyTakenBehindTheHoldersBackIsSignalled(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	const lease = 1500 * time.Millisecond
	interval := lease / 3
	for name, steal := range map[string]func(redisKey string) error{
		"deleted":     func(redisKey string) error { return client.Del(ctx, redisKey).Err() },
		"overwritten": func(redisKey string) error { return client.Set(ctx, redisKey, "intruder", time.Minute).Err() },
	} {
		t.Run(name, func(t *testing.T) {
			redisKey := "lockreg-test:" + t.Name() + ":{k}"
			r := newRegistry(t, client, WithExpireAfter(lease))
			lock := r.Obtain("k")
			lock.Lock()
			require.NoError(t, steal(redisKey))
			took := requireFires(t, lock.Lost(), interval+500*time.Millisecond, "key "+name)
			t.Logf("signalled %v after the key was %s (renewal interval %v)", took, name, interval)
			require.ErrorIs(t, lock.UnlockContext(ctx), ErrLockLost)
			if name == "overwritten" {
				require.Equal(t, "intruder", client.Get(ctx, redisKey).Val(), "the other owner's key is untouched")
				require.NoError(t, client.Del(ctx, redisKey).Err())
			}
			require.True(t, lock.TryLock(), "the next acquisition works normally")
			requireOpen(t, lock.Lost(), "and starts unlost")
			lock.Unlock()
		})
	}
}

func TestMaxHoldStopsRenewal(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	const lease, maxHold = 300 * time.Millisecond, 450 * time.Millisecond
	r := newRegistry(t, client, WithExpireAfter(lease), WithMaxHold(maxHold))
	other := newRegistry(t, client, WithRetryInterval(10*time.Millisecond))
	lock := r.Obtain("k")
	start := time.Now()
	lock.Lock()

	requireFires(t, lock.Lost(), maxHold+lease+lease/3+500*time.Millisecond, "renewal stopped at the limit")
	require.Greater(t, time.Since(start), maxHold, "renewed until the limit")
	tctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	require.NoError(t, other.Obtain("k").LockContext(tctx), "the key expired")
	require.ErrorIs(t, lock.UnlockContext(ctx), ErrLockLost)
	other.Obtain("k").Unlock()

	_, err := New(client, "k", WithMaxHold(time.Second), WithRenewal(false))
	require.ErrorIs(t, err, ErrInvalidOption)
	require.ErrorContains(t, err, "WithMaxHold needs renewal")
	_, err = New(client, "k", WithMaxHold(0))
	require.ErrorContains(t, err, "WithMaxHold(0s)")
}

func TestExpiredLockIsReportedLostAndSuccessorKept(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	var logs syncBuffer
	r1 := newRegistry(t, client, WithExpireAfter(50*time.Millisecond), WithRetryInterval(10*time.Millisecond),
		WithRenewal(false), WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	r2 := newRegistry(t, client, WithExpireAfter(time.Minute))
	redisKey := "lockreg-test:" + t.Name() + ":{k}"

	lock := r1.Obtain("k")
	lock.Lock()
	// The holder outlives its lease and a second registry takes the key.
	require.NoError(t, r2.Obtain("k").LockContext(ctx))
	require.Equal(t, r2.clientID, client.Get(ctx, redisKey).Val())

	err := lock.UnlockContext(ctx)
	require.ErrorIs(t, err, ErrLockLost)
	require.Contains(t, err.Error(), `"k"`)
	require.Equal(t, r2.clientID, client.Get(ctx, redisKey).Val(), "the successor's key survives")
	require.Greater(t, client.PTTL(ctx, redisKey).Val(), 50*time.Second, "and keeps its lease")
	require.Zero(t, r1.locals.size(), "the local mutex is freed")

	// Unlock, which cannot return the error, logs it at warning level.
	r2.Obtain("k").Unlock()
	lock.Lock()
	require.NoError(t, client.Set(ctx, redisKey, "someone-else", time.Minute).Err())
	lock.Unlock()
	require.Contains(t, logs.String(), "level=WARN")
	require.Contains(t, logs.String(), ErrLockLost.Error())
	require.Equal(t, "someone-else", client.Get(ctx, redisKey).Val())
	require.NoError(t, client.Del(ctx, redisKey).Err())
}

func TestRenewalOutlastsTransientErrors(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	var logs syncBuffer
	const lease = 900 * time.Millisecond
	r := newRegistry(t, srv.Client(t), WithExpireAfter(lease), WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	lock := r.Obtain("k")
	lock.Lock()

	// Scripts (renew.lua), and SET (the native renewal, where the server
	// has SET IFEQ), are refused for a while: every renewal in that window
	// fails.
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "default", "-evalsha", "-eval", "-set").Err())
	require.Eventually(t, func() bool { return logs.String() != "" }, lease, time.Millisecond)
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "default", "+@all").Err())
	require.Contains(t, logs.String(), "lease renewal failed; retrying on the next tick")

	time.Sleep(2 * lease)
	requireOpen(t, lock.Lost(), "renewal resumed after the errors")
	require.NoError(t, lock.UnlockContext(ctx))
}

func TestRenewalIsBatched(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	const held, lease = 1000, 900 * time.Millisecond
	r := newRegistry(t, srv.Client(t), WithExpireAfter(lease))
	locks := make([]*Lock, held)
	for i := range locks {
		locks[i] = r.Obtain("k" + strconv.Itoa(i))
		locks[i].Lock()
	}
	requireTracking(t, r)
	time.Sleep(lease / 2) // past the first tick, which loads the script
	before, err := redisstat.CommandStats(ctx, admin)
	require.NoError(t, err)
	time.Sleep(3 * lease)
	after, err := redisstat.CommandStats(ctx, admin)
	require.NoError(t, err)
	delta := redisstat.Delta(before, after)

	// Each tick renews every held key once (one PEXPIRE inside the
	// script); the script calls are what the registry sends. Tracked keys
	// are renewed by renew.lua whatever the server (trackedrenewal.go).
	calls, renewals := delta["evalsha"]+delta["eval"], delta["pexpire"]
	require.GreaterOrEqual(t, renewals, int64(5*held), "about nine ticks in three leases")
	require.LessOrEqual(t, calls*held, renewals*10, "1,000 held locks cost at most 10 renewal calls per tick")
	t.Logf("%.1f ticks: %d renewal calls, %d PEXPIREs", float64(renewals)/held, calls, renewals)

	for _, lock := range locks {
		requireOpen(t, lock.Lost(), "a renewed hold was reported lost")
		require.NoError(t, lock.UnlockContext(ctx))
	}
}

func TestCloseSignalsHeldLocksLost(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	r, err := New(client, "lockreg-test:"+t.Name())
	require.NoError(t, err)
	lock := r.Obtain("k")
	lock.Lock()
	requireOpen(t, lock.Lost(), "held")
	require.NoError(t, r.Close())
	requireFires(t, lock.Lost(), time.Second, "nothing renews after Close")
	err = lock.UnlockContext(context.Background())
	require.ErrorIs(t, err, ErrLockLost, "Lost fired, so the release says so")
	require.ErrorContains(t, err, "the registry was closed")
	require.Zero(t, client.Exists(context.Background(), lock.keys().Lock()).Val(), "the key was released all the same")
}

func TestWaitReplicas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	client := primary.Client(t)
	r := newRegistry(t, client, WithWaitReplicas(1, 300*time.Millisecond), WithRetryInterval(50*time.Millisecond))
	other := newRegistry(t, client)

	lock := r.Obtain("k")
	require.NoError(t, lock.LockContext(ctx))
	require.Positive(t, mustToken(t, lock))
	redisKey := "lockreg-test:" + t.Name() + ":{k}"
	require.Equal(t, r.clientID, replica.Client(t).Get(ctx, redisKey).Val(), "the replica has the lock once it is held")
	require.NoError(t, lock.UnlockContext(ctx))

	replica.Stop(t)
	tctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	err := lock.LockContext(tctx)
	require.ErrorIs(t, err, ErrNotObtained)
	require.ErrorIs(t, err, ErrNotReplicated)
	require.ErrorContains(t, err, "0 of 1 replicas acknowledged")
	require.False(t, lock.TryLock())
	requireNoLocalState(t, r)
	require.True(t, other.Obtain("k").TryLock(), "an unacknowledged acquisition releases its key")
	other.Obtain("k").Unlock()

	_, err = New(client, "k", WithWaitReplicas(0, time.Second))
	require.ErrorContains(t, err, "WithWaitReplicas(0, …)")
	_, err = New(client, "k", WithWaitReplicas(1, 0))
	require.ErrorContains(t, err, "WithWaitReplicas(…, 0s): timeout below 1ms")
	// A WAIT as long as the client's ReadTimeout would end every attempt in
	// a timeout, after obtain.lua took the key.
	short := redis.NewClient(&redis.Options{Addr: primary.Addr(), ReadTimeout: 500 * time.Millisecond})
	defer short.Close()
	_, err = New(short, "k", WithWaitReplicas(1, 500*time.Millisecond))
	require.ErrorIs(t, err, ErrInvalidOption)
	require.ErrorContains(t, err, "not below the client's ReadTimeout (500ms)")
	r, err = New(short, "k", WithWaitReplicas(1, 400*time.Millisecond))
	require.NoError(t, err)
	require.NoError(t, r.Close())
}

func TestLostForNonHolderIsClosed(t *testing.T) {
	r := newRegistry(t, redistest.Shared(t).Client(t))
	requireFires(t, r.Obtain("k").Lost(), 10*time.Millisecond, "holding nothing")
}

// TestHoldAnsweredPastItsLeaseIsLostAtOnce pauses Redis for longer than the
// lease while an acquisition is in flight: the lease, counted from when the
// call was sent, is over when the reply comes, so the hold comes back
// already lost and is not handed on locally.
func TestHoldAnsweredPastItsLeaseIsLostAtOnce(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	const lease = 200 * time.Millisecond
	r := newRegistry(t, srv.Client(t), WithExpireAfter(lease), WithRetryInterval(lease/4))
	lock := r.Obtain("late")
	lock.Lock() // loads the scripts
	lock.Unlock()

	require.NoError(t, srv.Client(t).Do(ctx, "CLIENT", "PAUSE", (2*lease).Milliseconds(), "ALL").Err())
	lock.Lock()
	select {
	case <-lock.Lost():
	default:
		t.Fatal("a hold answered a lease after it was sent came back with Lost open")
	}
	waiterDone := make(chan struct{})
	go func() {
		defer close(waiterDone)
		next := r.Obtain("late")
		next.Lock()
		next.Unlock()
	}()
	require.Eventually(t, func() bool { return waitersOf(r, "late") == 1 }, time.Second, time.Millisecond, "the waiter queued")
	lock.Unlock()
	<-waiterDone
	require.Zero(t, r.Stats().LocalHandoffs, "a lost hold goes back to Redis, not to the next local waiter")

	// Nor is a hold whose lease ran out between two of the watchdog's
	// ticks, before anything closed its Lost.
	waited := &localLock{queue: []chan *handoff{nil}}
	live := newHold(r.Obtain("k"), 1, time.Now(), lease)
	require.NotNil(t, r.nextLocalHold(live, 1, waited), "a live hold is handed on")
	live.tenure.leaseEnd.Store(int64(nowInstant())) // within the run of hand-offs
	require.Nil(t, r.nextLocalHold(live, 1, waited))
}

// TestLostFiresOnTimeWhileARenewalHangs: a renewal that Redis keeps
// waiting (a silent network; go-redis' timeouts and retries take many
// seconds) must not hold the lost signal back: the lease runs out as
// counted, and Lost fires within a renewal interval of that. The renewal
// hangs in the connection's writes, as on a silent network, so that it
// hangs on whichever connection it takes: renew.lua on the registry's
// client, or SET ... IFEQ on the tracking connection, whose client is
// dialled with the same options.
func TestLostFiresOnTimeWhileARenewalHangs(t *testing.T) {
	const lease = 300 * time.Millisecond
	var hang atomic.Bool
	renewHash := []byte(protocol.NewPeer(scripts, protocol.Config{}).Renew(nil).Script.Hash())
	client := redis.NewClient(&redis.Options{
		Addr: redistest.Shared(t).Addr(),
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return writeHook{Conn: conn, before: func(b []byte) {
				if hang.Load() && (bytes.Contains(b, renewHash) || bytes.Contains(b, []byte("ifeq"))) {
					time.Sleep(3 * time.Second)
				}
			}}, nil
		},
	})
	t.Cleanup(func() { _ = client.Close() })
	r := newRegistry(t, client, WithExpireAfter(lease), WithRetryInterval(50*time.Millisecond))
	lock := r.Obtain("k")
	lock.Lock()
	hang.Store(true)
	requireFires(t, lock.Lost(), lease+lease/3+500*time.Millisecond, "the lease ran out while its renewal hung")
	_ = lock.UnlockContext(context.Background())
}

// writeHook is a connection that calls before with what it is about to
// write.
type writeHook struct {
	net.Conn
	before func([]byte)
}

func (c writeHook) Write(b []byte) (int, error) {
	c.before(b)
	return c.Conn.Write(b)
}

// holdPastItsLease locks key in a new registry on client and makes the
// registry's count of the hold's lease run out, as after a stop past the
// lease, while the key keeps the registry's client id.
func holdPastItsLease(t *testing.T, client redis.UniversalClient, key string) (*Registry, *Lock, *Hold) {
	t.Helper()
	r := newRegistry(t, client)
	lock := r.Obtain(key)
	lock.Lock()
	local := r.locals.ownedBy(key, goroutineID())
	require.NotNil(t, local)
	h := local.hold.Load()
	h.tenure.leaseEnd.Store(int64(instantOf(time.Now().Add(-time.Millisecond))))
	return r, lock, h
}

// TestAHoldWhoseLeaseRanOutIsNotRenewed: a hold whose lease ran out
// unrenewed (its process stopped past it) may have lost the key, and the
// key may have come back to the registry since, by a grant or a new
// acquisition. Renewal checks the owner by client id, which cannot tell
// that apart from a key held all along, so such a hold is lost, not
// renewed.
func TestAHoldWhoseLeaseRanOutIsNotRenewed(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r, lock, _ := holdPastItsLease(t, client, "k")
	before := r.Stats().RenewCalls
	r.renewHolds(ctx)
	requireFires(t, lock.Lost(), time.Second, "the hold is lost")
	require.Equal(t, before, r.Stats().RenewCalls, "and not renewed")
	require.Equal(t, r.clientID, client.Get(ctx, lock.keys().Lock()).Val())
	_, err := lock.Token(ctx)
	require.ErrorIs(t, err, ErrLockLost)
	require.ErrorIs(t, lock.UnlockContext(ctx), ErrLockLost, "the key still had our client id, but may have passed on meanwhile")
	require.Zero(t, client.Exists(ctx, lock.keys().Lock()).Val(), "and it is released all the same")
}

// TestARenewalSentAfterTheLeaseRanOutIsNotCredited: the watchdog picks the
// holds to renew while their leases live, but the process may stand still
// before the renewal goes out. Sent after the lease ran out, the renewal
// finds the key with the client id whether or not it went through other
// owners meanwhile, so it cannot carry the hold on.
func TestARenewalSentAfterTheLeaseRanOutIsNotCredited(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r, lock, h := holdPastItsLease(t, client, "k") // ran out after the watchdog picked it
	requireTracking(t, r)
	before := r.Stats().RenewCalls
	r.renew(ctx, [][]*Hold{{h}})
	require.Equal(t, before+1, r.Stats().RenewCalls, "the renewal went out") // renew.lua, on the tracking connection
	requireFires(t, lock.Lost(), time.Second, "but the hold is lost")
	require.Less(t, h.tenure.leaseEnd.Load(), int64(nowInstant()), "and its lease not extended")
	require.ErrorIs(t, lock.UnlockContext(ctx), ErrLockLost)
}

func TestAnUnlockAfterRedisReportedTheKeyLostReportsItLost(t *testing.T) {
	// Renewal found the key taken; by the unlock, it has come back to this
	// registry (a grant not yet given back, say). The key is released, but
	// the hold did not keep it throughout.
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client)
	lock := r.Obtain("k")
	lock.Lock()
	require.NoError(t, client.Set(ctx, lock.keys().Lock(), "another owner", 0).Err())
	r.renewHolds(ctx)
	requireFires(t, lock.Lost(), time.Second, "renewal found the key taken")
	require.NoError(t, client.Set(ctx, lock.keys().Lock(), r.clientID, time.Minute).Err())

	require.ErrorIs(t, lock.UnlockContext(ctx), ErrLockLost)
	require.Zero(t, client.Exists(ctx, lock.keys().Lock()).Val(), "released all the same")
}

func TestARenewalNeverShortensALease(t *testing.T) {
	// Two renewals of one hold (the watchdog's, a grant's extension) can
	// answer out of order: the earlier one must not pull the lease back.
	sent := time.Now()
	h := newHold(nil, 0, sent, time.Minute)
	later := h.tenure.leaseEnd.Load()
	require.True(t, h.extendLease(sent, int64(instantOf(sent.Add(time.Second)))), "the lease was live when it was sent")
	require.Equal(t, later, h.tenure.leaseEnd.Load(), "not shortened")
	require.True(t, h.extendLease(sent, later+1))
	require.Equal(t, later+1, h.tenure.leaseEnd.Load(), "extended")
	require.False(t, h.extendLease(instant(later+1).time(), later+2), "sent once the lease had run out")
	require.Equal(t, later+1, h.tenure.leaseEnd.Load())
}

// TestRenewalIsNativeWhereTheServerHasSetIfeq: on Valkey 8.1 (or Redis
// 8.4) the renewal of a key that is not tracked (here, an ACL without
// CLIENT) is SET <key> <id> IFEQ <id> PX <lease>, several times cheaper
// for the server than renew.lua from the registry's client, with the
// same rule: a key that is another's, or gone, is not renewed, and its
// hold is lost. Elsewhere renew.lua runs. make test runs this on Valkey
// 8.1 and Redis 8.0 too.
func TestRenewalIsNativeWhereTheServerHasSetIfeq(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	info, err := admin.Info(ctx, "server").Result()
	require.NoError(t, err)
	native := protocol.RenewsNatively(info)
	const lease = 300 * time.Millisecond
	r := newRegistry(t, aclClient(t, srv, "+@all", "-client"), WithExpireAfter(lease), WithRetryInterval(20*time.Millisecond))
	require.Equal(t, native, r.servers.native.Load(), "the registry knows what the server has")
	kept, err := r.Obtain("kept").Acquire(ctx)
	require.NoError(t, err)
	taken, err := r.Obtain("taken").Acquire(ctx)
	require.NoError(t, err)
	require.NoError(t, admin.Set(ctx, taken.redisKey(), "another", time.Minute).Err())
	before, err := redisstat.CommandStats(ctx, admin)
	require.NoError(t, err)
	time.Sleep(2 * lease)
	requireOpen(t, kept.Lost(), "renewed")
	requireFires(t, taken.Lost(), lease, "another's key is not renewed")
	require.Equal(t, "another", admin.Get(ctx, taken.redisKey()).Val(), "and left alone")
	after, err := redisstat.CommandStats(ctx, admin)
	require.NoError(t, err)
	scripts := after["evalsha"] + after["eval"] - before["evalsha"] - before["eval"]
	if native {
		require.Zero(t, scripts, "no renew.lua")
		require.Greater(t, after["set"]-before["set"], int64(2), "SET IFEQ per key and tick")
	} else {
		require.Positive(t, scripts, "renew.lua")
	}
	require.NoError(t, kept.Release(ctx))
}

// A renewal round picks a hold; before its reply, the hold is handed off
// locally and the key deleted behind the registry's back. The renewal
// finds the key gone: the hold it was sent for is released, and the news
// is the current holder's, with its cause, at once (without tracking, as
// here, nothing else would tell it before the watchdog saw the lease run
// out, and then as expired).
func TestARenewalThatFindsTheKeyGoneTellsTheHoldHandedOffMeanwhile(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	client := aclClient(t, srv, "+@all", "-client") // no tracking: the renewal tells
	var catching atomic.Bool
	caught, goOn := make(chan struct{}), make(chan struct{})
	client.AddHook(redistest.Hook{ProcessPipeline: func(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
		return func(ctx context.Context, cmds []redis.Cmder) error {
			for _, c := range cmds {
				if c.Name() == "hset" && catching.CompareAndSwap(true, false) { // the round's owner refresh, before its renewals
					close(caught)
					<-goOn
				}
			}
			return next(ctx, cmds)
		}
	}})
	r := newRegistry(t, client, WithExpireAfter(3*time.Second), WithLocalHandoff(16, time.Hour))
	first, err := r.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	next := make(chan *Hold, 1)
	go func() {
		h, err := r.Obtain("k").Acquire(ctx)
		assert.NoError(t, err)
		next <- h
	}()
	require.Eventually(t, func() bool { return waitersOf(r, "k") == 1 }, 5*time.Second, time.Millisecond)
	catching.Store(true)
	<-caught // the round picked first
	require.NoError(t, first.Release(ctx))
	handedOff := <-next
	require.Equal(t, viaHandoff, handedOff.via)
	require.NoError(t, srv.Client(t).Del(ctx, handedOff.redisKey()).Err())
	close(goOn)

	requireFires(t, handedOff.Lost(), 5*time.Second, "the hold handed off is told")
	handedOff.mu.Lock()
	defer handedOff.mu.Unlock()
	require.Equal(t, LossDeleted, handedOff.cause, "by the renewal, which found the key gone")
}

// A held key that someone made a hash is lost, as overwritten: at once
// where tracking tells (its verify's GET fails with WRONGTYPE), at its
// renewal where it cannot (an ACL without CLIENT TRACKING). And it does not
// stop the renewal of the registry's other keys, which share its
// renew.lua call.
func TestAKeyOfAnotherTypeIsLostAloneAsOverwritten(t *testing.T) {
	t.Parallel()
	for _, tracked := range []bool{true, false} {
		t.Run(fmt.Sprint("tracked=", tracked), func(t *testing.T) {
			ctx := context.Background()
			srv := redistest.Start(t)
			admin := srv.Client(t)
			client := admin
			if !tracked {
				client = minimalACL(t, admin, srv, "lockreg-test:"+t.Name(), "-client|tracking")()
			}
			const lease = 1200 * time.Millisecond
			r := newRegistry(t, client, WithExpireAfter(lease))
			if tracked {
				requireTracking(t, r)
			}
			spoiled, err := r.Obtain("spoiled").Acquire(ctx)
			require.NoError(t, err)
			kept, err := r.Obtain("kept").Acquire(ctx)
			require.NoError(t, err)
			// In one step: a read between a DEL and an HSET (a renewal, or
			// the client's check of held keys while tracking is refused)
			// would find the key gone, and rightly say deleted.
			_, err = admin.TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.Del(ctx, spoiled.redisKey())
				p.HSet(ctx, spoiled.redisKey(), "not", "a lock")
				return nil
			})
			require.NoError(t, err)
			told := 3 * lease / 4 // a renewal, lease/3 away at most; expired, at the lease's end
			if tracked {
				told = blindLimit
			}
			requireFires(t, spoiled.Lost(), told, "the hold of a key made a hash")
			requireCause(t, spoiled, LossOverwritten)
			for end := time.Now().Add(2 * lease); time.Now().Before(end); time.Sleep(lease / 10) {
				require.NoError(t, kept.Err(), "a hold whose key Redis still has was signalled lost")
				require.Positive(t, admin.PTTL(ctx, kept.redisKey()).Val(), "its key expired, unrenewed")
			}
			require.NoError(t, kept.Release(ctx))
			require.ErrorIs(t, spoiled.Release(ctx), ErrLockLost)
		})
	}
}

// TestALossCauseNamesItselfAndNoneForZero: ReleaseEvent.FoundLost is zero
// when the release found no loss, which reads "none", not "LossCause(0)".
func TestALossCauseNamesItselfAndNoneForZero(t *testing.T) {
	require.Equal(t, "none", LossCause(0).String())
	require.Equal(t, "overwritten", LossOverwritten.String())
	require.Equal(t, "LossCause(200)", LossCause(200).String())
}
