package lockreg

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg/internal/protocol"
	"github.com/lockreg/lockreg/internal/redistest"
)

// failoverLease is longer than three failovers of a SentinelGroup (about
// 2s each), so that holds the promoted replica has are renewed there
// before their lease runs out: renewal fails while no primary answers,
// and the last renewal before the crash may be a third of a lease old.
const failoverLease = 15 * time.Second

// cutOffReplica freezes the group's replica and drops its link at the
// primary, so that the primary goes on acknowledging writes the replica
// will never see: what a lagging or partitioned replica does to
// asynchronous replication, made certain.
func cutOffReplica(t *testing.T, g *redistest.SentinelGroup, primary *redis.Client) {
	t.Helper()
	g.Replica.Pause(t)
	killed, err := primary.ClientKillByFilter(context.Background(), "TYPE", "replica").Result()
	require.NoError(t, err)
	require.Equal(t, int64(1), killed, "the primary had its replica linked")
}

// crashPrimary kills the primary with SIGKILL, lets the replica go on,
// and waits for the Sentinels to promote it. It returns the new primary's
// client, when the primary died, and how long the promotion took.
func crashPrimary(t *testing.T, g *redistest.SentinelGroup) (*redis.Client, time.Time, time.Duration) {
	t.Helper()
	crashed := time.Now()
	g.Primary.Kill(t)
	g.Replica.Resume(t)
	promoted := g.WaitForFailover(t, g.Primary, 20*time.Second)
	require.Same(t, g.Replica, promoted)
	return promoted.Client(t), crashed, time.Since(crashed)
}

// requireRenewedSince waits until the lease of every lock's key shows that
// it was renewed after crashed: without a renewal since, no key could have
// more than crashed + lease - now left.
func requireRenewedSince(t *testing.T, c *redis.Client, locks []*Lock, crashed time.Time) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, lock := range locks {
			unrenewed := time.Until(crashed.Add(failoverLease))
			if ttl := c.PTTL(context.Background(), lock.keys().Lock()).Val(); ttl <= unrenewed {
				return false
			}
		}
		return true
	}, failoverLease/3+10*time.Second, 50*time.Millisecond, "the holds' leases are renewed on the promoted replica")
}

// firstAcquisition waits until a fresh key can be locked through r after a
// failover, and returns when.
func firstAcquisition(t *testing.T, r *Registry, key string) time.Time {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	lock := r.Obtain(key)
	require.NoError(t, lock.LockContext(ctx), "new acquisitions succeed once the replica is promoted")
	at := time.Now()
	require.NoError(t, lock.UnlockContext(ctx))
	return at
}

// tryLockWithin retries lock.TryLock until it succeeds or limit passes. It
// runs in the calling goroutine, which is to own the lock (unlike
// require.Eventually's condition).
func tryLockWithin(t *testing.T, lock *Lock, limit time.Duration, msg string) {
	t.Helper()
	for deadline := time.Now().Add(limit); !lock.TryLock(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not locked within %v", msg, limit)
		}
	}
}

