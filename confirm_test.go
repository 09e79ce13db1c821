package lockreg

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg/internal/redistest"
)

// Without tracking, a hand-off is confirmed by a check on the registry's
// client. A check that fails (here: GET refused for a moment) must be
// tried again, as the tracker tries again at its next turn: else the
// release waits until the next hold's release or its deadline.
func TestAHandOffWhoseCheckFailedIsCheckedAgainWithoutTracking(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	client := aclClient(t, srv, "+@all", "-client")
	r := newRegistry(t, client, WithLocalHandoff(16, time.Hour), WithRetryInterval(10*time.Millisecond))
	require.False(t, r.Stats().Tracking)
	first, next := heldAndWaitedFor(t, r, "k")

	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "locker", "-get").Err())
	released := make(chan error, 1)
	go func() { released <- first.Release(ctx) }()
	h := <-next
	require.NotNil(t, h, "the waiter got the key")
	require.Equal(t, viaHandoff, h.via)
	time.Sleep(200 * time.Millisecond) // the check fails meanwhile
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "locker", "+get").Err())
	select {
	case err := <-released:
		require.NoError(t, err, "a later check found the key the registry's")
	case <-time.After(3 * time.Second):
		require.NoError(t, h.Release(ctx))
		t.Fatalf("the release still waits for its confirmation while the next hold lasts (then: %v)", <-released)
	}
	require.NoError(t, h.Release(ctx))
}

// TestATenureStruckTwiceTellsEveryHoldTheFirstCause: two goroutines may
// find a tenure's key changed at once (the tracker, the watchdog), each
// with its cause. The first strike is the tenure's loss: the release
// waiting for its hand-off's confirmation learns it, and so must the hold
// it was handed to, though the other goroutine tells the holds first.
func TestATenureStruckTwiceTellsEveryHoldTheFirstCause(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	client := aclClient(t, srv, "+@all", "-client", "-get") // no check answers the hand-off
	r := newRegistry(t, client, WithLocalHandoff(16, time.Hour))
	first, next := heldAndWaitedFor(t, r, "k")
	released := make(chan error, 1)
	go func() { released <- first.Release(ctx) }()
	h := <-next
	require.NotNil(t, h, "the waiter got the key")

	h.tenure.strike("k", LossOverwritten) // the first finder, which tells the holds next
	h.endLease(LossDeleted)               // the second, all at once
	h.lose(LossOverwritten)
	require.ErrorContains(t, <-released, LossOverwritten.explain(), "the release learns the first strike")
	require.ErrorContains(t, h.Err(), LossOverwritten.explain(), "so does the hold it was handed to")
	require.Equal(t, LossOverwritten, h.tenure.loss())
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "locker", "+get").Err())
	require.ErrorIs(t, h.Release(ctx), ErrLockLost)
}

// A hold handed off locally ends with a live lease (nextLocalHold): a
// lapse of the tenure's lease comes during a later hold, and is that
// hold's loss. A release waiting for its confirmation when the lease runs
// out was not confirmed, and must say so, not report the later hold's
// lapse as its own loss.
func TestAHandOffIsNotToldTheLapseOfALaterHold(t *testing.T) {
	ctx := context.Background()
	admin, h, released := handedOffUnconfirmed(t)
	require.Eventually(t, h.leaseOver, 2*unconfirmedLease, time.Millisecond)
	// In Redis the key outlives the lease, which is measured from when
	// the acquisition was sent: a read now still finds it the registry's,
	// but came after the lease, when the key may have passed through other
	// owners and back, and confirms nothing.
	require.NoError(t, admin.PExpire(ctx, h.redisKey(), time.Minute).Err())
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "locker", "+get").Err())
	err := <-released
	require.NotErrorIs(t, err, ErrLockLost, "the lapse is the next hold's")
	require.ErrorIs(t, err, ErrRedis, "no read confirmed the key")
	require.ErrorIs(t, h.Release(ctx), ErrLockLost, "the next hold's lease ran out")
}

// unconfirmedLease is the lease of handedOffUnconfirmed's registry.
const unconfirmedLease = time.Second

// handedOffUnconfirmed hands a key off locally a third into its lease,
// on a registry without renewal whose reads Redis refuses (the ACL user
// "locker" lacks GET), so that no read confirms the hand-off for now: the
// first hold's release waits on released, and h is the next hold.
func handedOffUnconfirmed(t *testing.T) (admin *redis.Client, h *Hold, released <-chan error) {
	t.Helper()
	srv := redistest.Start(t)
	admin = srv.Client(t)
	client := aclClient(t, srv, "+@all", "-client")
	r := newRegistry(t, client, WithLocalHandoff(16, time.Hour), WithRetryInterval(10*time.Millisecond),
		WithExpireAfter(unconfirmedLease), WithRenewal(false))
	first, next := heldAndWaitedFor(t, r, "k")
	// The hand-off comes well into the lease, so that the release's wait
	// for its confirmation outlasts the lease (confirmHandoff).
	time.Sleep(unconfirmedLease / 3)
	require.NoError(t, admin.Do(context.Background(), "ACL", "SETUSER", "locker", "-get").Err())
	done := make(chan error, 1)
	go func() { done <- first.Release(context.Background()) }()
	h = <-next
	require.NotNil(t, h, "the waiter got the key")
	require.Equal(t, viaHandoff, h.via)
	return admin, h, done
}

// heldAndWaitedFor takes key on r, and has another goroutine wait for it:
// first's release hands it off, and next then gets the waiter's hold.
func heldAndWaitedFor(t *testing.T, r *Registry, key string) (first *Hold, next <-chan *Hold) {
	t.Helper()
	first, err := r.Obtain(key).Acquire(context.Background())
	require.NoError(t, err)
	waiter := make(chan *Hold, 1)
	go func() {
		h, _ := r.Obtain(key).Acquire(context.Background())
		waiter <- h
	}()
	require.Eventually(t, func() bool { return waitersOf(r, key) == 1 }, 5*time.Second, time.Millisecond)
	return first, waiter
}

// A read whose reply comes after the tenure's lease ran out confirms no
// hand-off, even if it finds the key the registry's: the key may have
// lapsed in Redis and come back since. Here the key certainly outlives
// the lease in Redis (extended before the lease ends, where
// TestAHandOffIsNotToldTheLapseOfALaterHold extends it after, when Redis
// may have expired it already), so the read after the lease finds it.
func TestAReadAfterTheLeaseConfirmsNoHandOffThoughItFindsTheKey(t *testing.T) {
	ctx := context.Background()
	admin, h, released := handedOffUnconfirmed(t)
	require.True(t, admin.PExpire(ctx, h.redisKey(), time.Minute).Val(), "the key outlives the lease in Redis")
	require.Eventually(t, h.leaseOver, 2*unconfirmedLease, time.Millisecond)
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "locker", "+get").Err())
	err := <-released
	require.ErrorIs(t, err, ErrRedis, "a read after the lease confirmed the hand-off")
	require.NotErrorIs(t, err, ErrLockLost, "the lapse is the next hold's")
	require.ErrorIs(t, h.Release(ctx), ErrLockLost, "the next hold's lease ran out")
}
