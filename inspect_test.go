package lockreg

import (
	"context"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
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

func TestInspectSaysWhoHoldsAndWhoWaits(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Shared(t)
	holder := newRegistry(t, srv.Client(t), WithOwner("billing/pod-7"))
	waiter := newRegistry(t, srv.Client(t), WithOwner("reports/pod-1"), WithRetryInterval(time.Second))
	var counter redisstat.Counter
	inspector := newRegistry(t, srv.Client(t, &counter))

	h, err := holder.Obtain("order-42").Acquire(ctx)
	require.NoError(t, err)
	token := mustHoldToken(t, h)
	taken := lockInBackground(ctx, waiter.Obtain("order-42"))
	waitUntilWaiting(t, waiter)
	require.Eventually(t, func() bool { return holder.owner.freshUntil.Load() > 0 }, 5*time.Second, time.Millisecond, "the holder published its name")

	before := counter.RoundTrips()
	info, err := inspector.Inspect(ctx, "order-42")
	require.NoError(t, err)
	require.LessOrEqual(t, counter.RoundTrips()-before, int64(2), "at most two round trips")
	require.Equal(t, "order-42", info.Key)
	require.True(t, info.Held)
	require.Equal(t, "billing/pod-7", info.Owner)
	require.Equal(t, holder.OwnerID(), info.OwnerID, "a registry tells its holds from others'")
	require.NotEqual(t, waiter.OwnerID(), info.OwnerID)
	require.Equal(t, token, info.Token)
	require.Greater(t, info.TTL, time.Duration(0))
	require.LessOrEqual(t, info.TTL, holder.cfg.expireAfter)
	require.Equal(t, []Waiter{{OwnerID: waiter.clientID, Owner: "reports/pod-1"}}, info.Waiting)

	require.NoError(t, h.Release(ctx))
	requireTaken(t, taken)
	// The waiter unlocks right after it reports the lock taken.
	var free LockInfo
	require.Eventually(t, func() bool {
		free, err = inspector.Inspect(ctx, "order-42")
		return err == nil && !free.Held
	}, 5*time.Second, time.Millisecond, "the key is free once the waiter unlocked")
	require.Empty(t, free.Owner)

	_, err = inspector.Inspect(ctx, "")
	require.ErrorIs(t, err, ErrInvalidKey)
}

// TestInspectNamesNoOneForADeadRegistry: a holder that died (its owner
// name gone with its key's TTL) or predates owner names still shows as
// holding, by client id.
func TestInspectNamesNoOneForADeadRegistry(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client)
	require.NoError(t, client.Set(ctx, r.Obtain("k").keys().Lock(), "a-dead-registry", time.Minute).Err())
	info, err := r.Inspect(ctx, "k")
	require.NoError(t, err)
	require.True(t, info.Held)
	require.Equal(t, "a-dead-registry", info.OwnerID)
	require.Empty(t, info.Owner)
}

func TestTheDefaultOwnerNamesTheProcess(t *testing.T) {
	host, err := os.Hostname()
	require.NoError(t, err)
	r := newRegistry(t, redistest.Shared(t).Client(t))
	require.Contains(t, r.cfg.owner, "@"+host+":"+strconv.Itoa(os.Getpid()))
	_, err = New(redistest.Shared(t).Client(t), "k", WithOwner(""))
	require.ErrorIs(t, err, ErrInvalidOption)
}