// TestFailoverKeepsWorkingAndReportsLostHolds kills the primary of a
// Sentinel group while a registry on a FailoverClient holds keys, some of
// which never reached the replica. After the promotion the registry takes
// new keys again; every hold either survived (its key on the new primary,
// ours, renewed there, released cleanly) or is reported lost (Lost fires,
// the unlock returns ErrLockLost): none is silently gone.
func TestFailoverKeepsWorkingAndReportsLostHolds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g := redistest.StartSentinelGroup(t)
	r := newRegistry(t, g.FailoverClient(t), WithExpireAfter(failoverLease))
	other := newRegistry(t, g.FailoverClient(t), WithExpireAfter(failoverLease))
	primary, replica := g.Primary.Client(t), g.Replica.Client(t)

	replicated := holdKeys(t, r, "replicated", 10)
	require.Eventually(t, func() bool {
		for _, lock := range replicated {
			if replica.Get(ctx, lock.keys().Lock()).Val() != r.clientID {
				return false
			}
		}
		return true
	}, 5*time.Second, 10*time.Millisecond, "the replica has the first holds")

	// A registry that renews nothing hears of the loss only by checking
	// its holds when its subscription reconnects to the new primary.
	unrenewed := newRegistry(t, g.FailoverClient(t), WithExpireAfter(time.Minute), WithRenewal(false))
	cutOffReplica(t, g, primary)
	unreplicated := holdKeys(t, r, "unreplicated", 10)
	unrenewedHold, err := unrenewed.Obtain("unrenewed").Acquire(ctx)
	require.NoError(t, err)
	require.Eventually(t, unrenewed.notes.subscribed.Load, 5*time.Second, time.Millisecond)
	lostTokens := make([]int64, len(unreplicated))
	for i, lock := range unreplicated {
		lostTokens[i] = mustToken(t, lock)
	}

	newPrimary, crashed, promotion := crashPrimary(t, g)
	acquired := firstAcquisition(t, r, "after-failover")
	t.Logf("failover: replica promoted %v after the crash; first new acquisition through the FailoverClient after %v",
		promotion.Round(time.Millisecond), acquired.Sub(crashed).Round(time.Millisecond))

	requireFires(t, unrenewedHold.Lost(), 10*time.Second, "a hold nothing renews heard of the failover that lost it")
	t.Logf("failover: a hold with renewal off heard of its loss %v after the promotion", (time.Since(crashed) - promotion).Round(time.Millisecond))
	require.ErrorContains(t, unrenewedHold.Release(ctx), "restart or failover")

	var reported time.Duration
	for i, lock := range unreplicated {
		require.Zero(t, newPrimary.Exists(ctx, lock.keys().Lock()).Val(), "the promoted replica never had %s", lock.Key())
		requireFires(t, lock.Lost(), failoverLease/3+10*time.Second, "a hold whose key the failover lost")
		if i == 0 {
			reported = time.Since(crashed)
		}

		// The documented hazard: another registry may take the key now
		// (once its own FailoverClient found the new primary). Its token
		// still rises above the lost hold's, though the failover lost the
		// stored one too.
		taken := other.Obtain(lock.Key())
		tryLockWithin(t, taken, 10*time.Second, "the lost key is free on the new primary")
		require.Greater(t, mustToken(t, taken), lostTokens[i], "tokens rise across the failover")
		require.ErrorIs(t, lock.UnlockContext(ctx), ErrLockLost)
		require.Equal(t, other.clientID, newPrimary.Get(ctx, lock.keys().Lock()).Val(), "the lost holder's unlock leaves the successor's key alone")
		require.NoError(t, taken.UnlockContext(ctx))
	}

	requireRenewedSince(t, newPrimary, replicated, crashed)
	for _, lock := range replicated {
		requireOpen(t, lock.Lost(), "a hold the promoted replica had was reported lost")
		require.Equal(t, r.clientID, newPrimary.Get(ctx, lock.keys().Lock()).Val())
		requireHeldByAnother(t, other, lock.Key(), "a surviving hold still excludes other registries")
		require.NoError(t, lock.UnlockContext(ctx))
		requireReleased(t, newPrimary, lock.keys().Lock(), "released on the new primary")
	}
	t.Logf("failover without WithWaitReplicas: %d holds the replica had survived, %d it never had were lost and reported %v after the crash (its promotion took %v)",
		len(replicated), len(unreplicated), reported.Round(time.Millisecond), promotion.Round(time.Millisecond))
}

