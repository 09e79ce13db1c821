package lockreg

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"
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
	"github.com/lockreg/lockreg/internal/redistest"
)

func TestReleaseGrantsTheKeyToTheWaitingRegistry(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	holder := newRegistry(t, client)
	waiter := newRegistry(t, client, WithRetryInterval(time.Second)) // a grant lease of 2s
	held := holder.Obtain("g")
	held.Lock()
	holderToken := mustToken(t, held)
	// A third registry, subscribed as it waits for another key, must not
	// hear of the grant.
	bystander := newRegistry(t, client)
	holder.Obtain("other").Lock()
	bctx, stopWaiting := context.WithCancel(ctx)
	defer stopWaiting()
	go func() { _ = bystander.Obtain("other").LockContext(bctx) }()
	waitUntilWaiting(t, bystander)

	lock := waiter.Obtain("g")
	taken := make(chan int64, 1)
	release := make(chan struct{})
	go func() {
		if err := lock.LockContext(ctx); err != nil {
			close(taken)
			return
		}
		taken <- mustToken(t, lock)
		<-release
		lock.Unlock()
	}()
	waitUntilWaiting(t, waiter)
	callsWhileWaiting := waiter.Stats().AcquireCalls
	held.Unlock()

	token, ok := <-taken
	require.True(t, ok, "the waiter acquired")
	s := waiter.Stats()
	require.Equal(t, int64(1), s.Grants, "the release passed the key on")
	require.Equal(t, callsWhileWaiting, s.AcquireCalls, "and the waiter took it without a call of its own")
	require.Greater(t, token, holderToken, "a grant draws a larger token")
	require.Equal(t, waiter.clientID, client.Get(ctx, lock.keys().Lock()).Val())
	// A notification published after the grant reaches the bystander
	// after the grant would have.
	require.NoError(t, client.Publish(ctx, protocol.ReleaseChannel(holder.namespace), "wnobody").Err())
	require.Eventually(t, func() bool { return bystander.Stats().Notifications > 0 }, time.Second, time.Millisecond)
	require.Equal(t, int64(1), bystander.Stats().Notifications, "the grant went to the grantee's channel alone")
	require.Eventually(t, func() bool {
		return client.PTTL(ctx, lock.keys().Lock()).Val() > waiter.grants.lease
	}, waiter.grants.lease, time.Millisecond, "a grantee still holding the key extends the short grant lease to its own")
	requireHeldByAnother(t, holder, "g", "the granted key excludes the old holder")
	close(release)
	requireReleased(t, client, lock.keys().Lock(), "the grantee releases it")
}

func TestShortGrantedHoldsAreNotExtended(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	holder := newRegistry(t, client)
	waiter := newRegistry(t, client, WithRetryInterval(50*time.Millisecond))
	held := holder.Obtain("g")
	held.Lock()
	lock := waiter.Obtain("g")
	taken := lockInBackground(ctx, lock) // unlocks at once
	waitUntilWaiting(t, waiter)
	held.Unlock()
	_, ok := <-taken
	require.True(t, ok, "the waiter acquired")
	require.Equal(t, int64(1), waiter.Stats().Grants)
	require.Zero(t, goroutinesRunning("extendLater.func"), "only a timer waits to extend the grant")
	time.Sleep(waiter.grants.lease)
	require.Zero(t, waiter.Stats().RenewCalls, "a hold released within its grant lease costs no extension")
}

// goroutinesRunning counts the goroutines whose stack has fn in it.
func goroutinesRunning(fn string) int {
	buf := make([]byte, 1<<20)
	return strings.Count(string(buf[:runtime.Stack(buf, true)]), fn)
}

