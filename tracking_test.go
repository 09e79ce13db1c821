package lockreg

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg/internal/protocol"
	"github.com/lockreg/lockreg/internal/redistest"
)

// blindLimit bounds how long a holder may stay blind to a change of its
// key in these tests: tracking tells it within a round trip or two, a
// renewal (lease/3 of the default 30s lease) would take 10s.
const blindLimit = time.Second

// holdAndChange acquires key on a fresh registry of client (default
// options), lets change alter the key behind the holder's back, and
// returns the hold once its Lost channel fired. opts are the registry's.
func holdAndChange(t *testing.T, client redis.UniversalClient, key string, change func(redisKey string), opts ...Option) *Hold {
	t.Helper()
	return holdAndChangeWithin(t, client, key, blindLimit, change, opts...)
}

// holdAndChangeWithin is holdAndChange for a holder that may learn of the
// change as late as limit.
func holdAndChangeWithin(t *testing.T, client redis.UniversalClient, key string, limit time.Duration, change func(redisKey string), opts ...Option) *Hold {
	t.Helper()
	ctx := context.Background()
	r := newRegistry(t, client, opts...)
	reads := trackingReads(r)
	h, err := r.Obtain(key).Acquire(ctx)
	require.NoError(t, err)
	// A change that leaves the key the holder's (as its own renewals do)
	// is read again once tracking told of it: a second read proves that
	// the first one armed the key.
	require.Eventually(t, func() bool {
		require.NoError(t, client.PExpire(ctx, h.redisKey(), time.Minute).Err())
		return reads.Load() >= 2
	}, 5*time.Second, 10*time.Millisecond, "the key is tracked")
	// The reads that the last PEXPIREs asked for are over: a change from
	// now on is the only news.
	readsSettled(reads)
	requireOpen(t, h.Lost(), "a change that leaves the key the holder's is no loss")
	change(h.redisKey())
	blind := requireFires(t, h.Lost(), limit, "the holder learns that its key changed")
	t.Logf("%s: told %v after the change returned", key, blind)
	return h
}

func requireCause(t *testing.T, h *Hold, cause LossCause) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	require.Equal(t, cause, h.cause)
	require.ErrorIs(t, h.lostErr, ErrLockLost)
}

func TestAHolderLearnsAtOnceThatItsKeyWasDeleted(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	h := holdAndChange(t, client, "deleted", func(redisKey string) {
		require.NoError(t, client.Del(context.Background(), redisKey).Err())
	})
	requireCause(t, h, LossDeleted)
	require.ErrorIs(t, h.Release(context.Background()), ErrLockLost)
}

func TestAHolderLearnsAtOnceThatItsKeyWasOverwritten(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	h := holdAndChange(t, client, "overwritten", func(redisKey string) {
		require.NoError(t, client.Set(context.Background(), redisKey, "someone-else", time.Minute).Err())
	})
	requireCause(t, h, LossOverwritten)
	require.ErrorIs(t, h.Release(context.Background()), ErrLockLost)
	require.Equal(t, "someone-else", client.Get(context.Background(), h.redisKey()).Val(), "the release spares the new value")
}

func TestAHolderLearnsAtOnceThatTheDatabaseWasFlushed(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	h := holdAndChange(t, client, "flushed", func(string) {
		require.NoError(t, client.FlushAll(context.Background()).Err())
	})
	requireCause(t, h, LossFlushed)
}

func TestDosContextEndsAtOnceWhenItsKeyIsDeleted(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client)
	err := r.Do(ctx, "do-deleted", func(ctx context.Context) error {
		require.NoError(t, client.Del(ctx, r.HoldFor(ctx, "do-deleted").redisKey()).Err())
		select {
		case <-ctx.Done():
			require.ErrorIs(t, context.Cause(ctx), ErrLockLost)
			return nil
		case <-time.After(blindLimit):
			return errors.New("fn's context did not end")
		}
	})
	require.ErrorIs(t, err, ErrLockLost)
}