// TestTheOwnerNameLivesWhileItsRegistryHolds: written at the first hold,
// refreshed by the renewal rounds, gone two leases after the registry
// stops.
func TestTheOwnerNameLivesWhileItsRegistryHolds(t *testing.T) {
	ctx := context.Background()
	const lease = 300 * time.Millisecond
	srv := redistest.Shared(t)
	admin := srv.Client(t)
	r, err := New(srv.Client(t), "lockreg-test:"+t.Name(), WithExpireAfter(lease), WithRetryInterval(20*time.Millisecond), WithOwner("worker-3"))
	require.NoError(t, err)
	defer r.Close()
	lock := r.Obtain("k")
	lock.Lock()
	require.Eventually(t, func() bool {
		return admin.HGet(ctx, protocol.OwnerKey(r.namespace, r.clientID), "name").Val() == "worker-3"
	}, 5*time.Second, time.Millisecond)
	time.Sleep(3 * lease) // renewal rounds keep it
	require.Equal(t, "worker-3", admin.HGet(ctx, protocol.OwnerKey(r.namespace, r.clientID), "name").Val())
	require.Greater(t, admin.PTTL(ctx, protocol.OwnerKey(r.namespace, r.clientID)).Val(), lease, "refreshed by the renewal rounds")

	lock.Unlock()
	require.NoError(t, r.Close())
	require.Eventually(t, func() bool { return admin.Exists(ctx, protocol.OwnerKey(r.namespace, r.clientID)).Val() == 0 }, 10*lease, 10*time.Millisecond, "gone after two leases")
}

// A renewal round refreshes the owner's name in its own pipeline: one
// round trip, two commands more. The lease is long, so that no round of
// the watchdog's runs beside the one counted.
func TestARenewalRoundRefreshesTheOwnerNameInTwoCommands(t *testing.T) {
	ctx := context.Background()
	var counter redisstat.Counter
	r := newRegistry(t, redistest.Shared(t).Client(t, &counter), WithExpireAfter(time.Minute), WithOwner("worker-3"))
	lock := r.Obtain("k")
	lock.Lock()
	defer lock.Unlock()
	requireTracking(t, r)
	before, rounds := counter.Commands(), r.Stats().RenewCalls
	r.renew(ctx, r.renewalBatches(r.dueForRenewal()), r.peer.RefreshOwner()...)
	after := counter.Commands()
	// renew.lua, on the tracking connection, whatever the server: a
	// tracked key is renewed natively on none (trackedrenewal.go).
	require.Equal(t, rounds+1, r.Stats().RenewCalls)
	require.Equal(t, before["hset"]+1, after["hset"], "one HSET per round")
	require.Equal(t, before["pexpire"]+1, after["pexpire"], "and one PEXPIRE")
}

func TestLocksListsTheNamespacesHeldLocksOnce(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client, WithOwner("lister"))
	held := []string{"a", "b{1}", "c%7D", "d}:{e", "f:fence"}
	for _, key := range held {
		h, err := r.Obtain(key).Acquire(ctx)
		require.NoError(t, err)
		mustHoldToken(t, h) // a fence key beside each
	}
	h, err := r.Obtain("released").Acquire(ctx)
	require.NoError(t, err)
	mustHoldToken(t, h)
	require.NoError(t, h.Release(ctx))
	require.Eventually(t, func() bool { return r.owner.freshUntil.Load() > 0 }, 5*time.Second, time.Millisecond, "the owner name is written")
	// A waiting mark and queue, and another namespace that shares a prefix.
	waiter := newRegistry(t, client, WithRetryInterval(time.Second))
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, _ = waiter.Obtain("a").Acquire(short)
	other, err := New(client, r.namespace+":{x}")
	require.NoError(t, err)
	defer other.Close()
	_, err = other.Obtain("z").Acquire(ctx)
	require.NoError(t, err)

	var listed []string
	for info, err := range r.Locks(ctx) {
		require.NoError(t, err)
		require.True(t, info.Held)
		require.Equal(t, "lister", info.Owner)
		listed = append(listed, info.Key)
	}
	slices.Sort(listed)
	slices.Sort(held)
	require.Equal(t, held, listed)

	// A caller may stop early.
	n := 0
	for range r.Locks(ctx) {
		n++
		break
	}
	require.Equal(t, 1, n)
}

func TestLocksAcrossClusterPrimaries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	addrs := redistest.StartCluster(t, 3)
	client := clusterClient(t, addrs)
	r := newRegistry(t, client)
	primaries := map[string]bool{}
	var held []string
	for i := range 30 {
		key := "order-" + strconv.Itoa(i)
		_, err := r.Obtain(key).Acquire(ctx)
		require.NoError(t, err)
		held = append(held, key)
		node, err := client.MasterForKey(ctx, r.Obtain(key).keys().Lock())
		require.NoError(t, err)
		primaries[node.String()] = true
	}
	require.Len(t, primaries, 3, "the locks live on all three primaries")
	listed := listedKeys(t, r)
	slices.Sort(listed)
	slices.Sort(held)
	require.Equal(t, held, listed)
}

