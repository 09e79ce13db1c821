package lockreg

import (
	"context"
	"strings"
	"testing"

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

func TestClusterSlot(t *testing.T) {
	// Reference values from the Redis Cluster specification.
	require.Equal(t, 12739, clusterSlot("123456789"))
	require.Equal(t, clusterSlot("user1000"), clusterSlot("{user1000}.following"))
	require.Equal(t, clusterSlot("user1000"), clusterSlot("{user1000}.followers"))
	require.Equal(t, clusterSlot("bar"), clusterSlot("foo{bar}{zap}"))
	require.Equal(t, clusterSlot("{bar"), clusterSlot("foo{{bar}}zap"))
	require.NotEqual(t, clusterSlot("bar"), clusterSlot("foo{}{bar}"), "an empty tag hashes the whole key")
	require.Equal(t, clusterSlot("k"), clusterSlot("reg:{k}:fence"), "a lock's keys share a slot")
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
