package lockregtest

import (
	"context"
	"testing"
	"time"

	"github.com/lockreg/lockreg"
)

// loseTimeout bounds how long Lose waits for the holder to signal its
// loss: milliseconds, since its own registry forces the key open and so
// tells it at once, unless the machine is loaded.
const loseTimeout = 5 * time.Second

// Lose makes r lose the hold it has on key, as an operator's
// lockreg.Registry.ForceUnlock does: the key is deleted, the fencing
// token raised past the holder's, another registry's waiters woken, and r
// told (a goroutine of r that waits for the key takes it once the lost
// hold is released, as the local mutex passes then). Lose returns once r signalled the hold
// lost, for lockreg.LossForced: its Lost channel is closed, the context
// of the Do that holds it has ended with a cause matching
// lockreg.ErrLockLost, and its Release returns ErrLockLost. That takes
// milliseconds, whatever r's options and server: r itself forces the key
// open, and so needs no news from Redis.
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
		t.Fatalf("lockregtest.Lose: %q was forced open, but %s did not signal its hold lost within %v", key, s.owner, loseTimeout)
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