func TestGrantNobodyWaitsForIsGivenBack(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	holder := newRegistry(t, client)
	// Its grant lease (twice the retry interval) outlasts the check below:
	// only giving the key back frees it in time.
	gone := newRegistry(t, client, WithRetryInterval(5*time.Second))
	require.NoError(t, gone.subscribe(ctx))
	held := holder.Obtain("g")
	held.Lock()
	// The mark of a waiter that gave up before its withdrawal landed.
	markWaiting(t, client, held, markOf(gone))

	held.Unlock()
	requireReleased(t, client, held.keys().Lock(), "the registry that no longer waits gives the key back")
	require.Zero(t, gone.Stats().Grants)
	require.Equal(t, int64(1), gone.Stats().Notifications)
	require.True(t, holder.Obtain("g").TryLock(), "the key is free again")
	holder.Obtain("g").Unlock()
}

func TestGrantToADeadRegistryLastsOnlyTheGrantLease(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	holder := newRegistry(t, client)
	waiter := newRegistry(t, client, WithRetryInterval(20*time.Millisecond))
	held := holder.Obtain("g")
	held.Lock()
	const grantLease = 150 * time.Millisecond
	markWaiting(t, client, held, "crashed-registry:150")

	held.Unlock()
	require.Equal(t, "crashed-registry", client.Get(ctx, held.keys().Lock()).Val(), "granted to the only mark")
	require.LessOrEqual(t, client.PTTL(ctx, held.keys().Lock()).Val(), grantLease)
	lock := waiter.Obtain("g")
	require.NoError(t, lock.LockContext(ctx), "the key is free once the grant lease ran out")
	lock.Unlock()
}

func TestOnlyAGrantAfterTheFailedAttemptIsTrusted(t *testing.T) {
	r := newRegistry(t, redistest.Shared(t).Client(t))
	lock := r.Obtain("g")
	failed := time.Now()
	require.Nil(t, lock.acceptGrant(nil, 100, waitMark{sent: failed}), "the attempt saw no token: the grant's age is unknown")
	require.Nil(t, lock.acceptGrant(nil, 100, waitMark{sent: failed, token: 100}), "a grant with the token the attempt saw came before it")
	require.Nil(t, lock.acceptGrant(nil, 101, waitMark{sent: failed.Add(-r.grants.lease), token: 100}), "the grant lease may be over")
	local := r.locals.join("g")
	defer r.locals.leave("g")
	h := lock.acceptGrant(local, 101, waitMark{sent: failed, token: 100})
	require.NotNil(t, h)
	require.Equal(t, int64(instantOf(failed.Add(r.grants.lease))), h.tenure.leaseEnd.Load(), "the lease is counted from the failed attempt")
	require.Zero(t, r.Stats().Grants, "counted once an acquisition returns the hold (takeHold), not if it drops it")
}

func TestGivingBackAGrantSparesAKeyTakenSince(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client)
	lock := r.Obtain("g")
	const grant = 1000
	// The key as a grant left it: this registry's for the grant lease, with
	// the grant's token.
	grantLeft := func() {
		require.NoError(t, client.Set(ctx, lock.keys().Lock(), r.clientID, r.grants.lease).Err())
		require.NoError(t, client.Set(ctx, lock.keys().Fence(), "1000", time.Minute).Err())
	}
	grantLeft()
	require.True(t, lock.TryLock(), "an acquisition here finds the key its own")
	found, err := lock.releaseRedis(ctx, protocol.Release{GiveBack: grant})
	require.NoError(t, err)
	require.Equal(t, protocol.NotOurs, found.Outcome, "it moved the key's last token past the grant's: the give-back spares the key")
	require.Equal(t, r.clientID, client.Get(ctx, lock.keys().Lock()).Val())
	lock.Unlock()

	// The grant expired, and a plain SET NX here took the key: the grant's
	// token is still the last, but the key has a full lease.
	require.NoError(t, client.Set(ctx, lock.keys().Fence(), "1000", time.Minute).Err())
	require.True(t, lock.TryLock())
	require.Equal(t, "1000", client.Get(ctx, lock.keys().Fence()).Val(), "the SET NX drew no token")
	found, err = lock.releaseRedis(ctx, protocol.Release{GiveBack: grant})
	require.NoError(t, err)
	require.Equal(t, protocol.NotOurs, found.Outcome, "the give-back spares the key: its lease is longer than a grant's")
	require.Equal(t, r.clientID, client.Get(ctx, lock.keys().Lock()).Val())
	lock.Unlock()

	grantLeft()
	found, err = lock.releaseRedis(ctx, protocol.Release{GiveBack: grant})
	require.NoError(t, err)
	require.Equal(t, protocol.Deleted, found.Outcome, "nobody took the grant: it goes back")
	require.Zero(t, client.Exists(ctx, lock.keys().Lock()).Val())
}