// TestForceUnlockFreesTheKeyAndTellsTheHolder: the key goes, the holder
// hears within a second (not at its renewal, 10s away), the next holder's
// token is above the old one's local hand-offs, waiters wake at once, and
// the old holder's release spares the new owner.
func TestForceUnlockFreesTheKeyAndTellsTheHolder(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	stuck := newRegistry(t, client, WithOwner("stuck-worker"), WithLocalHandoff(maxHandoffs, time.Hour))
	waiter := newRegistry(t, client, WithRetryInterval(10*time.Second))
	var logs syncBuffer
	operator := newRegistry(t, client, WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))

	// A run of local hand-offs raises the token without Redis.
	lock := stuck.Obtain("k")
	h, err := lock.Acquire(ctx)
	require.NoError(t, err)
	token := mustHoldToken(t, h)
	for range 20 {
		next := make(chan *Hold)
		go func() {
			h, err := lock.Acquire(ctx)
			assert.NoError(t, err)
			next <- h
		}()
		require.Eventually(t, func() bool { return waitersOf(stuck, "k") == 1 }, time.Second, time.Millisecond)
		require.NoError(t, h.Release(ctx))
		h = <-next
		token++
		require.Equal(t, token, mustHoldToken(t, h), "handed off locally")
	}
	require.Eventually(t, stuck.notes.subscribed.Load, 5*time.Second, time.Millisecond)
	taken := lockInBackground(ctx, waiter.Obtain("k"))
	waitUntilWaiting(t, waiter)

	forced := time.Now()
	found, err := operator.ForceUnlock(ctx, "k")
	require.NoError(t, err)
	require.True(t, found)
	took := requireFires(t, h.Lost(), 5*time.Second, "the holder heard")
	t.Logf("the holder heard %v after the forced unlock", took)
	select {
	case _, ok := <-taken:
		require.True(t, ok)
	case <-time.After(2 * time.Second):
		t.Fatal("the waiter was not woken (its retry interval is 10s)")
	}
	require.Less(t, time.Since(forced), 5*time.Second)
	next, err := operator.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	require.Greater(t, mustHoldToken(t, next), token, "above every token handed out")
	err = h.Release(ctx)
	require.ErrorIs(t, err, ErrLockLost)
	require.ErrorContains(t, err, "forced")
	require.Equal(t, operator.clientID, client.Get(ctx, lock.keys().Lock()).Val(), "the old holder's release spared the new owner")
	require.NoError(t, next.Release(ctx))

	require.Contains(t, logs.String(), "lock forced open")
	require.Contains(t, logs.String(), "key=k")
	require.Contains(t, logs.String(), "owner=stuck-worker")

	found, err = operator.ForceUnlock(ctx, "k")
	require.NoError(t, err)
	require.False(t, found, "nobody held it")
	_, err = operator.ForceUnlock(ctx, "")
	require.ErrorIs(t, err, ErrInvalidKey)
}