func TestAHolderLearnsFromItsFirstAcquisitionOn(t *testing.T) {
	// No settling: the key changes right after the registry's first
	// acquisition, before its tracking may be up; arming it finds that.
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	for i := range 20 {
		r, err := New(client, "lockreg-test:"+t.Name()+strconv.Itoa(i), WithLogger(slog.New(slog.DiscardHandler)))
		require.NoError(t, err)
		h, err := r.Obtain("k").Acquire(ctx)
		require.NoError(t, err)
		require.NoError(t, client.Del(ctx, h.redisKey()).Err())
		requireFires(t, h.Lost(), blindLimit, "the first hold learns of the DEL")
		require.NoError(t, r.Close())
	}
}

// A registry's first hold is read once to arm its key: the new tracking
// connection's check of the held keys arms it, and the hold's own arming,
// due later, reads nothing more. A second read could find a forced
// unlock's DEL before the target has delivered the note that names it,
// and report the loss as deleted.
func TestAKeyReadAtOnceIsNotReadAgainToArmIt(t *testing.T) {
	ctx := context.Background()
	r := newRegistry(t, redistest.Shared(t).Client(t))
	reads := trackingReads(r)
	h, err := r.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	requireTracking(t, r)
	readsSettled(reads)
	require.EqualValues(t, 1, reads.Load(), "one read of the held key")
	require.NoError(t, h.Release(ctx))
}

func TestARestartJustAfterTheFirstAcquisitionIsNoticedAtOnce(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	r := newRegistry(t, srv.Client(t))
	h, err := r.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	srv.Restart(t)
	requireFires(t, h.Lost(), 2*blindLimit, "the holder learns of the restart")
}

func TestAHoldersOwnRenewalsAndHandOffsAreNoLoss(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	const lease = 300 * time.Millisecond
	r := newRegistry(t, client, WithExpireAfter(lease), WithRetryInterval(20*time.Millisecond))
	h, err := r.Obtain("renewed").Acquire(ctx)
	require.NoError(t, err)
	time.Sleep(5 * lease) // fifteen renewals, each an invalidation of the key
	requireOpen(t, h.Lost(), "its own renewals are no loss")
	require.True(t, r.Stats().Tracking)
	require.NoError(t, h.Release(ctx))

	// A release and a new acquisition of the same key by the same registry
	// change the key too.
	for range 50 {
		h, err := r.Obtain("renewed").Acquire(ctx)
		require.NoError(t, err)
		requireOpen(t, h.Lost(), "a key taken again is no loss")
		require.NoError(t, h.Release(ctx))
	}
}

func TestWithoutTrackingAHolderLearnsAtItsRenewal(t *testing.T) {
	// An ACL without CLIENT, as some managed servers have: the registry
	// says once that it cannot track, and falls back to its renewals.
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	client := aclClient(t, srv, "+@all", "-client")
	var logs syncBuffer
	const lease = 600 * time.Millisecond
	r := newRegistry(t, client, WithExpireAfter(lease), WithRetryInterval(20*time.Millisecond),
		WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))))
	h, err := r.Obtain("untracked").Acquire(ctx)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "CLIENT TRACKING unavailable") }, 5*time.Second, 10*time.Millisecond)
	require.False(t, r.Stats().Tracking)
	require.NoError(t, admin.Del(ctx, h.redisKey()).Err())
	requireFires(t, h.Lost(), lease, "the renewal finds the key gone")
	requireCause(t, h, LossDeleted)
	require.Equal(t, 1, strings.Count(logs.String(), "CLIENT TRACKING unavailable"), "said once")
}