// slowGiveBack holds back the registry's give-backs (release.lua called
// with a grant, ARGV[6]) by delay, as a stalled connection or go-redis'
// retries might, past the call's context (as a call already on its way
// would be), and closes done once the first has run.
func slowGiveBack(delay time.Duration, done chan struct{}) redis.Hook {
	var once sync.Once
	return redistest.Hook{Process: func(next redis.ProcessHook) redis.ProcessHook {
		return func(ctx context.Context, cmd redis.Cmder) error {
			args := cmd.Args()
			// evalsha, sha, 4, four keys, then ARGV: ARGV[6] is args[12].
			if giveBack := len(args) > 12 && args[12] != ""; !giveBack {
				return next(ctx, cmd)
			}
			time.Sleep(delay)
			err := next(context.WithoutCancel(ctx), cmd)
			once.Do(func() { close(done) })
			return err
		}
	}}
}

// TestALateGiveBackSparesAHoldTakenSince: a registry's waiter gave up just
// as a release granted it the key, so the registry gives the grant back;
// that call is late, and meanwhile the grant expired and a goroutine of
// the same registry took the key with a plain SET NX, which leaves the
// grant's token the key's last. The give-back must spare that hold: it
// deleted it, and another registry took the key beside it. With a lease
// as short as the grant's, the key's time to live cannot tell the two
// apart: the acquisition must wait for the give-back.
func TestALateGiveBackSparesAHoldTakenSince(t *testing.T) {
	for name, lease := range map[string]time.Duration{"default lease": 0, "lease as short as the grant's": 100 * time.Millisecond} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			srv := redistest.Shared(t)
			gaveBack := make(chan struct{})
			opts := []Option{WithRetryInterval(50 * time.Millisecond)} // a grant lease of 100ms
			if lease > 0 {
				opts = append(opts, WithExpireAfter(lease))
			}
			late := newRegistry(t, srv.Client(t, slowGiveBack(400*time.Millisecond, gaveBack)), opts...)
			other := newRegistry(t, srv.Client(t))
			require.NoError(t, late.subscribe(ctx))
			held := other.Obtain("g")
			held.Lock()
			// The mark of late's waiter that gave up before its withdrawal landed.
			markWaiting(t, srv.Client(t), held, markOf(late))
			held.Unlock()
			require.Eventually(t, func() bool { return late.Stats().Notifications > 0 }, time.Second, time.Millisecond, "the release granted the key to late")

			time.Sleep(late.grants.lease + 50*time.Millisecond)
			lock := late.Obtain("g")
			require.True(t, lock.TryLock(), "the grant expired: a plain SET NX takes the key")
			select {
			case <-gaveBack:
			case <-time.After(5 * time.Second):
				t.Fatal("the give-back did not run")
			}
			require.False(t, other.Obtain("g").TryLock(), "the late give-back spared the hold")
			requireOpen(t, lock.Lost(), "which is still whole")
			require.NoError(t, lock.UnlockContext(ctx))
		})
	}
}

