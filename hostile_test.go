package lockreg

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg/internal/redistest"
)

// FuzzRedisKeys checks the key scheme: two different (registryKey, key)
// pairs never share a Redis key, and a lock's keys share one Cluster slot.
// Seeds are in testdata/fuzz/FuzzRedisKeys; `make fuzz` runs it longer.
func FuzzRedisKeys(f *testing.F) {
	for _, seed := range [][4]string{
		{"r", "x}:{y", "r:{x}", "y"},
		{"r", "a", "r", "a}"},
		{"r{", "k", "r{:{k}", "fence"},
		{"{}", "0", "r", "0"},
		{"reg", "}{", "reg", "{}"},
		{"a:b", "c", "a", "b:c"},
		{"r", "%7B", "r", "{"},
		{"r", "line\nbreak", "r\n", "x"},
		{"r", "\xff\xfe", "r", "\xef\xbf\xbd"},
	} {
		f.Add(seed[0], seed[1], seed[2], seed[3])
	}
	f.Fuzz(func(t *testing.T, registry1, key1, registry2, key2 string) {
		if checkRegistryKey(registry1) != nil || checkRegistryKey(registry2) != nil || key1 == "" || key2 == "" {
			t.Skip("New refuses the registryKey, or Obtain the key")
		}
		keys1, keys2 := newLockKeys(registry1, key1).script, newLockKeys(registry2, key2).script
		for _, keys := range [][]string{keys1, keys2} {
			for _, k := range keys[1:] {
				if clusterSlot(k) != clusterSlot(keys[0]) {
					t.Fatalf("%q is not in the slot of %q", k, keys[0])
				}
			}
		}
		if !strings.HasPrefix(keys1[0], registry1+":{") {
			t.Fatalf("%q is outside registry %q's namespace", keys1[0], registry1)
		}
		if registry1 == registry2 && key1 == key2 {
			return
		}
		for _, a := range keys1 {
			for _, b := range keys2 {
				if a == b {
					t.Fatalf("(%q, %q) and (%q, %q) share the Redis key %q", registry1, key1, registry2, key2, a)
				}
			}
		}
	})
}

func TestHostileKeysWorkAgainstRedis(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	for name, key := range map[string]string{
		"1 MiB":          strings.Repeat("k", 1<<20),
		"binary":         "\x00\x01\xff\x00",
		"invalid UTF-8":  "\xc3\x28",
		"braces":         "{}",
		"reversed":       "}{",
		"tag breaker":    "x}:{y",
		"newlines":       "a\nb\r\n",
		"separator":      ":",
		"escape lookers": "%7B%",
	} {
		t.Run(name, func(t *testing.T) {
			a, b := newRegistry(t, client), newRegistry(t, client)
			lock := a.Obtain(key)
			require.NoError(t, lock.LockContext(ctx))
			require.Equal(t, key, lock.Key())
			require.False(t, b.Obtain(key).TryLock(), "excludes across registries")
			require.Equal(t, a.clientID, client.Get(ctx, lock.keys.lock).Val())
			require.NoError(t, lock.UnlockContext(ctx))
			require.True(t, b.Obtain(key).TryLock())
			b.Obtain(key).Unlock()
		})
	}
}

func TestRegistryKeyWithAnEmptyHashTagIsRefused(t *testing.T) {
	_, err := New(redistest.Shared(t).Client(t), "locks{}:orders")
	require.ErrorIs(t, err, ErrInvalidOption)
	require.ErrorContains(t, err, `"{}"`)
}

func TestRegistryKeysDoNotCollide(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	base := "lockreg-test:" + t.Name()
	outer, err := New(client, base)
	require.NoError(t, err)
	defer outer.Close()
	inner, err := New(client, base+":{x}")
	require.NoError(t, err)
	defer inner.Close()

	outer.Obtain("x}:{y").Lock()
	defer outer.Obtain("x}:{y").Unlock()
	require.True(t, inner.Obtain("y").TryLock(), "a key with braces stays inside its own registry")
	inner.Obtain("y").Unlock()
}

