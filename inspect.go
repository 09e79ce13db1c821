package lockreg

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// LockInfo is what Redis says of one lock, for operators: Inspect and
// Locks return it, and lockctl shows it.
type LockInfo struct {
	Key   string        // the lock's key, as passed to Obtain (unescaped)
	Held  bool          // some registry holds the key
	Owner string        // the holding registry's owner name (WithOwner); "" if unknown: it died, or predates owner names
	TTL   time.Duration // what is left of the lease
	// OwnerID is the holding registry's client id, the Redis key's value.
	OwnerID string
	// Token is the key's last fencing token, 0 if none is stored.
	Token int64
	// Waiting are the registries waiting for the key, first in line
	// first: those whose marks have not lapsed.
	Waiting []Waiter
}

// Waiter is a registry waiting for a lock.
type Waiter struct {
	OwnerID string // its client id
	Owner   string // its owner name, "" if unknown
}

// Inspect reports who holds key and who waits for it, in two round trips
// at most: the lock's keys, then the owners' names. It needs only to read
// the namespace (the README's inspector ACL), and works on a closed
// registry too. An empty key is an ErrInvalidKey error; Redis failures are
// ErrRedis errors.
func (r *Registry) Inspect(ctx context.Context, key string) (LockInfo, error) {
	if key == "" {
		return LockInfo{}, fmt.Errorf("%w: Inspect with an empty key", ErrInvalidKey)
	}
	infos, err := r.inspect(ctx, []lockKeys{newLockKeys(r.registryKey, key)}, []string{key})
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
		seen := map[string]bool{}
		err := r.scanLockKeys(ctx, func(batch []string) bool {
			var keys []string
			var lks []lockKeys
			for _, redisKey := range batch {
				if key, ok := keyOf(r.registryKey, redisKey); ok && !seen[key] {
					seen[key] = true
					keys = append(keys, key)
					lks = append(lks, newLockKeys(r.registryKey, key))
				}
			}
			if len(keys) == 0 {
				return true
			}
			infos, err := r.inspect(ctx, lks, keys)
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
			yield(LockInfo{}, err)
		}
	}
}

// scanBatch is how many keys a SCAN asks for at a time.
const scanBatch = 1000

// scanLockKeys scans every primary for keys that may be the namespace's
// locks, and hands them over in batches until each returns false. It
// returns the first error, or nil.
func (r *Registry) scanLockKeys(ctx context.Context, each func(batch []string) bool) error {
	match := globEscaper.Replace(r.registryKey) + ":{*}"
	scanNode := func(ctx context.Context, node redis.Cmdable) error {
		var cursor uint64
		for {
			batch, next, err := node.Scan(ctx, cursor, match, scanBatch).Result()
			if err != nil {
				return fmt.Errorf("%w: scan %q: %w", ErrRedis, match, err)
			}
			if len(batch) > 0 && !each(batch) {
				return errStopScan
			}
			if cursor = next; cursor == 0 {
				return nil
			}
		}
	}
	var err error
	if cluster, ok := r.client.(*redis.ClusterClient); ok {
		// One primary after the other, while the caller iterates; but
		// ForEachMaster calls its function on all at once.
		var mu sync.Mutex
		var primaries []*redis.Client
		if err = cluster.ForEachMaster(ctx, func(_ context.Context, primary *redis.Client) error {
			mu.Lock()
			defer mu.Unlock()
			primaries = append(primaries, primary)
			return nil
		}); err != nil {
			return fmt.Errorf("%w: list the Cluster's primaries: %w", ErrRedis, err)
		}
		for _, primary := range primaries {
			if err = scanNode(ctx, primary); err != nil {
				break
			}
		}
	} else {
		err = scanNode(ctx, r.client)
	}
	if errors.Is(err, errStopScan) {
		return nil
	}
	return err
}

// errStopScan ends a scan whose caller stopped iterating.
var errStopScan = errors.New("lockreg: scan stopped")

