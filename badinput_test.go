package lockreg

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg/internal/protocol"
	"github.com/lockreg/lockreg/internal/redistest"
)

// The rule (doc.go, Errors): bad input is an error, never a panic deep
// inside; Lock, which can return none, panics with it at the call.

func TestATypedNilClientIsRefused(t *testing.T) {
	for _, client := range []redis.UniversalClient{(*redis.Client)(nil), (*redis.ClusterClient)(nil), (*redis.Ring)(nil)} {
		r, err := New(client, "k")
		require.Nil(t, r)
		require.ErrorIs(t, err, ErrInvalidOption)
		require.ErrorContains(t, err, "client is nil")
	}
}

// An option chosen by a condition and left unset is nil.
func TestANilOptionIsRefused(t *testing.T) {
	var unset Option
	r, err := New(redistest.Shared(t).Client(t), "k", WithOwner("a"), unset)
	require.Nil(t, r)
	require.ErrorIs(t, err, ErrInvalidOption)
	require.ErrorContains(t, err, "option 2 is nil")
}

// A lease too long for the registry to count in (math.MaxInt64, meant as
// "for ever", say) is refused by New, not taken and then every hold
// reported lost at once.
func TestAnOverlongLeaseIsRefusedOrWorks(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	for _, lease := range []time.Duration{math.MaxInt64, 150 * 365 * 24 * time.Hour} {
		r, err := New(client, "lockreg-test:"+t.Name(), WithExpireAfter(lease), WithOwner("long"))
		if err != nil {
			require.ErrorIs(t, err, ErrInvalidOption, "%v", lease)
			require.ErrorContains(t, err, "WithExpireAfter")
			continue
		}
		err = r.Do(ctx, "k", func(ctx context.Context) error {
			require.NoError(t, ctx.Err(), "%v: the hold is not lost", lease)
			require.Eventually(t, func() bool {
				info, err := r.Inspect(ctx, "k")
				return err == nil && info.Owner == "long"
			}, 5*time.Second, 10*time.Millisecond, "%v: the owner is named", lease)
			return nil
		})
		require.NoError(t, r.Close())
		require.NoError(t, err, "%v", lease)
	}
}

func TestAnEmptyKeyIsAnErrorForEveryCall(t *testing.T) {
	ctx := context.Background()
	r := newRegistry(t, redistest.Shared(t).Client(t))
	lock := r.Obtain("")
	_, err := lock.Acquire(ctx)
	require.ErrorIs(t, err, ErrInvalidKey)
	require.ErrorIs(t, lock.LockContext(ctx), ErrInvalidKey)
	require.False(t, lock.TryLock())
	require.ErrorIs(t, r.Do(ctx, "", func(context.Context) error { return nil }), ErrInvalidKey)
	require.ErrorIs(t, r.DoAll(ctx, []string{"a", ""}, func(context.Context) error { return nil }), ErrInvalidKey)
	_, err = r.Inspect(ctx, "")
	require.ErrorIs(t, err, ErrInvalidKey)
	_, err = r.ForceUnlock(ctx, "")
	require.ErrorIs(t, err, ErrInvalidKey)
	// The key's error first, whatever else is wrong, as for every call.
	_, err = r.ForceUnlockHeldBy(ctx, "", "")
	require.ErrorIs(t, err, ErrInvalidKey)
	require.PanicsWithError(t, "lockreg: invalid key: empty key", lock.Lock, "Lock cannot return it: it panics at the call")
	require.Zero(t, r.locals.size(), "nothing was taken")
}

func TestANilContextOrFunctionIsAnError(t *testing.T) {
	r := newRegistry(t, redistest.Shared(t).Client(t))
	lock := r.Obtain("k")
	fn := func(context.Context) error { return nil }
	for name, err := range map[string]error{
		"Acquire":       func() error { _, err := lock.Acquire(nil); return err }(),
		"LockContext":   lock.LockContext(nil),
		"UnlockContext": lock.UnlockContext(nil),
		"Token":         func() error { _, err := lock.Token(nil); return err }(),
		"Do":            r.Do(nil, "k", fn),
		"DoAll":         r.DoAll(nil, []string{"k"}, fn),
		"Do's fn":       r.Do(context.Background(), "k", nil),
		"DoAll's fn":    r.DoAll(context.Background(), []string{"k"}, nil),
		"Inspect":       func() error { _, err := r.Inspect(nil, "k"); return err }(),
		"ForceUnlock":   func() error { _, err := r.ForceUnlock(nil, "k"); return err }(),
		"Shutdown":      r.Shutdown(nil),
	} {
		require.ErrorIs(t, err, ErrInvalidArgument, name)
	}
	_, err := r.ForceUnlockHeldBy(nil, "k", "")
	require.ErrorIs(t, err, errNilContext, "the context's error before the owner id's, as before Do's fn's")
	require.Nil(t, r.HoldFor(nil, "k"))
	require.False(t, r.closing(), "the refused Shutdown changed nothing")

	h, err := lock.Acquire(context.Background())
	require.NoError(t, err)
	_, err = h.Token(nil)
	require.ErrorIs(t, err, ErrInvalidArgument)
	require.ErrorIs(t, h.Release(nil), ErrInvalidArgument)
	require.NoError(t, h.Release(context.Background()), "the refused release changed nothing")
}