func TestAHolderOnClusterLearnsAtOnceOfAFlushOrAnEvictionOfItsNode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := clusterClient(t, redistest.StartCluster(t, 3))
	nodeOf := func(redisKey string) *redis.Client {
		node, err := client.MasterForKey(ctx, redisKey)
		require.NoError(t, err)
		return node
	}
	for _, key := range []string{"a", "b", "c", "d"} { // on several nodes
		h := holdAndChange(t, client, key, func(redisKey string) {
			require.NoError(t, nodeOf(redisKey).FlushAll(ctx).Err())
		})
		requireCause(t, h, LossFlushed)
	}

	// One primary may evict: a registry refuses it, unless allowed to, and
	// then an eviction there is a loss at once.
	probe := newRegistry(t, client).Obtain("e").keys().Lock()
	node := nodeOf(probe)
	info, err := node.Info(ctx, "memory").Result()
	require.NoError(t, err)
	require.NoError(t, node.ConfigSet(ctx, "maxmemory", strconv.FormatInt(usedMemory(t, info)+(8<<20), 10)).Err())
	require.NoError(t, node.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err())
	err = newRegistry(t, client).Do(ctx, "e", func(context.Context) error {
		t.Error("fn ran on a primary that may evict its key")
		return nil
	})
	require.ErrorIs(t, err, ErrServerEvicts)
	value := strings.Repeat("x", 64<<10)
	h := holdAndChange(t, client, "e", func(redisKey string) {
		for i := 0; client.Exists(ctx, redisKey).Val() == 1; i++ {
			require.Less(t, i, 10000, "the primary never evicted the lock key")
			// The lock key's hash tag puts the filler on its primary.
			require.NoError(t, client.Set(ctx, redisKey+":filler-"+strconv.Itoa(i), value, 0).Err())
		}
	}, WithEvictionAllowed())
	requireCause(t, h, LossEvicted)
}

// usedMemory is used_memory from an INFO memory reply.
func usedMemory(t *testing.T, info string) int64 {
	t.Helper()
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			require.NoError(t, err)
			return n
		}
	}
	t.Fatalf("no used_memory in %q", info)
	return 0
}

func TestAHolderOnClusterLearnsAtOnceThatItsKeyWasDeleted(t *testing.T) {
	t.Parallel()
	client := clusterClient(t, redistest.StartCluster(t, 3))
	for _, key := range []string{"a", "b", "c", "d"} { // on several nodes
		h := holdAndChange(t, client, key, func(redisKey string) {
			require.NoError(t, client.Del(context.Background(), redisKey).Err())
		})
		requireCause(t, h, LossDeleted)
	}
}

// A slot migration moves a held key to another node: the tracker's read
// of it there is redirected (MOVED), and the key is armed again on the
// new node's tracker, so that a change there is still told at once, not
// at the next renewal.
func TestAHolderOnClusterStillLearnsAtOnceAfterItsKeyMoved(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	addrs := redistest.StartCluster(t, 3)
	client := clusterClient(t, addrs)
	r := newRegistry(t, client)
	reads := trackingReads(r)
	h, err := r.Obtain("moved").Acquire(ctx)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return reads.Load() >= 1 }, 5*time.Second, time.Millisecond, "the key is armed")

	before := reads.Load()
	redistest.BeginSlotMigration(t, addrs, protocol.Slot(h.redisKey())).Finish(t)
	// The move's invalidation is verified on the old node, which redirects;
	// then the key is armed on its new node.
	require.Eventually(t, func() bool { return reads.Load() >= before+2 }, 5*time.Second, time.Millisecond, "the moved key is armed again")
	requireOpen(t, h.Lost(), "a move is no loss")

	require.NoError(t, client.Del(ctx, h.redisKey()).Err())
	requireFires(t, h.Lost(), blindLimit, "the holder learns at once that its moved key was deleted")
	requireCause(t, h, LossDeleted)
}

func TestAHoldHandedOffJustAfterItsKeyChangedIsToldAtItsRelease(t *testing.T) {
	// A hold that ends in a local hand-off asks Redis nothing, and tracking
	// may not have told of a change yet: the release waits for a read of
	// the key, so the hold that held it when it changed is told all the
	// same, and so is the hold it passed to. Without tracking (an ACL
	// without CLIENT), the read is the registry's client's: a renewal
	// would tell only the hold it passed to.
	for _, tracking := range []bool{true, false} {
		t.Run(fmt.Sprintf("tracking=%v", tracking), func(t *testing.T) {
			srv := redistest.Start(t)
			client := srv.Client(t)
			if !tracking {
				client = aclClient(t, srv, "+@all", "-client")
			}
			// A waiter that takes the key afresh (the change was found before
			// its hand-off made the hold it would inherit current) waits for
			// the other owner's key to expire: shortly, at short retries.
			r := newRegistry(t, client, WithLocalHandoff(16, time.Hour), WithRetryInterval(10*time.Millisecond))
			handedOffJustAfterAChange(t, r, srv.Client(t))
			require.Equal(t, tracking, r.Stats().Tracking)
		})
	}
}