// TestGrantIsTrustedWhenNoHoldDrewAToken: holds draw tokens only when
// asked, so a key may have no stored token when a waiter fails on it. The
// failed attempt then stores one from the clock, and the grant, drawn
// after it, carries a larger one: the waiter still takes the key without
// a call of its own.
func TestGrantIsTrustedWhenNoHoldDrewAToken(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	holder := newRegistry(t, client)
	waiter := newRegistry(t, client, WithRetryInterval(time.Second))
	key := "g" + strconv.FormatInt(time.Now().UnixNano(), 10) // no token stored by an earlier run
	held := holder.Obtain(key)
	held.Lock()
	fence := held.keys().Fence()
	require.Zero(t, client.Exists(ctx, fence).Val(), "the holder never asked for a token")

	lock := waiter.Obtain(key)
	taken := lockInBackground(ctx, lock)
	waitUntilWaiting(t, waiter)
	stored, err := client.Get(ctx, fence).Int64()
	require.NoError(t, err, "the failed attempt stored a token to compare grants with")
	callsWhileWaiting := waiter.Stats().AcquireCalls
	held.Unlock()

	requireTaken(t, taken)
	s := waiter.Stats()
	require.Equal(t, int64(1), s.Grants, "the release passed the key on")
	require.Equal(t, callsWhileWaiting, s.AcquireCalls, "and the waiter took it without a call of its own")
	granted, err := client.Get(ctx, fence).Int64()
	require.NoError(t, err)
	require.Greater(t, granted, stored, "the grant drew a larger token")
}

// TestAReleaseFindingAWaiterUnexpectedlyIsSentAgain: a release of a key
// the registry took uncontended sends release.lua the client id alone; if
// another registry waits after all, the script changes nothing and the
// release goes again with all its arguments, which grants the key. The
// key then looks contended, and its next release sends them at once.
func TestAReleaseFindingAWaiterUnexpectedlyIsSentAgain(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	holder := newRegistry(t, client)
	waiter := newRegistry(t, client, WithRetryInterval(time.Second))
	// Subscribed before it waits, the waiter's first mark takes grants; a
	// registry that subscribes on its first failed attempt marks without
	// them first, and a release in between wakes it instead (CI saw it).
	require.NoError(t, waiter.subscribe(ctx))
	key := "r" + strconv.FormatInt(time.Now().UnixNano(), 10)
	held := holder.Obtain(key)
	for round := range 2 {
		held.Lock()
		taken := lockInBackground(ctx, waiter.Obtain(key))
		require.Eventually(t, func() bool {
			return client.Exists(ctx, held.keys().Marker()).Val() == 1
		}, 5*time.Second, time.Millisecond, "the waiter marked itself")
		before := holder.Stats().ReleaseCalls
		held.Unlock()
		requireTaken(t, taken)
		require.Equal(t, int64(round+1), waiter.Stats().Grants, "round %d: the release granted the key", round)
		require.Equal(t, int64(2-round), holder.Stats().ReleaseCalls-before, "round %d: release calls", round)
		requireReleased(t, client, held.keys().Lock(), "the waiter unlocked")
	}
}

// TestAGrantToAHolderIsGivenBack: a grant can reach a registry that holds
// the key, if the holder lost the key unseen (Redis lost it, or the lease
// ran out while the process stood still) and another registry took it and
// then passed it back through a mark of this registry that outlived its
// acquisition. Kept, the grant would make the key look held all along to
// the holder's renewals and unlock, and block other registries; it goes
// back instead.
func TestAGrantToAHolderIsGivenBack(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	stale := newRegistry(t, client, WithRetryInterval(time.Second)) // a grant lease of 2s
	other := newRegistry(t, client)
	require.NoError(t, stale.subscribe(ctx))
	held := stale.Obtain("g")
	held.Lock()
	require.NoError(t, client.Del(ctx, held.keys().Lock()).Err(), "Redis loses the key")
	taken := other.Obtain("g")
	taken.Lock()
	markWaiting(t, client, held, markOf(held.r))
	taken.Unlock()

	require.Eventually(t, func() bool { return stale.Stats().Notifications > 0 }, time.Second, time.Millisecond, "the release granted the key to the holder's registry")
	require.Eventually(t, func() bool { return client.Exists(ctx, held.keys().Lock()).Val() == 0 }, time.Second, time.Millisecond,
		"which gave it back at once, not after its 2s grant lease")
	require.ErrorIs(t, held.UnlockContext(ctx), ErrLockLost, "and the holder learns that its hold was broken")
	require.Zero(t, stale.Stats().Grants)
}