func TestALongKeyIsCutInErrorsAndLogs(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client)
	key := strings.Repeat("k", 1<<20)
	lock := r.Obtain(key)
	h, err := lock.Acquire(ctx)
	require.NoError(t, err)
	require.NoError(t, h.Release(ctx))
	err = h.Release(ctx)
	require.ErrorIs(t, err, ErrNotHeld)
	require.Less(t, len(err.Error()), 400, "the error names the key's first bytes and its length")
	require.Contains(t, err.Error(), "(1048576 bytes)")
	require.Less(t, len(printedKey(key).LogValue().String()), 300, "and so do the logs")
	waitCtx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	other := newRegistry(t, client)
	held, err := other.Obtain(key).Acquire(ctx)
	require.NoError(t, err)
	defer func() { require.NoError(t, held.Release(ctx)) }()
	_, err = lock.Acquire(waitCtx)
	require.ErrorIs(t, err, ErrNotObtained)
	require.Less(t, len(err.Error()), 400)

	// With a Redis error joined, the key is named once all the same.
	listed := r.Obtain(strings.Repeat("l", 1<<20))
	require.NoError(t, client.LPush(ctx, listed.keys().Lock(), "x").Err())
	_, err = listed.Acquire(ctx)
	require.ErrorIs(t, err, ErrRedis)
	require.Contains(t, err.Error(), "WRONGTYPE")
	require.Equal(t, 1, strings.Count(err.Error(), "(1048576 bytes)"), "the key is named once")
	require.Less(t, len(err.Error()), 500, "the key's first bytes, its length and Redis's message")
}

// HoldFor outside a Do of its key returns nil, and the README's idiom
// HoldFor(ctx, key).Token(ctx) then is an error, not a panic.
func TestANilHoldHoldsNothing(t *testing.T) {
	ctx := context.Background()
	r := newRegistry(t, redistest.Shared(t).Client(t))
	h := r.HoldFor(ctx, "k")
	require.Nil(t, h)
	_, err := h.Token(ctx)
	require.ErrorIs(t, err, ErrNotHeld)
	require.ErrorIs(t, h.Release(ctx), ErrNotHeld)
	require.ErrorIs(t, h.Err(), ErrNotHeld)
	requireFires(t, h.Done(), time.Second, "Done")
	requireFires(t, h.Lost(), time.Second, "Lost")
	require.Empty(t, h.Key())
}

// New's errors say what is wrong, in a few words; what to do about it is
// in ErrInvalidOption's doc comment (see errors_test.go).
func TestNewsErrorsGiveNoAdvice(t *testing.T) {
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": redistest.SharedAddr(), "b": redistest.SharedAddr()}})
	t.Cleanup(func() { _ = ring.Close() })
	_, err := New(ring, "k")
	require.ErrorIs(t, err, ErrInvalidOption)
	require.ErrorContains(t, err, "redis.Ring with 2 shards")
	require.NotContains(t, err.Error(), ";", "no advice after the fact")
}

// TestALongKeyIsCutInTheRedisKeysErrorsName: the scripts name the lock's
// keys in Redis (<namespace>:{<key>}:queue and so on) when a call on one
// fails: a queue, marker or fence of another type, or an ACL that forbids
// a command on it. Those names hold the key whole: an error must cut it
// there too, not carry a megabyte.
func TestALongKeyIsCutInTheRedisKeysErrorsName(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	key := strings.Repeat("k", 1<<20)
	keys := protocol.LockKeys("lockreg-test:"+t.Name(), key)
	// After the registries closed: the release that failed left the key.
	t.Cleanup(func() { client.Del(ctx, keys.Lock(), keys.Queue(), keys.Marker(), keys.Fence()) })
	r := newRegistry(t, client)
	other := newRegistry(t, client)
	requireShort := func(err error, what string) {
		t.Helper()
		require.ErrorIs(t, err, ErrRedis, what)
		require.Contains(t, err.Error(), "WRONGTYPE", what)
		require.Less(t, len(err.Error()), 1000, "%s: the key cut where it is quoted and in the Redis key named, and Redis's message", what)
	}

	// An attempt that marks its registry as waiting, on a queue that is a
	// string.
	held, err := other.Obtain(key).Acquire(ctx)
	require.NoError(t, err)
	require.NoError(t, client.Set(ctx, keys.Queue(), "x", 0).Err())
	_, err = r.Obtain(key).Acquire(ctx)
	requireShort(err, "the attempt")
	require.NoError(t, client.Del(ctx, keys.Queue()).Err())
	require.NoError(t, held.Release(ctx))

	// A draw of the token, on a fence that is a hash.
	h, err := r.Obtain(key).Acquire(ctx)
	require.NoError(t, err)
	require.NoError(t, client.HSet(ctx, keys.Fence(), "f", "v").Err())
	_, err = h.Token(ctx)
	requireShort(err, "the token")
	require.NoError(t, client.Del(ctx, keys.Fence()).Err())

	// A release, on a marker that is a hash.
	require.NoError(t, client.HSet(ctx, keys.Marker(), "f", "v").Err())
	requireShort(h.Release(ctx), "the release")
}

// New names a namespace it refuses cut as errors cut keys: a namespace
// built from input could be huge.
func TestALongNamespaceIsCutInNewsError(t *testing.T) {
	namespace := strings.Repeat("n", 1<<20) + "{}"
	_, err := New(redistest.Shared(t).Client(t), namespace)
	require.ErrorIs(t, err, ErrInvalidOption)
	require.ErrorContains(t, err, `starts a Cluster hash tag with "{}"`)
	require.Less(t, len(err.Error()), 400, "the namespace's first bytes and its length")
}
