package lockreg

import (
	"context"
	"errors"
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

// aclPassword is the password of the users TestEveryForbiddenCommand
// makes: no error may carry it.
const aclPassword = "pw-9Zq-never-printed"

// TestEveryForbiddenCommandEndsInAnErrorOrAWarningAndLosesNothing: for
// each command the registry runs (its scripts' inner ones too), a user
// whose ACL forbids only that one. Whatever the calls return must be nil
// or a short error that matches a sentinel and carries no password; an
// acquisition refused for good ends at once, not at its deadline; a hold
// whose renewal is refused is told lost, never lost unsaid; a key the
// registry held or was refused to release is free again within its lease;
// a ForceUnlock that says it forced nothing forced nothing; Close returns.
func TestEveryForbiddenCommandEndsInAnErrorOrAWarningAndLosesNothing(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	for _, command := range []string{
		"evalsha", "eval", "get", "mget", "set", "pexpire", "del", "exists", "time", "pttl",
		"zadd", "zrem", "zscore", "zrangebyscore", "zpopmin", "zrange", "hset", "hget", "scan",
		"publish", "subscribe", "client|id", "client|tracking", "info", "ping", "hello", "wait",
	} {
		t.Run(command, func(t *testing.T) {
			t.Parallel()
			user := "no-" + strings.ReplaceAll(command, "|", "-")
			require.NoError(t, admin.Do(context.Background(), "ACL", "SETUSER", user, "on", ">"+aclPassword, "~*", "&*", "+@all", "-"+command).Err())
			client := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: user, Password: aclPassword})
			t.Cleanup(func() { _ = client.Close() })
			forbiddenCommandLosesNothing(t, admin, client, command == "wait")
		})
	}
}

func forbiddenCommandLosesNothing(t *testing.T, admin, client *redis.Client, replicated bool) {
	ctx := context.Background()
	const lease = 600 * time.Millisecond
	opts := []Option{WithExpireAfter(lease), WithRetryInterval(50 * time.Millisecond)}
	if replicated {
		opts = append(opts, WithWaitReplicas(1, 100*time.Millisecond))
	}
	r := newRegistry(t, client, opts...)
	other := newRegistry(t, admin, WithRetryInterval(50*time.Millisecond))
	var said []error
	check := func(err error, what string) error {
		t.Helper()
		if err != nil {
			require.True(t, matchesASentinel(err), "%s: %v matches no sentinel", what, err)
			require.NotContains(t, err.Error(), aclPassword, what)
			require.Less(t, len(err.Error()), 500, what)
			said = append(said, err)
		}
		return err
	}
	refusedAtOnce := func(err error, what string) {
		t.Helper()
		require.ErrorIs(t, err, ErrNotObtained, what)
		require.ErrorIs(t, err, ErrRedis, what)
		require.NotErrorIs(t, err, context.DeadlineExceeded, "%s: refused for good, it ends at once", what)
	}
	ownedBy := func(key string) string { return admin.Get(ctx, r.Obtain(key).keys().Lock()).Val() }
	freeWithinLease := func(key, what string) {
		t.Helper()
		require.Eventually(t, func() bool { return ownedBy(key) != r.clientID }, 3*lease, 10*time.Millisecond, "%s: the key is ours no more", what)
	}
	bounded, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()

	// It holds "held" past several leases while another registry waits,
	// inspects it, and releases it to the waiter.
	h, err := r.Obtain("held").Acquire(bounded)
	if check(err, "Acquire") != nil {
		refusedAtOnce(err, "Acquire")
		freeWithinLease("held", "a refused acquisition")
	} else {
		waited := make(chan error, 1)
		go func() {
			wh, err := other.Obtain("held").Acquire(bounded)
			if err == nil {
				err = wh.Release(ctx)
			}
			waited <- err
		}()
		time.Sleep(3 * lease)
		select {
		case <-h.Lost():
			require.ErrorIs(t, check(h.Err(), "Err"), ErrLockLost)
		default:
			require.Equal(t, r.clientID, ownedBy("held"), "a hold not told lost is held")
		}
		info, err := r.Inspect(bounded, "held")
		if check(err, "Inspect") == nil && !isClosed(h.Lost()) {
			require.Equal(t, r.clientID, info.OwnerID, "Inspect names the holder")
		}
		if check(h.Release(bounded), "Release") != nil {
			freeWithinLease("held", "a release that failed")
		}
		require.NoError(t, <-waited, "the waiter takes the key")
	}

	// It waits for "wanted", which another registry holds and releases.
	held, err := other.Obtain("wanted").Acquire(bounded)
	require.NoError(t, err)
	took := make(chan error, 1)
	go func() {
		wh, err := r.Obtain("wanted").Acquire(bounded)
		if check(err, "Acquire after waiting") != nil {
			refusedAtOnce(err, "Acquire after waiting")
		} else {
			err = check(wh.Release(bounded), "Release after waiting")
		}
		took <- err
	}()
	time.Sleep(100 * time.Millisecond)
	require.NoError(t, held.Release(ctx))
	<-took
	freeWithinLease("wanted", "a key waited for")

	// It forces open a key another registry holds.
	held, err = other.Obtain("forced").Acquire(bounded)
	require.NoError(t, err)
	forced, err := r.ForceUnlock(bounded, "forced")
	if check(err, "ForceUnlock") != nil || !forced {
		require.Equal(t, other.clientID, admin.Get(ctx, other.Obtain("forced").keys().Lock()).Val(), "nothing was forced")
		require.NoError(t, held.Release(ctx))
	} else {
		requireFires(t, held.Lost(), 3*lease, "the hold forced open is told")
	}
	require.NoError(t, r.Close())
	t.Logf("errors: %v", said)
}

// matchesASentinel says whether err is, or wraps, one of the package's
// sentinel errors.
func matchesASentinel(err error) bool {
	for _, sentinel := range []error{ErrNotObtained, ErrNotHeld, ErrLockLost, ErrClosed, ErrInvalidOption,
		ErrInvalidKey, ErrInvalidArgument, ErrRedis, ErrNotReplicated, ErrServerEvicts} {
		if errors.Is(err, sentinel) {
			return true
		}
	}
	return false
}
