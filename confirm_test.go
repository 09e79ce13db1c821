package lockreg

import (
	"context"
	"testing"
	"time"

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
	first, err := r.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	next := make(chan *Hold, 1)
	go func() {
		h, _ := r.Obtain("k").Acquire(ctx)
		next <- h
	}()
	require.Eventually(t, func() bool { return waitersOf(r, "k") == 1 }, 5*time.Second, time.Millisecond)

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