// A forced unlock's warning names the holder's owner as that registry
// wrote it in Redis, which may be any length (WithOwner): cut as a key is.
func TestForceUnlocksWarningCutsALongOwnerName(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	holder := newRegistry(t, client, WithOwner(strings.Repeat("o", 1<<20)))
	var logs syncBuffer
	operator := newRegistry(t, client, WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	_, err := holder.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	requireSettled(t, holder) // the owner name is written
	found, err := operator.ForceUnlock(ctx, "k")
	require.NoError(t, err)
	require.True(t, found)
	require.Contains(t, logs.String(), "(1048576 bytes)", "the owner is named")
	require.Less(t, len(logs.String()), 600, "by its first bytes and its length")
}

// TestForceUnlockDuringASlotMigration: while the lock's slot is half way
// between two primaries, the forced unlock runs on the lock's key alone.
func TestForceUnlockDuringASlotMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	addrs := redistest.StartCluster(t, 3)
	r := newRegistry(t, clusterClient(t, addrs))
	operator := newRegistry(t, clusterClient(t, addrs))
	h, err := r.Obtain("migrating").Acquire(ctx)
	require.NoError(t, err)
	mustHoldToken(t, h) // a fence to split from its lock
	require.Eventually(t, r.notes.subscribed.Load, 5*time.Second, time.Millisecond)
	m := redistest.BeginSlotMigration(t, addrs, protocol.Slot(h.redisKey()))
	_, moved := m.MoveKey(t) // one of the lock and its fence moved: a split slot
	require.True(t, moved)
	found, err := operator.ForceUnlock(ctx, "migrating")
	require.NoError(t, err)
	require.True(t, found)
	requireFires(t, h.Lost(), 5*time.Second, "the holder heard")
	m.Finish(t)
	next, err := operator.Obtain("migrating").Acquire(ctx)
	require.NoError(t, err)
	require.NoError(t, next.Release(ctx))
	require.ErrorIs(t, h.Release(ctx), ErrLockLost)
}

// TestAReadOnlyInspector: a Redis user that may only read the namespace
// inspects and lists, and is refused a forced unlock, by name.
func TestAReadOnlyInspector(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	const ns = "orders"
	// The README's inspector ACL.
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "inspector", "on", ">secret", "resetkeys", "resetchannels",
		"%R~"+ns+":{*", "%R~"+ns+":owner:*", "-@all", "+get", "+pttl", "+zrange", "+hget", "+time", "+scan", "+ping", "+hello").Err())
	holder, err := New(srv.Client(t), ns, WithOwner("writer"))
	require.NoError(t, err)
	defer holder.Close()
	_, err = holder.Obtain("o-1").Acquire(ctx)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return holder.owner.freshUntil.Load() > 0 }, 5*time.Second, time.Millisecond)

	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "inspector", Password: "secret"})
	t.Cleanup(func() { _ = c.Close() })
	inspector, err := New(c, ns)
	require.NoError(t, err)
	defer inspector.Close()
	info, err := inspector.Inspect(ctx, "o-1")
	require.NoError(t, err)
	require.Equal(t, "writer", info.Owner)
	var listed []string
	for info, err := range inspector.Locks(ctx) {
		require.NoError(t, err)
		listed = append(listed, info.Key)
	}
	require.Equal(t, []string{"o-1"}, listed)
	_, err = inspector.ForceUnlock(ctx, "o-1")
	require.ErrorIs(t, err, ErrRedis)
	require.True(t, strings.Contains(err.Error(), "evalsha") || strings.Contains(err.Error(), "eval"), "it names the command: %v", err)
	require.Equal(t, holder.clientID, admin.Get(ctx, holder.Obtain("o-1").keys().Lock()).Val(), "and changed nothing")
}

// ForceUnlockHeldBy forces open the hold of the registry it names, and
// leaves the key alone if another registry holds it.
func TestForceUnlockHeldByForcesOpenOnlyTheNamedHolder(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	holder, other, operator := newRegistry(t, client), newRegistry(t, client), newRegistry(t, client)
	h, err := holder.Obtain("k").Acquire(ctx)
	require.NoError(t, err)

	_, err = operator.ForceUnlockHeldBy(ctx, "k", "")
	require.ErrorIs(t, err, ErrInvalidArgument)
	forced, err := operator.ForceUnlockHeldBy(ctx, "k", other.clientID)
	require.NoError(t, err)
	require.False(t, forced, "another registry holds it")
	require.NoError(t, h.Err(), "the holder keeps it")

	forced, err = operator.ForceUnlockHeldBy(ctx, "k", holder.clientID)
	require.NoError(t, err)
	require.True(t, forced)
	require.ErrorIs(t, h.Release(ctx), ErrLockLost)
}

