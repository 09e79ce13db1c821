package lockreg

import (
	"context"
	"fmt"
	"iter"
	"time"

	"github.com/lockreg/lockreg/internal/protocol"
)

// LockInfo is what Redis says of one lock, for operators: Inspect and
// Locks return it, and lockctl shows it.
type LockInfo struct {
	Key string // the lock's key, as passed to Obtain (unescaped)
	// Held says that the lock's Redis key exists: some registry holds it,
	// or a value no registry set blocks it.
	Held  bool
	Owner string // the holding registry's owner name (WithOwner); "" if unknown: it died, or predates owner names
	// TTL is what is left of the lease, or NoExpiry for a key without
	// one: a value that no registry set, which nothing will free.
	TTL time.Duration
	// OwnerID is the Redis key's value: the holding registry's client id,
	// or a foreign value (which may be "").
	OwnerID string
	// Token is the key's last fencing token, 0 if none is stored.
	Token int64
	// Waiting are the registries waiting for the key, first in line
	// first: those whose marks have not lapsed.
	Waiting []Waiter
}

// NoExpiry is the TTL of a lock key that never expires.
const NoExpiry time.Duration = -1

// Waiter is a registry waiting for a lock.
type Waiter struct {
	OwnerID string // its client id
	Owner   string // its owner name, "" if unknown
}

// Inspect reports who holds key and who waits for it, in two round trips
// at most: the lock's keys, then the owners' names. It needs only to read
// the namespace (the README's inspector ACL), and works on a closed
// registry too. An empty key is an ErrInvalidKey error; Redis failures are
// ErrRedis errors. ctx bounds the calls as far as the client honours it:
// go-redis applies its deadline with ContextTimeoutEnabled set, and
// otherwise its own timeouts and retries, so that an operator's look at a
// paused server may outlast ctx (as Locks and ForceUnlock may).
func (r *Registry) Inspect(ctx context.Context, key string) (LockInfo, error) {
	if key == "" {
		return LockInfo{}, fmt.Errorf("%w: Inspect with an empty key", ErrInvalidKey)
	}
	if ctx == nil {
		return LockInfo{}, errNilContext
	}
	infos, err := r.inspect(ctx, []string{key})
	if err != nil {
		return LockInfo{}, err
	}
	return infos[0], nil
}

// Locks lists the locks held in the registry's namespace, each once, in
// no particular order: it scans every primary (SCAN), and inspects what it
// finds in batches, two round trips per batch. Keys of other namespaces,
// fences, waiting marks and queues are skipped; a lock released between
// the scan and the look is too. It stops at the first error, which it
// yields with a zero LockInfo.
func (r *Registry) Locks(ctx context.Context) iter.Seq2[LockInfo, error] {
	return func(yield func(LockInfo, error) bool) {
		if ctx == nil {
			yield(LockInfo{}, errNilContext)
			return
		}
		seen := map[string]bool{}
		err := protocol.Scan(ctx, r.client, protocol.LockPattern(r.namespace), func(batch []string) bool {
			var keys []string
			for _, redisKey := range batch {
				if key, ok := protocol.KeyOf(r.namespace, redisKey); ok && !seen[key] {
					seen[key] = true
					keys = append(keys, key)
				}
			}
			if len(keys) == 0 {
				return true
			}
			infos, err := r.inspect(ctx, keys)
			if err != nil {
				yield(LockInfo{}, err)
				return false
			}
			for _, info := range infos {
				if info.Held && !yield(info, nil) {
					return false
				}
			}
			return true
		})
		if err != nil {
			yield(LockInfo{}, fmt.Errorf("%w: %w", ErrRedis, err))
		}
	}
}

// inspect reads the locks of keys in one pipeline, then their owners'
// names in another.
func (r *Registry) inspect(ctx context.Context, keys []string) ([]LockInfo, error) {
	lockKeys := make([]protocol.Keys, len(keys))
	for i, key := range keys {
		lockKeys[i] = r.peer.Keys(key)
	}
	states, err := protocol.ReadLocks(ctx, r.client, lockKeys)
	if err != nil {
		return nil, fmt.Errorf("%w: inspect %d locks: %w", ErrRedis, len(keys), err)
	}
	var ids []string
	for _, s := range states {
		if s.Held {
			ids = append(ids, s.OwnerID)
		}
		ids = append(ids, s.Waiting...)
	}
	owners, err := protocol.ReadOwners(ctx, r.client, r.namespace, ids)
	if err != nil {
		return nil, fmt.Errorf("%w: read owner names: %w", ErrRedis, err)
	}
	infos := make([]LockInfo, len(keys))
	for i, s := range states {
		info := LockInfo{Key: keys[i], Held: s.Held, OwnerID: s.OwnerID, Owner: owners[s.OwnerID].Name, TTL: s.TTL, Token: s.Token}
		if s.NoExpiry {
			info.TTL = NoExpiry
		}
		for _, id := range s.Waiting {
			info.Waiting = append(info.Waiting, Waiter{OwnerID: id, Owner: owners[id].Name})
		}
		infos[i] = info
	}
	return infos, nil
}