// TestGrantsGoFirstComeFirstServed: registries that wait for one key get
// it in the order they began to wait, however their retries fall. Each of
// four registries (stand-ins for processes) locks the key again as soon as
// it unlocked it, and holds it for one retry interval, so every waiter
// renews its mark a few times while it waits. First come, first served,
// each hold of a registry follows exactly one of each other registry's;
// when grants went to the mark that lapsed first, a registry whose
// retries fell just before the releases was passed over again and again
// (7 times in a row, and waits up to 1 s where the rotation gives 150ms).
// One wait of up to two rounds is allowed, as a retry late by a retry
// interval on this busy machine lets a mark lapse, and its registry then
// queues again at the back. `go test -run GrantsGoFirstComeFirstServed
// -v .` logs the waits.
func TestGrantsGoFirstComeFirstServed(t *testing.T) {
	const (
		registries = 4
		interval   = 50 * time.Millisecond
		holds      = 48
	)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := redistest.Shared(t).Client(t)
	var (
		mu     sync.Mutex
		order  []int // the registry of each hold
		waited = make([]time.Duration, registries)
		wg     sync.WaitGroup
	)
	for i := range registries {
		lock := newRegistry(t, client, WithRetryInterval(interval)).Obtain("fair")
		wg.Go(func() {
			for {
				start := time.Now()
				if err := lock.LockContext(ctx); err != nil {
					t.Errorf("registry %d: %v", i, err)
					return
				}
				mu.Lock()
				done := len(order) >= holds
				if !done {
					order = append(order, i)
					waited[i] = max(waited[i], time.Since(start))
				}
				mu.Unlock()
				if !done {
					time.Sleep(interval)
				}
				lock.Unlock()
				if done {
					return
				}
			}
		})
	}
	wg.Wait()
	t.Logf("longest waits per registry: %v; holds in order: %v", waited, order)
	passedOver := make([]int, registries) // holds of others since a registry's last one
	late := 0                             // holds that came after more than a round of others'
	for n, i := range order {
		if n >= registries && passedOver[i] > registries-1 {
			late++
			require.LessOrEqual(t, passedOver[i], 2*(registries-1), "registry %d was passed over %d times in a row (holds in order: %v)", i, passedOver[i], order)
		}
		for j := range passedOver {
			passedOver[j]++
		}
		passedOver[i] = 0
	}
	require.LessOrEqual(t, late, 1, "registries waited more than one round (holds in order: %v)", order)
}

// TestAGrantForAWaiterThatLeftIsGivenBack: a grant that lands in the
// instant before the last goroutine of the key leaves is given back by
// that leave, not dropped with the key's state, which would block the key
// for the grant lease.
func TestAGrantForAWaiterThatLeftIsGivenBack(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client, WithRetryInterval(5*time.Second)) // a grant lease of 10s
	lock := r.Obtain("g")
	// The key as a grant to r leaves it: r's for the grant lease, with the
	// grant's token.
	require.NoError(t, client.Set(ctx, lock.keys().Lock(), r.clientID, r.grants.lease).Err())
	require.NoError(t, client.Set(ctx, lock.keys().Fence(), "1000", time.Minute).Err())
	r.locals.join("g")        // a waiter, on its way out
	r.receiveGrant("g", 1000) // the grant lands first
	r.leave("g")              // then the waiter leaves: nobody takes the grant
	requireReleased(t, client, lock.keys().Lock(), "the grant goes back at once, not after its grant lease")
}