// handedOffJustAfterAChange changes a held key by admin just before its
// hold is handed off, 20 times per change, and checks who is told.
func handedOffJustAfterAChange(t *testing.T, r *Registry, admin *redis.Client) {
	ctx := context.Background()
	client := admin
	changes := map[string]func(redisKey string){
		"deleted": func(redisKey string) { require.NoError(t, client.Del(ctx, redisKey).Err()) },
		"overwritten": func(redisKey string) {
			require.NoError(t, client.Set(ctx, redisKey, "someone-else", 50*time.Millisecond).Err())
		},
	}
	handedOff := 0
	for name, change := range changes {
		for i := range 20 {
			key := name + "-" + strconv.Itoa(i)
			first, next := heldAndWaitedFor(t, r, key)
			change(first.redisKey())
			require.ErrorIs(t, first.Release(ctx), ErrLockLost, "the hold that held the key when it changed is told")
			require.ErrorIs(t, first.Err(), ErrLockLost)
			h := <-next
			require.NotNil(t, h, "the waiter got the key")
			if h.via == viaHandoff {
				handedOff++
				requireFires(t, h.Lost(), blindLimit, "the hold it passed the key to learns it too")
				require.ErrorIs(t, h.Release(ctx), ErrLockLost)
				continue
			}
			require.NoError(t, h.Release(ctx), "a waiter that took the key afresh holds it")
		}
	}
	t.Logf("%d of %d releases handed the key off", handedOff, 2*20)
}

func TestAHoldHandedOffIsConfirmedAtItsRelease(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client, WithLocalHandoff(16, time.Hour))
	first, next := heldAndWaitedFor(t, r, "confirmed")
	require.NoError(t, first.Release(ctx), "a read after the hand-off found the key the registry's")
	require.ErrorIs(t, first.Err(), ErrNotHeld)
	h := <-next
	require.NotNil(t, h, "the waiter got the key")
	require.Equal(t, viaHandoff, h.via)
	require.NoError(t, h.Release(ctx))
}

// A loss found while the key is being handed off locally may look for the
// key's current hold before the hold handed off becomes it, and so miss
// it. That hold must not be given out, unsignalled, for a key the registry
// lost: the acquisition it was handed to takes the key in Redis instead.
// (The interleaving, rare in TestAHoldHandedOffJustAfterItsKeyChangedIs-
// ToldAtItsRelease, is played here step by step: the releasing hold's part
// by hand, the acquisition's by the library.)
func TestAHandOffThatALossOvertookTakesTheKeyInRedis(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client, WithLocalHandoff(16, time.Hour))
	first, err := r.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	got := make(chan *Hold, 1)
	go func() {
		h, _ := r.Obtain("k").Acquire(ctx)
		got <- h
	}()
	require.Eventually(t, func() bool { return waitersOf(r, "k") == 1 }, 5*time.Second, time.Millisecond)

	// first's release begins, and makes the hold it will hand off.
	first.mu.Lock()
	first.released = true
	first.mu.Unlock()
	first.local.hold.Store(nil)
	next := r.nextLocalHold(first, first.token, first.local)
	require.NotNil(t, next, "a hand-off is due")
	// The key changes, and a read finds it so before next is current.
	require.NoError(t, client.Del(ctx, first.redisKey()).Err())
	r.changedBehindItsBack(first, LossDeleted, true, false)
	// The hand-off goes on.
	require.True(t, first.local.unlock(handoff{hold: next}))
	r.leave("k")
	r.holdEnded()

	h := <-got
	require.NotNil(t, h)
	require.NotSame(t, next, h, "the hold of the lost tenure is not given out")
	require.Equal(t, viaRedis, h.via, "the key is taken in Redis")
	require.NoError(t, h.Err())
	require.Equal(t, r.clientID, client.Get(ctx, h.redisKey()).Val())
	require.NoError(t, h.Release(ctx))
	requireNoLocalState(t, r)
}