// TestFailoverWithWaitReplicasLosesNoAcknowledgedHold repeats the crash
// with WithWaitReplicas(1, …): the acquisitions the cut-off replica cannot
// acknowledge fail instead of being handed out, so every acknowledged hold
// survives on the promoted replica, where its holder renews and releases
// it. With no replica left, new acquisitions fail (ErrNotReplicated) until
// one follows the new primary.
func TestFailoverWithWaitReplicasLosesNoAcknowledgedHold(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g := redistest.StartSentinelGroup(t)
	const waitFor = 300 * time.Millisecond
	r := newRegistry(t, g.FailoverClient(t), WithExpireAfter(failoverLease), WithWaitReplicas(1, waitFor), WithRetryInterval(50*time.Millisecond))
	other := newRegistry(t, g.FailoverClient(t), WithExpireAfter(failoverLease))
	primary := g.Primary.Client(t)

	acknowledged := holdKeys(t, r, "acknowledged", 10)

	cutOffReplica(t, g, primary)
	const refused = 3
	for i := range refused {
		lock := r.Obtain("unacknowledged-" + strconv.Itoa(i))
		tctx, cancel := context.WithTimeout(ctx, 2*waitFor)
		err := lock.LockContext(tctx)
		cancel()
		require.ErrorIs(t, err, ErrNotReplicated, "an acquisition the replica did not acknowledge is not handed out")
		// An attempt still in its WAIT when the context ended releases
		// the key once WAIT gives up.
		require.Eventually(t, func() bool { return primary.Exists(ctx, lock.keys().Lock()).Val() == 0 },
			2*time.Second, 10*time.Millisecond, "and leaves no key behind")
	}

	newPrimary, crashed, promotion := crashPrimary(t, g)
	t.Logf("failover: replica promoted %v after the crash", promotion.Round(time.Millisecond))
	probe := other.Obtain("probe")
	tryLockWithin(t, probe, 10*time.Second, "the other registry reaches the new primary")
	require.NoError(t, probe.UnlockContext(ctx))

	requireRenewedSince(t, newPrimary, acknowledged, crashed)
	for _, lock := range acknowledged {
		requireOpen(t, lock.Lost(), "an acknowledged hold was reported lost")
		require.Equal(t, r.clientID, newPrimary.Get(ctx, lock.keys().Lock()).Val(), "an acknowledged hold survives the failover")
		requireHeldByAnother(t, other, lock.Key(), "and still excludes other registries")
		require.NoError(t, lock.UnlockContext(ctx))
		requireReleased(t, newPrimary, lock.keys().Lock(), "released on the new primary")
	}
	t.Logf("failover with WithWaitReplicas(1, %v): 0 of %d acknowledged holds lost; %d unacknowledged acquisitions refused before the crash",
		waitFor, len(acknowledged), refused)

	// The new primary has no replica: the registry refuses holds it could
	// not keep through another failover, and takes them again once a
	// replica follows the new primary.
	lock := r.Obtain("after-failover")
	for deadline := time.Now().Add(20 * time.Second); ; {
		tctx, cancel := context.WithTimeout(ctx, 3*waitFor)
		err := lock.LockContext(tctx)
		cancel()
		require.Error(t, err, "an acquisition no replica acknowledged")
		if errors.Is(err, ErrNotReplicated) {
			break
		}
		require.False(t, time.Now().After(deadline), "with no replica, acquisitions fail with ErrNotReplicated, not %v", err)
	}
	redistest.StartReplica(t, g.Replica)
	tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, lock.LockContext(tctx), "a replica of the new primary acknowledges again")
	require.NoError(t, lock.UnlockContext(ctx))
}

// TestATrackerOfANodeThatLeftTheClusterEnds: a primary that failed over
// and did not come back serves nothing: its tracker, which would dial
// it, and keep two goroutines and two clients, until Close, ends once its
// holds moved to the node that took its slots.
func TestATrackerOfANodeThatLeftTheClusterEnds(t *testing.T) {
	t.Parallel()
	c := launchCluster(t, 1)
	r := newRegistry(t, clusterClient(t, c.Addrs()))
	h, err := r.Obtain("k").Acquire(context.Background())
	require.NoError(t, err)
	requireTracking(t, r)
	primary, replica, err := c.Shard(protocol.Slot(h.redisKey()))
	require.NoError(t, err)
	left := r.trackerFor(h.redisKey())
	require.NotNil(t, left)
	primary.Crash()
	require.NoError(t, c.AwaitFailover(protocol.Slot(h.redisKey()), replica, 30*time.Second))
	require.Eventually(t, func() bool {
		r.tracking.mu.Lock()
		defer r.tracking.mu.Unlock()
		_, ok := r.tracking.trackers[replica.Addr()]
		return ok
	}, 10*time.Second, 10*time.Millisecond, "the hold moves to the new primary's tracker")
	require.Eventually(t, func() bool {
		r.tracking.mu.Lock()
		defer r.tracking.mu.Unlock()
		_, ok := r.tracking.trackers[primary.Addr()]
		return !ok
	}, 10*time.Second, 10*time.Millisecond, "the tracker of the node that left ends")
	require.Eventually(t, func() bool { return errors.Is(left.client.Ping(context.Background()).Err(), redis.ErrClosed) },
		5*time.Second, 10*time.Millisecond, "its goroutines ended, and closed its client")
}