// TestAHoldThatPredatesAGrantOfItsKeyIsLost: a hold whose key passed
// through another owner behind its back, whose release granted the key
// back to the hold's registry. Had its renewal extended the grant's lease
// before the give-back, the give-back would spare the key, and the hold
// would go on unaware; the key's last token, still the grant's, tells.
func TestAHoldThatPredatesAGrantOfItsKeyIsLost(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client, WithRetryInterval(time.Second)) // a grant lease of 2s
	h, err := r.Obtain("g").Acquire(ctx)
	require.NoError(t, err)
	require.NoError(t, client.Set(ctx, h.redisKey(), r.clientID, r.grants.lease).Err())
	require.NoError(t, client.Set(ctx, h.lock.keys().Fence(), "1000", time.Minute).Err())
	r.renewHolds(ctx) // the renewal lands before the grant's note
	require.Greater(t, client.PTTL(ctx, h.redisKey()).Val(), r.grants.lease, "the renewal extended the grant's lease")
	r.receiveGrant("g", 1000)
	requireFires(t, h.Lost(), 2*time.Second, "the hold learns that its key passed through another owner")
	h.mu.Lock()
	require.Equal(t, LossOverwritten, h.cause)
	h.mu.Unlock()
}

// TestAGrantedHoldIsNotExtendedPastMaxHold: a granted hold's short lease
// is extended halfway through, unless WithMaxHold has passed by then, as
// the watchdog would not renew it either.
func TestAGrantedHoldIsNotExtendedPastMaxHold(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	holder := newRegistry(t, client)
	waiter := newRegistry(t, client, WithExpireAfter(5*time.Second), WithRetryInterval(50*time.Millisecond), WithMaxHold(10*time.Millisecond))
	h := grantedHold(t, holder, waiter, "g", nil)
	time.Sleep(3 * waiter.grants.lease / 2) // past the extension's moment, halfway through the grant lease
	require.Less(t, client.PTTL(ctx, h.redisKey()).Val(), waiter.grants.lease, "not extended to the full lease")
	_ = h.Release(ctx)
}

// A granted hold's short lease is extended halfway through it; if that
// extension fails (Redis blinked), it is tried again within the grant's
// lease, rather than leaving the hold to the watchdog's next round, a
// renewal interval away: one failed call loses no hold. The same while a
// Shutdown waits for the hold, which renews it meanwhile.
func TestAGrantedHoldOutlastsAFailedExtension(t *testing.T) {
	for _, shuttingDown := range []bool{false, true} {
		t.Run(fmt.Sprintf("shutting down %v", shuttingDown), func(t *testing.T) {
			ctx := context.Background()
			srv := redistest.Start(t)
			client := aclClient(t, srv, "+@all", "-client") // no tracking: extensions go on this client
			var failing atomic.Bool
			var failed atomic.Int32
			renewHash := redis.NewScript(renewLua).Hash()
			client.AddHook(redistest.Hook{ProcessPipeline: func(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
				return func(ctx context.Context, cmds []redis.Cmder) error {
					for _, c := range cmds {
						args := c.Args()
						renewal := len(args) > 1 && args[0] == "evalsha" && args[1] == renewHash ||
							c.Name() == "set" && slices.Contains(args, any("ifeq")) // a native renewal
						if renewal && failing.CompareAndSwap(true, false) {
							failed.Add(1)
							err := &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
							for _, c := range cmds {
								c.SetErr(err)
							}
							return err
						}
					}
					return next(ctx, cmds)
				}
			}})
			holder := newRegistry(t, srv.Client(t))
			waiter := newRegistry(t, client)
			h := grantedHold(t, holder, waiter, "g", func() { failing.Store(true) })
			shutdown := make(chan error, 1)
			if shuttingDown {
				go func() { shutdown <- waiter.Shutdown(ctx) }()
				require.Eventually(t, waiter.closing, time.Second, time.Millisecond)
			}
			require.Eventually(t, func() bool { return failed.Load() == 1 }, time.Second, time.Millisecond, "the extension failed")
			time.Sleep(2 * waiter.grants.lease) // past the grant's lease
			requireOpen(t, h.Lost(), "the hold outlasts the failed extension")
			require.Greater(t, srv.Client(t).PTTL(ctx, h.redisKey()).Val(), waiter.grants.lease, "extended to the registry's lease")
			require.NoError(t, h.Release(ctx))
			if shuttingDown {
				require.NoError(t, <-shutdown)
			}
		})
	}
}