// A lock key of another type, made by hand, blocks every acquisition;
// Inspect shows it held, with no expiry, and ForceUnlock is the way out.
func TestForceUnlockFreesALockKeyOfAnotherType(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client)
	lockKey := r.Obtain("k").keys().Lock()
	t.Cleanup(func() { client.Del(ctx, lockKey) })
	require.NoError(t, client.HSet(ctx, lockKey, "field", "value").Err())
	info, err := r.Inspect(ctx, "k")
	require.NoError(t, err)
	require.True(t, info.Held)
	require.Equal(t, NoExpiry, info.TTL)
	forced, err := r.ForceUnlock(ctx, "k")
	require.NoError(t, err)
	require.True(t, forced)
	h, err := r.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	require.NoError(t, h.Release(ctx))
}

// TestAReleaseAfterAForcedUnlockSaysForced: the news of a forced unlock
// reached the holder, whose check of the key (without tracking, a read on
// its client) has not come back yet when it releases. Its release finds
// the key not its own and names the cause the registry knows, forced (as
// that check would have), not an unexplained deletion.
func TestAReleaseAfterAForcedUnlockSaysForced(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	client := aclClient(t, srv, "+@all", "-client") // no tracking
	var armed atomic.Bool
	var lockKey atomic.Value
	blocked, gate := make(chan struct{}), make(chan struct{})
	client.AddHook(redistest.Hook{ProcessPipeline: func(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
		return func(ctx context.Context, cmds []redis.Cmder) error {
			if args := cmds[0].Args(); cmds[0].Name() == "get" && args[1] == lockKey.Load() && armed.CompareAndSwap(true, false) {
				close(blocked)
				<-gate
			}
			return next(ctx, cmds)
		}
	}})
	var logs syncBuffer
	r := newRegistry(t, client, WithRenewal(false), WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	h, err := r.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "CLIENT TRACKING unavailable") }, 5*time.Second, 10*time.Millisecond)
	require.Eventually(t, r.notes.subscribed.Load, 5*time.Second, time.Millisecond)

	lockKey.Store(h.redisKey())
	armed.Store(true)
	found, err := newRegistry(t, srv.Client(t)).ForceUnlock(ctx, "k")
	require.NoError(t, err)
	require.True(t, found)
	<-blocked // the holder heard, and its check of the key waits
	err = h.Release(ctx)
	close(gate)
	require.ErrorIs(t, err, ErrLockLost)
	require.ErrorContains(t, err, LossForced.explain())
	require.Equal(t, err, h.Err())
}

// TestForceUnlockOfItsOwnHoldTellsTheHolderAtOnce: a registry that forces
// open a key it holds itself knows of it without Redis telling it: its
// holder hears at once, and of the cause, though nothing else (tracking,
// pub/sub, renewal) would tell it before the lease ends.
func TestForceUnlockOfItsOwnHoldTellsTheHolderAtOnce(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	client := aclClient(t, srv, "+@all", "-client") // no tracking
	r := newRegistry(t, client, WithPubSub(false), WithRenewal(false), WithExpireAfter(time.Minute))
	h, err := r.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	found, err := r.ForceUnlockHeldBy(ctx, "k", r.OwnerID())
	require.NoError(t, err)
	require.True(t, found)
	requireFires(t, h.Lost(), 5*time.Second, "the holder heard of its own registry's forced unlock")
	require.ErrorContains(t, h.Err(), LossForced.explain())
	require.ErrorIs(t, h.Release(ctx), ErrLockLost)
}

