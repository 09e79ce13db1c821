package lockreg

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg/internal/redistest"
)

// FuzzRedisKeys checks the key scheme: two different (namespace, key)
// pairs never share a Redis key, and a lock's keys share one Cluster slot.
// Seeds are in testdata/fuzz/FuzzRedisKeys; `make fuzz` runs it longer.
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
			require.Equal(t, a.clientID, client.Get(ctx, lock.keys().Lock()).Val())
			require.NoError(t, lock.UnlockContext(ctx))
			require.True(t, b.Obtain(key).TryLock())
			b.Obtain(key).Unlock()
		})
	}
}

func TestANamespaceWithAnEmptyHashTagIsRefused(t *testing.T) {
	_, err := New(redistest.Shared(t).Client(t), "locks{}:orders")
	require.ErrorIs(t, err, ErrInvalidOption)
	require.ErrorContains(t, err, `"{}"`)
}

func TestNamespacesDoNotCollide(t *testing.T) {
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