// globEscaper escapes a registryKey for SCAN's MATCH, which treats these
// characters as patterns.
var globEscaper = strings.NewReplacer(`\`, `\\`, "*", `\*`, "?", `\?`, "[", `\[`, "]", `\]`)

// keyOf is the key of the namespace's lock whose Redis key is redisKey, if
// it is one: <registryKey>:{<escaped key>}, whose braces the key's escaping
// leaves alone (a fence, a mark or another namespace's lock has more after
// the brace, or braces inside it).
func keyOf(registryKey, redisKey string) (string, bool) {
	escaped, ok := strings.CutPrefix(redisKey, registryKey+":{")
	if !ok || !strings.HasSuffix(escaped, "}") {
		return "", false
	}
	escaped = escaped[:len(escaped)-1]
	if escaped == "" || strings.ContainsAny(escaped, "{}") {
		return "", false
	}
	return keyUnescaper.Replace(escaped), true
}

var keyUnescaper = strings.NewReplacer("%25", "%", "%7B", "{", "%7D", "}")

// inspect reads the locks of keys (whose Redis keys are lks) in one
// pipeline, then their owners' names in another.
func (r *Registry) inspect(ctx context.Context, lks []lockKeys, keys []string) ([]LockInfo, error) {
	type reads struct {
		owner  *redis.StringCmd
		ttl    *redis.DurationCmd
		fence  *redis.StringCmd
		queue  *redis.StringSliceCmd
		marker *redis.ZSliceCmd
	}
	all := make([]reads, len(lks))
	var now *redis.TimeCmd
	cmds, err := r.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		now = p.Time(ctx)
		for i, k := range lks {
			all[i] = reads{
				owner: p.Get(ctx, k.lock), ttl: p.PTTL(ctx, k.lock), fence: p.Get(ctx, k.fence),
				queue: p.ZRange(ctx, k.queue, 0, -1), marker: p.ZRangeWithScores(ctx, k.marker, 0, -1),
			}
		}
		return nil
	})
	if err := failed(cmds, err); err != nil {
		return nil, fmt.Errorf("%w: inspect %q: %w", ErrRedis, keys, err)
	}
	nowMs := float64(now.Val().UnixMilli())
	infos := make([]LockInfo, len(lks))
	var ids []string
	for i, rd := range all {
		info := LockInfo{Key: keys[i], OwnerID: rd.owner.Val(), TTL: max(rd.ttl.Val(), 0)}
		info.Held = info.OwnerID != ""
		info.Token, _ = strconv.ParseInt(rd.fence.Val(), 10, 64)
		lapses := map[string]float64{}
		for _, z := range rd.marker.Val() {
			lapses[z.Member.(string)] = z.Score
		}
		for _, mark := range rd.queue.Val() {
			if lapses[mark] >= nowMs {
				info.Waiting = append(info.Waiting, Waiter{OwnerID: markOwner(mark)})
			}
		}
		if info.Held {
			ids = append(ids, info.OwnerID)
		}
		for _, w := range info.Waiting {
			ids = append(ids, w.OwnerID)
		}
		infos[i] = info
	}
	names, err := r.ownerNames(ctx, ids)
	if err != nil {
		return nil, err
	}
	for i := range infos {
		infos[i].Owner = names[infos[i].OwnerID]
		for j := range infos[i].Waiting {
			infos[i].Waiting[j].Owner = names[infos[i].Waiting[j].OwnerID]
		}
	}
	return infos, nil
}

// ownerNames reads the owner names of client ids, in one pipeline; ids
// whose registries published none, or died, have none.
func (r *Registry) ownerNames(ctx context.Context, ids []string) (map[string]string, error) {
	slices.Sort(ids)
	ids = slices.Compact(ids)
	names := make(map[string]string, len(ids))
	if len(ids) == 0 {
		return names, nil
	}
	gets := make([]*redis.StringCmd, len(ids))
	cmds, err := r.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range ids {
			gets[i] = p.HGet(ctx, ownerKey(r.registryKey, id), "name")
		}
		return nil
	})
	if err := failed(cmds, err); err != nil {
		return nil, fmt.Errorf("%w: read owner names: %w", ErrRedis, err)
	}
	for i, id := range ids {
		names[id] = gets[i].Val()
	}
	return names, nil
}

// failed is the first error of a pipeline's commands that is not a missing
// key's (Pipelined's own may be one, hiding a real one behind it).
func failed(cmds []redis.Cmder, pipelined error) error {
	for _, c := range cmds {
		if err := c.Err(); err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
	}
	if errors.Is(pipelined, redis.Nil) {
		return nil
	}
	return pipelined
}
