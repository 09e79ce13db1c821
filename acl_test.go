package lockreg

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg/internal/protocol"
	"github.com/lockreg/lockreg/internal/redistest"
)

// TestAReleaseWhosePublishIsRefusedReleases: an ACL that refuses PUBLISH
// (or the namespace's channels) lets release.lua free or grant the key,
// and then refuses its note to the waiters; a script is not rolled back.
// The key was released: the release must say so, not fail as if it might
// have been left held, and the waiter, told nothing, takes it when it
// polls. The refusal is the operator's to fix, and is warned of once.
func TestAReleaseWhosePublishIsRefusedReleases(t *testing.T) {
	t.Parallel()
	for name, waiterOpts := range map[string][]Option{
		"a grant":   nil,                 // the waiter takes grants
		"a wake-up": {WithPubSub(false)}, // it marks without grants: the release wakes all
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			srv := redistest.Start(t)
			admin := srv.Client(t)
			logs := &syncBuffer{}
			holder := newRegistry(t, aclClient(t, srv, "+@all", "-publish"),
				WithLogger(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))))
			waiter := newRegistry(t, admin, append([]Option{WithRetryInterval(100 * time.Millisecond)}, waiterOpts...)...)
			for i := range 2 {
				h, err := holder.Obtain("k").Acquire(ctx)
				require.NoError(t, err)
				taken := lockInBackground(ctx, waiter.Obtain("k"))
				waitUntilWaitingSeenBy(t, waiter, admin)
				require.NoError(t, h.Release(ctx), "round %d: the key was released", i)
				requireOpen(t, h.Lost(), "a released hold is not lost")
				require.ErrorIs(t, h.Release(ctx), ErrNotHeld)
				select {
				case _, ok := <-taken:
					require.True(t, ok, "the waiter took the key")
				case <-time.After(5 * time.Second):
					t.Fatal("the waiter never took the released key")
				}
			}
			require.NoError(t, holder.Do(ctx, "k", func(context.Context) error { return nil }), "the holder locks again")
			require.Equal(t, 1, strings.Count(logs.String(), "PUBLISH refused"), logs.String())
		})
	}
}

// grantMarking has a registry under an ACL of acl release its held key
// "k" with MarkNext, while the registry "first" waits: the key is granted
// to first. It returns the release's reply, an admin client and the lock.
func grantMarking(t *testing.T, acl ...string) (protocol.ReleaseReply, *redis.Client, *Lock) {
	t.Helper()
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	lock := newRegistry(t, aclClient(t, srv, acl...)).Obtain("k")
	putMarks(t, admin, lock, waitingMark{"first:1000", time.Now().Add(-time.Second), time.Now().Add(time.Minute)})
	require.NoError(t, admin.Set(ctx, lock.keys().Lock(), lock.r.clientID, time.Minute).Err())
	found, err := lock.releaseRedis(ctx, protocol.Release{MarkNext: true})
	require.NoError(t, err, "the key was granted")
	require.Equal(t, protocol.Granted, found.Outcome)
	require.Equal(t, "first", admin.Get(ctx, lock.keys().Lock()).Val())
	return found, admin, lock
}

// A release that grants the key and marks its own registry as waiting
// (for a goroutine behind it) answers the token of its mark, refused note
// or not: the mark was set.
func TestAGrantThatMarksWhosePublishIsRefusedAnswersItsMark(t *testing.T) {
	found, admin, lock := grantMarking(t, "+@all", "-publish")
	require.Positive(t, found.MarkToken, "the registry marked")
	require.NotEmpty(t, found.NoteRefused, "but the grantee was not told")
	require.NoError(t, admin.ZScore(context.Background(), lock.keys().Marker(), markOf(lock.r)).Err(), "the registry's mark is set")
}

// A grant that is to mark its own registry as waiting, under an ACL
// without ZADD, grants the key but cannot mark: its reply must not say
// that it did, or the goroutine behind the release would wait for a
// grant that no release will make, as if its registry were queued.
func TestAGrantThatCannotMarkSaysSo(t *testing.T) {
	found, admin, lock := grantMarking(t, "+@all", "-zadd")
	require.ErrorIs(t, admin.ZScore(context.Background(), lock.keys().Marker(), markOf(lock.r)).Err(), redis.Nil, "no mark was set")
	require.Zero(t, found.MarkToken, "and the reply says none was")
}

// TestARenewalRefusedForGoodIsWarnedOfOnce: an ACL that refuses renewal's
// PEXPIRE refuses every tick's renewal alike until the lease runs out.
// The operator needs to hear it once, not once a tick and batch; the hold
// still ends as expired, on time.
func TestARenewalRefusedForGoodIsWarnedOfOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := redistest.Start(t)
	logs := &syncBuffer{}
	r := newRegistry(t, aclClient(t, srv, "+@all", "-pexpire"), WithExpireAfter(900*time.Millisecond),
		WithLogger(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	h, err := r.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	select {
	case <-h.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("a hold that no renewal carried on was not lost")
	}
	require.ErrorIs(t, h.Err(), ErrLockLost)
	require.Equal(t, 1, strings.Count(logs.String(), "renewal"), logs.String())
}
