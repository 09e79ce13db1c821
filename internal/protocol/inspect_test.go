package protocol

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// What operators read: owner hashes, lock states and scans.

func TestRefreshOwnerWritesTheOwnerHashWithTheOwnerTTL(t *testing.T) {
	e := newEnv(t)
	since := time.UnixMilli(time.Now().UnixMilli())
	p := e.peer(func(cfg *Config) { cfg.Owner, cfg.Since = "billing-7", since })
	e.runAll(p.RefreshOwner())
	ownerKey := OwnerKey(e.namespace, p.ClientID())
	fields, err := e.client.HGetAll(e.ctx, ownerKey).Result()
	require.NoError(t, err)
	require.Equal(t, map[string]string{"name": "billing-7", "since": fmt.Sprint(since.UnixMilli())}, fields)
	require.Positive(t, e.pttl(ownerKey))
	require.LessOrEqual(t, e.pttl(ownerKey), testOwnerTTL)
}

// An id without a hash (a registry that could not write one, or died
// long ago) is left out, not an error.
func TestReadOwnersReadsTheOwnerHashesBackAndLeavesOutAnIDWithoutOne(t *testing.T) {
	e := newEnv(t)
	p := e.peer(func(cfg *Config) { cfg.Owner = "billing-7" })
	e.runAll(p.RefreshOwner())
	owners, err := ReadOwners(e.ctx, e.client, e.namespace, []string{p.ClientID(), "no-hash", p.ClientID()})
	require.NoError(t, err)
	require.Len(t, owners, 1)
	require.Equal(t, "billing-7", owners[p.ClientID()].Name)
}

func TestReadLocksReportsTheOwnerTTLTokenAndLiveWaitersInQueueOrder(t *testing.T) {
	e := newEnv(t)
	holder, k := e.holder()
	lapsed, first, second := e.peer(lapsing), e.peer(), e.peer(noGrants)
	free := holder.Keys("free")
	token := e.drawToken(holder, k)
	e.markInTurn(k, lapsed)
	time.Sleep(2*shortRetry + 5*time.Millisecond)
	e.markInTurn(k, first, second)
	states, err := ReadLocks(e.ctx, e.client, []Keys{k, free})
	require.NoError(t, err)
	require.Len(t, states, 2)
	s := states[0]
	require.Positive(t, s.TTL)
	require.LessOrEqual(t, s.TTL, testLease)
	s.TTL = 0
	require.Equal(t, LockState{Held: true, OwnerID: holder.ClientID(), Token: token, Waiting: []string{first.ClientID(), second.ClientID()}}, s)
	require.Equal(t, LockState{}, states[1], "a free key")
}

// Registries always set a lease: a key without one was set by hand, with
// any value, an empty one too, which blocks the key as well.
func TestReadLocksReportsAValueWithoutTTLAsNoExpiry(t *testing.T) {
	e := newEnv(t)
	k := LockKeys(e.namespace, "k")
	t.Cleanup(func() { e.client.Del(e.ctx, k.Lock()) })
	for _, value := range []string{"by hand", ""} {
		require.NoError(t, e.client.Set(e.ctx, k.Lock(), value, 0).Err())
		states, err := ReadLocks(e.ctx, e.client, []Keys{k})
		require.NoError(t, err)
		require.Equal(t, []LockState{{Held: true, OwnerID: value, NoExpiry: true}}, states)
	}
}

// A lock's keys of another type than the protocol's, made by hand, do not
// fail the read of every lock: a lock key of another type blocks the lock
// as a foreign value does; the others read as missing.
func TestReadLocksReportsKeysOfAnotherTypeAsForeign(t *testing.T) {
	e := newEnv(t)
	k, free := LockKeys(e.namespace, "k"), LockKeys(e.namespace, "free")
	t.Cleanup(func() { e.client.Del(e.ctx, k.Lock(), free.Fence(), free.Queue(), free.Marker()) })
	require.NoError(t, e.client.HSet(e.ctx, k.Lock(), "field", "value").Err())
	for _, key := range []string{free.Fence(), free.Queue(), free.Marker()} {
		require.NoError(t, e.client.RPush(e.ctx, key, "by hand").Err())
	}
	states, err := ReadLocks(e.ctx, e.client, []Keys{k, free})
	require.NoError(t, err)
	require.Equal(t, []LockState{{Held: true, NoExpiry: true}, {}}, states)
}

func TestScanFindsTheNamespacesLockKeys(t *testing.T) {
	e := newEnv(t)
	holder, waiter := e.peer(), e.peer()
	keys := []string{"a", "b:c", "{d}"}
	for _, key := range keys {
		e.hold(holder, holder.Keys(key))
	}
	e.wait(waiter, holder.Keys("a")) // a fence, a marker and a queue
	e.drawToken(holder, holder.Keys("b:c"))
	e.hold(holder, LockKeys(e.namespace+"x", "e")) // another namespace's lock
	var found []string
	require.NoError(t, Scan(e.ctx, e.client, LockPattern(e.namespace), func(batch []string) bool {
		for _, redisKey := range batch {
			if key, ok := KeyOf(e.namespace, redisKey); ok {
				found = append(found, key)
			}
		}
		return true
	}))
	require.ElementsMatch(t, keys, found)
}

func TestScanStopsWhenTold(t *testing.T) {
	e := newEnv(t)
	// Enough keys for several batches.
	const n = 3 * ScanBatch
	_, err := e.client.Pipelined(e.ctx, func(pipe redis.Pipeliner) error {
		for i := range n {
			pipe.Set(e.ctx, LockKeys(e.namespace, fmt.Sprint(i)).Lock(), "x", time.Minute)
		}
		return nil
	})
	require.NoError(t, err)
	// SCAN may return a key twice: count distinct ones.
	scan := func(stop bool) (batches int, seen map[string]bool) {
		seen = map[string]bool{}
		require.NoError(t, Scan(e.ctx, e.client, LockPattern(e.namespace), func(batch []string) bool {
			batches++
			for _, key := range batch {
				seen[key] = true
			}
			return !stop
		}))
		return batches, seen
	}
	batches, seen := scan(false)
	require.Greater(t, batches, 1)
	require.Len(t, seen, n)
	batches, seen = scan(true)
	require.Equal(t, 1, batches)
	require.Less(t, len(seen), n)
}