// TestForceUnlockOfItsOwnHoldNamesItselfBeforeTrackingCan: a registry's
// forced unlock of its own hold races the reads of its key (its tracker's,
// on the DEL's invalidation or to arm a hold just taken; a renewal's),
// which can find the key gone before the forcing call's reply comes back;
// with pub/sub off, no note of the forced unlock need reach the registry
// first (its tracker's target may not have subscribed yet). The hold must
// still be lost as forced. The registry here has neither tracking nor
// pub/sub, so only the read, made while the reply is held up, can tell it.
func TestForceUnlockOfItsOwnHoldNamesItselfBeforeTrackingCan(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	var forceHash atomic.Value
	forceHash.Store("")
	ran, gate := make(chan struct{}), make(chan struct{})
	late := func(c redis.Cmder) {
		if args := c.Args(); len(args) > 1 && args[0] == "evalsha" && args[1] == forceHash.Load() {
			close(ran)
			<-gate // the reply is late: the key is read first
		}
	}
	client := aclClient(t, srv, "+@all", "-client") // no tracking
	client.AddHook(redistest.AfterReply(late))
	r := newRegistry(t, client, WithPubSub(false))
	lock := r.Obtain("k")
	_, err := r.ForceUnlock(ctx, "warm-up") // loads the script: the next call is an EVALSHA
	require.NoError(t, err)
	forceHash.Store(r.peer.ForceUnlock(lock.keys(), "k", 0, 0, "").Script.Hash())
	h, err := lock.Acquire(ctx)
	require.NoError(t, err)
	forced := make(chan bool)
	go func() {
		found, err := r.ForceUnlock(ctx, "k")
		assert.NoError(t, err)
		forced <- found
	}()
	<-ran
	r.verify(h, LossDeleted) // as the tracker's read of the key does
	requireFires(t, h.Lost(), 5*time.Second, "the holder heard")
	close(gate)
	require.True(t, <-forced)
	require.ErrorContains(t, h.Err(), LossForced.explain())
}

// TestAForcedUnlockTellsNoHoldTakenAfterIt: the reply of a registry's
// forced unlock of its own hold can reach it after its holder heard of it
// (by pub/sub, or on its tracker's target) and a new hold took the key
// again. That new hold was not forced open: a later loss of it must name
// its own cause, not "forced".
func TestAForcedUnlockTellsNoHoldTakenAfterIt(t *testing.T) {
	for _, tc := range []struct {
		name  string
		rules []string
		opts  []Option
		ready func(r *Registry) bool
	}{
		{"pub/sub", []string{"+@all", "-client"}, nil, func(r *Registry) bool { return r.notes.subscribed.Load() }},
		{"tracking", []string{"+@all"}, []Option{WithPubSub(false)}, (*Registry).trackingUp},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			srv := redistest.Start(t)
			var forceHash atomic.Value
			forceHash.Store("")
			ran, gate := make(chan struct{}), make(chan struct{})
			late := func(c redis.Cmder) {
				if args := c.Args(); len(args) > 1 && args[0] == "evalsha" && args[1] == forceHash.Load() {
					close(ran)
					<-gate // the reply is late: the holder heard first
				}
			}
			client := aclClient(t, srv, tc.rules...)
			client.AddHook(redistest.AfterReply(late))
			r := newRegistry(t, client, append([]Option{WithRenewal(false)}, tc.opts...)...)
			lock := r.Obtain("k")
			_, err := r.ForceUnlock(ctx, "warm-up") // loads the script: the next call is an EVALSHA
			require.NoError(t, err)
			forceHash.Store(r.peer.ForceUnlock(lock.keys(), "k", 0, 0, "").Script.Hash())
			h, err := lock.Acquire(ctx)
			require.NoError(t, err)
			require.Eventually(t, func() bool { return tc.ready(r) }, 5*time.Second, time.Millisecond)
			forced := make(chan bool)
			go func() {
				found, err := r.ForceUnlock(ctx, "k")
				assert.NoError(t, err)
				forced <- found
			}()
			<-ran
			requireFires(t, h.Lost(), 5*time.Second, "the holder heard")
			require.ErrorContains(t, h.Err(), LossForced.explain())
			require.ErrorIs(t, h.Release(ctx), ErrLockLost)
			next, err := lock.Acquire(ctx)
			require.NoError(t, err)
			close(gate)
			require.True(t, <-forced)
			// The late reply has the new hold's key checked: a second is plenty.
			for end := time.Now().Add(time.Second); next.wasForced() && time.Now().Before(end); {
				time.Sleep(time.Millisecond)
			}
			require.NoError(t, next.Err(), "the new hold keeps the key")
			// Its key changes behind its back: not by a forced unlock.
			require.NoError(t, srv.Client(t).Set(ctx, next.redisKey(), "intruder", 0).Err())
			err = next.Release(ctx)
			require.ErrorIs(t, err, ErrLockLost)
			require.NotContains(t, err.Error(), LossForced.explain(), "the new hold was not forced open")
		})
	}
}