// A tracker's target and its tracking connection dial on their own, and
// may reach different servers: after a failover, the target may resubscribe
// on the old primary (back as a replica, or named by a Sentinel that has
// not heard of the promotion yet) while the tracking connection reaches
// the new one, where CLIENT TRACKING ... REDIRECT finds no such target, or
// finds another client of the same id (ids are small numbers per server),
// which then gets the invalidations. The tracker then moves its target,
// and a holder still learns at once that its key changed.
func TestATrackerWhoseTargetIsOnAnotherServerMovesIt(t *testing.T) {
	ctx := context.Background()
	oldServer, newServer := redistest.Start(t), redistest.Start(t)
	admin := newServer.Client(t)
	var addr atomic.Value // where the client's dialer goes: the current primary, as a Sentinel names it
	addr.Store(oldServer.Addr())
	client := redis.NewClient(&redis.Options{Addr: "primary", Dialer: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, addr.Load().(string))
	}})
	t.Cleanup(func() { _ = client.Close() })
	r := newRegistry(t, client, WithPubSub(false))
	requireTracking(t, r)
	reads := trackingReads(r)

	// The primary changes; the old server drops its ordinary connections
	// (the tracking connection among them), not the target's subscription.
	addr.Store(newServer.Addr())
	require.NoError(t, oldServer.Client(t).Do(ctx, "client", "kill", "type", "normal").Err())
	h, err := r.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	require.Equal(t, r.clientID, admin.Get(ctx, h.redisKey()).Val(), "held on the new primary")
	require.Eventually(t, func() bool {
		subs, err := admin.PubSubNumSub(ctx, protocol.InvalidationChannel).Result()
		return err == nil && subs[protocol.InvalidationChannel] == 1
	}, 10*time.Second, 10*time.Millisecond, "the target moves to the new primary")
	// The new tracking connection tracks the held key: a change that
	// leaves it the holder's is read again (as in holdAndChange).
	armed := reads.Load()
	require.Eventually(t, func() bool {
		require.NoError(t, admin.PExpire(ctx, h.redisKey(), time.Minute).Err())
		return reads.Load() >= armed+2
	}, 10*time.Second, 10*time.Millisecond, "the key is tracked again")
	requireOpen(t, h.Lost(), "the key is still held")
	require.NoError(t, admin.Del(ctx, h.redisKey()).Err())
	requireFires(t, h.Lost(), blindLimit, "the holder learns at once that its key was deleted")
}

// A Cluster failover moves a held key to the replica that took its
// primary's place: the holder must learn at once of a change there too,
// not at its next renewal, though the crashed primary never comes back.
func TestAHolderOnClusterStillLearnsAtOnceAfterAFailover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := launchCluster(t, 1)
	client := clusterClient(t, c.Addrs())
	// A long lease: no renewal in the test's time finds the change instead.
	r := newRegistry(t, client, WithExpireAfter(3*time.Minute))
	reads := trackingReads(r)
	h, err := r.Obtain("failover").Acquire(ctx)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return reads.Load() >= 1 }, 5*time.Second, time.Millisecond, "the key is armed")

	slot := protocol.Slot(h.redisKey())
	primary, replica, err := c.Shard(slot)
	require.NoError(t, err)
	// The replica has the key before its primary crashes.
	onReplica := redis.NewClient(&redis.Options{Addr: replica.Addr(), PoolSize: 1,
		OnConnect: func(ctx context.Context, cn *redis.Conn) error { return cn.ReadOnly(ctx).Err() }})
	t.Cleanup(func() { _ = onReplica.Close() })
	require.Eventually(t, func() bool { return onReplica.Exists(ctx, h.redisKey()).Val() == 1 },
		5*time.Second, 10*time.Millisecond, "the replica has the key")
	primary.Crash()
	require.NoError(t, c.AwaitFailover(slot, replica, 30*time.Second))
	t.Logf("%s took slot %d over from %s", replica.Addr(), slot, primary.Addr())
	requireOpen(t, h.Lost(), "the key survived the failover")

	// The key lives on the new primary now; a change there is told within
	// a round trip or two of the failover, as a change before the key was
	// armed there is found by its arming.
	require.NoError(t, replica.Client(t).Del(ctx, h.redisKey()).Err())
	requireFires(t, h.Lost(), 10*time.Second, "the holder learns that its key was deleted after the failover")
	require.ErrorIs(t, h.Err(), ErrLockLost)
}

