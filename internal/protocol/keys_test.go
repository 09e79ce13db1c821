package protocol

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzRedisKeys checks the key scheme over any namespace and key: a lock's
// four keys share one Cluster slot and the namespace's prefix, no two
// (namespace, key) pairs share a Redis key, and KeyOf reads the key back
// from its lock key alone.
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
		{"r", "k", "r", "%7b"},
		{"r", "k", "r", "%"},
		{"r", "k", "r", "%2"},
		{"r", "k", "r", "%zz"},
	} {
		f.Add(seed[0], seed[1], seed[2], seed[3])
	}
	f.Fuzz(func(t *testing.T, namespace1, key1, namespace2, key2 string) {
		if CheckNamespace(namespace1) != nil || CheckNamespace(namespace2) != nil || key1 == "" || key2 == "" {
			t.Skip("New refuses the namespace, or Obtain the key")
		}
		keys1, keys2 := LockKeys(namespace1, key1).all(), LockKeys(namespace2, key2).all()
		for _, keys := range [][]string{keys1, keys2} {
			for _, k := range keys[1:] {
				if Slot(k) != Slot(keys[0]) {
					t.Fatalf("%q is not in the slot of %q", k, keys[0])
				}
			}
		}
		if !strings.HasPrefix(keys1[0], namespace1+":{") {
			t.Fatalf("%q is outside namespace %q", keys1[0], namespace1)
		}
		if got, ok := KeyOf(namespace1, keys1[0]); !ok || got != key1 {
			t.Fatalf("KeyOf(%q, %q) = %q, %v; want %q", namespace1, keys1[0], got, ok, key1)
		}
		// Any Redis key of the namespace's lock shape, key2 read as escaped
		// text: what KeyOf accepts escapes back to that Redis key, so a key
		// read back from Redis names the lock it came from, and no other.
		for _, redisKey := range []string{key2, namespace1 + ":{" + key2 + "}"} {
			if got, ok := KeyOf(namespace1, redisKey); ok && LockKeys(namespace1, got).Lock() != redisKey {
				t.Fatalf("KeyOf(%q, %q) = %q, which escapes to %q", namespace1, redisKey, got, LockKeys(namespace1, got).Lock())
			}
		}
		for _, k := range keys1[1:] {
			if _, ok := KeyOf(namespace1, k); ok {
				t.Fatalf("KeyOf takes %q, which is no lock key, for one", k)
			}
		}
		if namespace1 == namespace2 && key1 == key2 {
			return
		}
		for _, a := range keys1 {
			for _, b := range keys2 {
				if a == b {
					t.Fatalf("(%q, %q) and (%q, %q) share the Redis key %q", namespace1, key1, namespace2, key2, a)
				}
			}
		}
	})
}

func TestSlotFollowsTheClusterSpecification(t *testing.T) {
	// Reference values from the Redis Cluster specification.
	require.Equal(t, 12739, Slot("123456789"))
	require.Equal(t, Slot("user1000"), Slot("{user1000}.following"))
	require.Equal(t, Slot("user1000"), Slot("{user1000}.followers"))
	require.Equal(t, Slot("bar"), Slot("foo{bar}{zap}"))
	require.Equal(t, Slot("{bar"), Slot("foo{{bar}}zap"))
	require.NotEqual(t, Slot("bar"), Slot("foo{}{bar}"), "an empty tag hashes the whole key")
	require.Equal(t, Slot("k"), Slot("reg:{k}:fence"), "a lock's keys share a slot")
}

func TestTheKeyLayoutIsFixed(t *testing.T) {
	// The layout is the compatibility surface of every rolling deploy
	// (docs/PROTOCOL.md, Keys): these strings must never change.
	k := LockKeys("app:orders", "o-1")
	require.Equal(t, []string{"app:orders:{o-1}", "app:orders:{o-1}:fence", "app:orders:{o-1}:waiting", "app:orders:{o-1}:queue"},
		[]string{k.Lock(), k.Fence(), k.Marker(), k.Queue()})
	require.Equal(t, []string{k.Lock(), k.Fence(), k.Marker(), k.Queue()}, k.all(), "the scripts' order")
	require.Equal(t, []string{k.Lock(), k.Marker()}, k.lockAndMarker())
	require.Equal(t, []string{k.Lock(), k.Fence()}, k.lockAndFence())
	require.Equal(t, "r:{%7Bx%7D%25}", LockKeys("r", "{x}%").Lock(), "braces and %% are escaped")
	require.Equal(t, "app:orders:owner:id-1", OwnerKey("app:orders", "id-1"))
	require.Equal(t, "app:orders:released", ReleaseChannel("app:orders"))
	require.Equal(t, "app:orders:released:id-1", GrantChannel("app:orders", "id-1"))
}

func TestKeyOfPicksTheNamespacesLocksOnly(t *testing.T) {
	for redisKey, want := range map[string]string{
		"ns:{k}":          "k",
		"ns:{%7Bk%7D%25}": "{k}%",
		"ns:{k}:fence":    "",
		"ns:{k}:waiting":  "",
		"ns:{}":           "",
		"ns:{a}{b}":       "",
		"other:{k}":       "",
		"ns:x:{k}":        "",
		"ns:owner:id":     "",
		// Escapes LockKeys never writes: each would read back as a key
		// whose lock key is another ("%7b" escapes to "%257b").
		"ns:{%7b}": "",
		"ns:{%7d}": "",
		"ns:{%}":   "",
		"ns:{a%}":  "",
		"ns:{%2}":  "",
		"ns:{%zz}": "",
		"ns:{%41}": "",
	} {
		got, ok := KeyOf("ns", redisKey)
		require.Equal(t, want != "", ok, redisKey)
		require.Equal(t, want, got, redisKey)
	}
}

func TestLockPatternEscapesTheNamespacesGlobCharacters(t *testing.T) {
	require.Equal(t, `a\*b\?\[c\]\\:{*}`, LockPattern(`a*b?[c]\`))
}

func TestCheckNamespace(t *testing.T) {
	require.NoError(t, CheckNamespace("app:orders"))
	require.NoError(t, CheckNamespace("{app}:orders"), "a hash tag of its own puts all locks in one slot")
	require.ErrorContains(t, CheckNamespace(""), "is empty")
	require.ErrorContains(t, CheckNamespace("a{}b"), `"a{}b" starts a Cluster hash tag with "{}"`)
}

func TestNamespaceOfReadsAnOwnerKeyBack(t *testing.T) {
	const id = "d2d7fcac-f68e-48aa-93e8-1d7ebee5620a" // as New draws one
	ns, ok := NamespaceOf(OwnerKey("app:owner:x", id))
	require.True(t, ok)
	require.Equal(t, "app:owner:x", ns)
	for _, key := range []string{
		"app:orders:{k}",
		"app:orders:{x:owner:" + id + "}", // a lock key
		"project:owner:17",                // an application's key
		"project:owner:" + id[:35] + "g",
		"project:owner:" + id + "0",
		"project:owner:" + strings.ReplaceAll(id, "-", "_"),
		"project:owner:",
	} {
		_, ok = NamespaceOf(key)
		require.False(t, ok, key)
	}
}
