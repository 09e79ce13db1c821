package lockregtest

import (
	"context"
	"testing"
	"time"

	"github.com/lockreg/lockreg"
)

// How long Lose waits: for the holder's subscription, which the holder
// opens in the background once it holds a key (milliseconds, unless the
// machine is loaded), where it has no tracking to hear of the forced
// unlock by (a holder with pub/sub off on the embedded server never has
// either, and waits it all); and for the holder to be told of its loss,
// which takes milliseconds, or up to a renewal interval (Lease/3) with
// pub/sub off.
const (
	subscriptionWait = time.Second
	loseTimeout      = 5 * time.Second
)

// Lose makes r lose the hold it has on key, as an operator's
// lockreg.Registry.ForceUnlock does: the key is deleted, the fencing
// token raised past the holder's, the key's waiters (of r or another
// registry) woken, and r told. Lose returns once r signalled the hold
// lost, for lockreg.LossForced: its Lost channel is closed, the context
// of the Do that holds it has ended with a cause matching
// lockreg.ErrLockLost, and its Release returns ErrLockLost. That takes
// milliseconds: r hears of it by pub/sub. Only a registry on the embedded
// server with WithPubSub(false) hears nothing: it finds its key gone
// (lockreg.LossDeleted) at its next renewal, within a third of its lease.
//
// Lose fails the test, as t.Fatal does (so call it from the test's
// goroutine), if r does not hold key (it never took it, released it, or
// lost it already), if r was not made by this package, or if r is not
// told within 5 seconds.
func Lose(t testing.TB, r *lockreg.Registry, key string) {
	t.Helper()
	s := kitState(t, "Lose", r)
	ctx, cancel := context.WithTimeout(context.Background(), loseTimeout)
	defer cancel()
	info, err := r.Inspect(ctx, key)
	if err != nil {
		t.Fatalf("lockregtest.Lose: %v", err)
	}
	if !s.holds(key) {
		t.Fatalf("lockregtest.Lose: %s does not hold %q (%s)", s.owner, key, holder(info, r.OwnerID()))
	}
	if !info.Held || info.OwnerID != r.OwnerID() {
		t.Fatalf("lockregtest.Lose: %s holds %q, but in Redis %s: its hold is lost already, and it has not noticed yet", s.owner, key, holder(info, r.OwnerID()))
	}
	// r hears of a forced unlock by pub/sub, once it has subscribed (in
	// the background, as it first holds a key); on the embedded server,
	// which has no CLIENT TRACKING, by nothing else until its next renewal.
	hears := s.awaitSubscription(ctx, r, info.OwnerID)
	lost := s.expectLoss(key)
	// Only while r holds it: another registry may take it meanwhile.
	forced, err := r.ForceUnlockHeldBy(ctx, key, r.OwnerID())
	switch {
	case err != nil:
		t.Fatalf("lockregtest.Lose: %v", err)
	case !forced:
		t.Fatalf("lockregtest.Lose: %q was released, or changed hands, while Lose forced it open", key)
	}
	select {
	case <-lost:
	case <-ctx.Done():
		why := ""
		if !hears {
			why = ": it has neither CLIENT TRACKING (the embedded server has none) nor a subscription yet (WithPubSub(false) makes none), and finds its key gone at its next renewal, a third of its lease"
		}
		t.Fatalf("lockregtest.Lose: %q was forced open, but %s did not signal its hold lost within %v%s", key, s.owner, loseTimeout, why)
	}
}

// holder says who holds a lock, as Inspect reported it, to a registry of
// client id self that has no live hold of it.
func holder(info lockreg.LockInfo, self string) string {
	switch {
	case !info.Held:
		return "nobody holds it"
	case info.OwnerID == self:
		// Close leaves its keys to their leases.
		return "its key is in Redis still, left by a hold that ended unreleased: its registry was closed, or it lost the hold"
	case info.Owner != "":
		return "it is held by " + info.Owner
	}
	return "it is held by the registry of client id " + info.OwnerID
}

// awaitSubscription waits, for subscriptionWait at most, until r, the
// registry of clientID, hears of a forced unlock at once: it has
// subscribed to its notifications (its grant channel, docs/PROTOCOL.md,
// subscribed to in one SUBSCRIBE with the channel of forced unlocks), or
// has tracking on; it reports which. A registry with pub/sub off never
// subscribes.
func (s *state) awaitSubscription(ctx context.Context, r *lockreg.Registry, clientID string) bool {
	channel := r.Key() + ":released:" + clientID
	ctx, cancel := context.WithTimeout(ctx, subscriptionWait)
	defer cancel()
	for !r.Stats().Tracking {
		n, err := s.client.PubSubNumSub(ctx, channel).Result()
		if err == nil && n[channel] > 0 {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(2 * time.Millisecond):
		}
	}
	return true
}