// grantedHold has holder hold key while waiter waits for it, then release
// it, which grants it to waiter, and returns waiter's hold. beforeRelease,
// if set, runs once waiter waits.
func grantedHold(t *testing.T, holder, waiter *Registry, key string, beforeRelease func()) *Hold {
	t.Helper()
	held := holder.Obtain(key)
	held.Lock()
	granted := make(chan *Hold, 1)
	go func() {
		h, err := waiter.Obtain(key).Acquire(context.Background())
		assert.NoError(t, err)
		granted <- h
	}()
	waitUntilWaiting(t, waiter)
	if beforeRelease != nil {
		beforeRelease()
	}
	held.Unlock()
	h := <-granted
	require.Equal(t, int64(1), waiter.Stats().Grants, "the key was granted")
	return h
}

// TestAGiveBackThatTakesAHoldersKeyLosesTheHold: a grant that reaches a
// registry whose hold predates it (the key went through another owner
// behind the hold's back) goes back at once, and the key with it: the
// hold no longer has it, and another registry may take it at once. The
// hold must learn so then, not at its next renewal, a third of a lease
// away: without tracking (an ACL without CLIENT) nothing else tells it.
func TestAGiveBackThatTakesAHoldersKeyLosesTheHold(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	client := aclClient(t, srv, "+@all", "-client")             // no tracking: nothing else tells
	r := newRegistry(t, client, WithRetryInterval(time.Second)) // a grant lease of 2s
	other := newRegistry(t, srv.Client(t))
	h, err := r.Obtain("g").Acquire(ctx)
	require.NoError(t, err)
	// The key as another owner's release granting it back left it: r's
	// for the grant lease, with the grant's token.
	raw := srv.Client(t)
	require.NoError(t, raw.Set(ctx, h.redisKey(), r.clientID, r.grants.lease).Err())
	require.NoError(t, raw.Set(ctx, h.lock.keys().Fence(), "1000000", time.Minute).Err())
	r.receiveGrant("g", 1_000_000) // lands while h is current
	requireSettledGiveBacks(t, r)
	taken := other.Obtain("g")
	require.True(t, taken.TryLock(), "the give-back let the key go")
	requireFires(t, h.Lost(), time.Second, "the hold learns that its key went with the grant")
	require.ErrorIs(t, h.Release(ctx), ErrLockLost)
	taken.Unlock()
}

// TestTheGrantLeaseIsTwoRetryIntervalsAtLeast100msAtMostTheLease, as
// docs/PROTOCOL.md says; none without grants.
func TestTheGrantLeaseIsTwoRetryIntervalsAtLeast100msAtMostTheLease(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	retry10ms := WithRetryInterval(10 * time.Millisecond)
	for _, c := range []struct {
		opts []Option
		want time.Duration
	}{
		{nil, 200 * time.Millisecond},
		{[]Option{retry10ms}, 100 * time.Millisecond},
		{[]Option{retry10ms, WithExpireAfter(50 * time.Millisecond)}, 50 * time.Millisecond},
		{[]Option{WithPubSub(false)}, 0},
	} {
		cfg, err := newConfig(client, "ns", c.opts)
		require.NoError(t, err)
		require.Equal(t, c.want, cfg.grantLease(), "%d options", len(c.opts))
	}
}