// A read of a held key that Redis refuses for now (BUSY, while a long
// script runs) tracks nothing: left so, the key would go untracked for the
// rest of its hold, and a change told only at the next renewal. The read
// is made again until the server answers, as after a redirect.
func TestAKeyWhoseReadRedisRefusedForNowIsTrackedAgain(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	require.NoError(t, admin.ConfigSet(ctx, "busy-reply-threshold", "10").Err())
	r := newRegistry(t, srv.Client(t), WithRetryInterval(50*time.Millisecond))
	reads := trackingReads(r)
	h, err := r.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return reads.Load() >= 1 }, 5*time.Second, time.Millisecond, "the key is armed")

	// The PEXPIRE invalidates the key; its read comes while the script
	// runs, and is refused.
	before := reads.Load()
	busy := `local t0 = redis.call('TIME') repeat local t = redis.call('TIME') until (t[1] - t0[1]) * 1000000 + (t[2] - t0[2]) > 300000 return 1`
	_, err = admin.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.PExpire(ctx, h.redisKey(), time.Minute)
		p.Eval(ctx, busy, nil)
		return nil
	})
	require.NoError(t, err)
	require.Greater(t, reads.Load(), before, "the invalidation was read during the script")
	time.Sleep(200 * time.Millisecond) // the reads made again, if any, are over
	requireOpen(t, h.Lost(), "the key is still held")
	require.NoError(t, admin.Del(ctx, h.redisKey()).Err())
	requireFires(t, h.Lost(), blindLimit, "the holder learns at once that its key was deleted")
}

// After a longer outage the tracker's connection may come back seconds
// after Redis does (its dials fail for a while after failed ones, and its
// retries back off); the first subscription back (the registry's own, or,
// with pub/sub off, the tracker's target) has the held keys checked
// meanwhile on the registry's client, so that a holder whose key the
// restart lost learns at once, not seconds later.
func TestAHolderHearsOfARestartAfterALongOutageAtOnce(t *testing.T) {
	for _, pubSub := range []bool{true, false} {
		t.Run("pubsub="+strconv.FormatBool(pubSub), func(t *testing.T) { restartAfterALongOutage(t, pubSub) })
	}
}

func restartAfterALongOutage(t *testing.T, pubSub bool) {
	ctx := context.Background()
	srv := redistest.Start(t)
	client := srv.Client(t)
	r := newRegistry(t, client, WithPubSub(pubSub))
	h, err := r.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	requireTracking(t, r)
	require.Eventually(t, func() bool { return r.tracking.single.Load().up.Load() && (!pubSub || r.notes.subscribed.Load()) },
		5*time.Second, time.Millisecond, "subscribed")
	srv.Stop(t)
	time.Sleep(6 * time.Second) // the tracker's retries back off meanwhile
	require.NoError(t, srv.Relaunch())
	took := requireFires(t, h.Lost(), blindLimit, "the holder hears of the restart")
	t.Logf("Lost fired %v after Redis answered again", took)
	require.ErrorContains(t, h.Err(), "restart or failover")
	// go-redis probes a server whose dials failed once a second, even
	// after its client closed: the probes end before the test does.
	require.NoError(t, r.Close())
	require.NoError(t, client.Close())
	requireDialProbesEnd(t)
}

// TestStatsTrackingIsFalseWhileTheServerIsDown: Stats().Tracking says
// that the registry learns at once that a held key changed, which it
// cannot while its tracker's server does not answer; it is true again
// once the tracker is back.
func TestStatsTrackingIsFalseWhileTheServerIsDown(t *testing.T) {
	srv := redistest.Start(t)
	r := newRegistry(t, srv.Client(t))
	requireTracking(t, r)
	srv.Stop(t)
	require.Eventually(t, func() bool { return !r.Stats().Tracking }, 5*time.Second, time.Millisecond, "tracking is off while the server is down")
	srv.Restart(t)
	requireTracking(t, r)
}