// silentRedis accepts connections and reads, but never answers; or, with
// garbage set, answers the first answered reads of each connection with it
// (all of them if answered is negative), then none.
func silentRedis(t *testing.T, garbage string, answered int) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				buf := make([]byte, 4096)
				for reads := 0; ; reads++ {
					if _, err := conn.Read(buf); err != nil {
						return
					}
					if garbage != "" && (answered < 0 || reads < answered) {
						if _, err := conn.Write([]byte(garbage)); err != nil {
							return
						}
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

func TestRedisThatHangsOrAnswersGarbage(t *testing.T) {
	for name, garbage := range map[string]string{"hangs": "", "garbage": "%%not resp%%\r\n"} {
		t.Run(name, func(t *testing.T) {
			client := redis.NewClient(&redis.Options{
				Addr: silentRedis(t, garbage, -1), ReadTimeout: 300 * time.Millisecond,
				MaxRetries: -1, Protocol: 2, DisableIdentity: true,
			})
			defer client.Close()
			r, err := New(client, "hostile", WithRetryInterval(20*time.Millisecond))
			require.NoError(t, err)
			defer r.Close() // waits for the attempt still in flight: goleak checks it ends

			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			start := time.Now()
			err = r.Obtain("k").LockContext(ctx)
			require.ErrorIs(t, err, ErrNotObtained)
			require.ErrorIs(t, err, context.DeadlineExceeded)
			require.Less(t, time.Since(start), time.Second, "the context rules, not the server")
			if garbage != "" {
				require.ErrorIs(t, err, ErrRedis, "the cause is reported")
			}
			require.False(t, r.Obtain("k").TryLock())
		})
	}
}

// TestASubscriptionThatRedisNeverConfirmsFailsInTime: a failed attempt
// subscribes, holding the lock Close takes, and go-redis reads the
// confirmations with no deadline unless told one, whatever the client's
// ReadTimeout; a Redis that answers the handshake and then falls silent
// (stalled, or behind a black hole) must hold neither the acquisition nor
// Close for ever.
func TestASubscriptionThatRedisNeverConfirmsFailsInTime(t *testing.T) {
	client := redis.NewClient(&redis.Options{
		// Answers HELLO with an error, which makes go-redis go on in RESP2,
		// then nothing.
		Addr:       silentRedis(t, "-ERR unknown command 'HELLO'\r\n", 1),
		MaxRetries: -1, DisableIdentity: true,
	})
	defer client.Close()
	r, err := New(client, "hostile")
	require.NoError(t, err)

	start := time.Now()
	err = r.subscribe(context.Background())
	require.ErrorIs(t, err, ErrRedis, "the subscription failed, and says so")
	require.Less(t, time.Since(start), subscribeTimeout+2*time.Second)
	require.False(t, r.notes.subscribed.Load())
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		_ = r.Close()
	}()
	select {
	case <-closed:
	case <-time.After(2 * time.Second):
		t.Fatal("Close did not return")
	}
}

func TestRegistryWorksWithAMinimalACL(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	const prefix = "orders"
	// The ACL the README documents: the registry's keys and channel, and the
	// commands its scripts, its subscription and go-redis's handshake run.
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "locker", "on", ">secret", "resetkeys", "resetchannels",
		"~"+prefix+":*", "&"+prefix+":*", "-@all",
		"+evalsha", "+eval", "+get", "+set", "+pexpire", "+del", "+exists", "+time",
		"+zadd", "+zrem", "+zscore", "+zrangebyscore", "+zpopmin", "+pttl", "+publish", "+subscribe", "+ping", "+hello", "+hset").Err())
	restricted := func() *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "locker", Password: "secret"})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	holder, err := New(restricted(), prefix)
	require.NoError(t, err)
	defer holder.Close()
	waiter, err := New(restricted(), prefix, WithRetryInterval(5*time.Second))
	require.NoError(t, err)
	defer waiter.Close()

	holder.Obtain("o-1").Lock()
	taken := lockInBackground(ctx, waiter.Obtain("o-1"))
	waitUntilWaiting(t, waiter)
	holder.Obtain("o-1").Unlock()
	select {
	case _, ok := <-taken:
		require.True(t, ok, "acquired under the ACL")
	case <-time.After(2 * time.Second):
		t.Fatal("the notification did not arrive under the ACL")
	}
	require.Equal(t, int64(1), waiter.Stats().Notifications)

	verdict, err := admin.Do(ctx, "ACL", "DRYRUN", "locker", "GET", "payments:{x}").Text()
	require.NoError(t, err)
	require.Contains(t, verdict, "no permissions", "and it can touch nothing outside its prefix")
	require.Eventually(t, func() bool { return admin.HGet(ctx, holder.owner.key, "name").Val() == holder.cfg.owner }, 5*time.Second, 10*time.Millisecond, "the owner name is published under the ACL")

	// The ACL documented before owner names, without HSET: the registry
	// works all the same, unnamed.
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "locker", "-hset").Err())
	older, err := New(restricted(), prefix)
	require.NoError(t, err)
	defer older.Close()
	require.NoError(t, older.Do(ctx, "o-2", func(context.Context) error { return nil }))
}
