package protocol

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// LockState is what Redis keeps of one lock, read for operators.
type LockState struct {
	// Held says that the lock key exists; OwnerID is its value: the
	// holder's client id (a value no registry set may be anything, "" too).
	Held    bool
	OwnerID string
	// TTL is what is left of the lease; NoExpiry says that the lock key
	// has none (a value no registry set: registries always set a lease).
	TTL      time.Duration
	NoExpiry bool
	Token    int64    // the key's last fencing token, 0 if none is stored
	Waiting  []string // the client ids of the registries whose marks are live, first in line first
}

// ReadLocks reads the state of the locks of keys, in one pipeline.
func ReadLocks(ctx context.Context, client redis.UniversalClient, keys []Keys) ([]LockState, error) {
	type reads struct {
		owner  *redis.StringCmd
		ttl    *redis.IntCmd
		fence  *redis.StringCmd
		queue  *redis.StringSliceCmd
		marker *redis.ZSliceCmd
	}
	all := make([]reads, len(keys))
	var now *redis.TimeCmd
	cmds, err := client.Pipelined(ctx, func(p redis.Pipeliner) error {
		// TIME, which is no read, also keeps a Cluster client with ReadOnly
		// from sending the pipeline to a replica, which may lag.
		now = p.Time(ctx)
		for i, k := range keys {
			ttl := redis.NewIntCmd(ctx, "pttl", k.Lock())
			_ = p.Process(ctx, ttl)
			all[i] = reads{
				owner: p.Get(ctx, k.Lock()), ttl: ttl, fence: p.Get(ctx, k.Fence()),
				queue: p.ZRange(ctx, k.Queue(), 0, -1), marker: p.ZRangeWithScores(ctx, k.Marker(), 0, -1),
			}
		}
		return nil
	})
	if err := failed(cmds, err); err != nil {
		return nil, err
	}
	nowMs := float64(now.Val().UnixMilli())
	states := make([]LockState, len(keys))
	for i, rd := range all {
		// A key of another type than a string (WRONGTYPE) was made by hand,
		// and blocks the lock as a foreign value does.
		s := LockState{OwnerID: rd.owner.Val(), Held: rd.owner.Err() == nil || WrongType(rd.owner.Err())}
		// PTTL answers -1 for a key without expiry, -2 for none.
		switch ms := rd.ttl.Val(); {
		case ms >= 0:
			s.TTL = time.Duration(ms) * time.Millisecond
		case ms == -1 && s.Held:
			s.NoExpiry = true
		}
		s.Token, _ = strconv.ParseInt(rd.fence.Val(), 10, 64)
		lapses := map[string]float64{}
		for _, z := range rd.marker.Val() {
			if member, ok := z.Member.(string); ok {
				lapses[member] = z.Score
			}
		}
		for _, mark := range rd.queue.Val() {
			if lapses[mark] >= nowMs {
				s.Waiting = append(s.Waiting, markOwner(mark))
			}
		}
		states[i] = s
	}
	return states, nil
}

// markOwner is the client id of the registry a mark names: '<client id>'
// or '<client id>:<grant lease in ms>'.
func markOwner(mark string) string {
	id, _, _ := strings.Cut(mark, ":")
	return id
}

// failed is the first error of a pipeline's commands that is not a missing
// key's, or a key's of another type (Pipelined's own may be one, hiding a
// real one behind it): a lock's keys that someone else made read as what
// they block, not as a failure of the whole listing.
func failed(cmds []redis.Cmder, pipelined error) error {
	for _, c := range cmds {
		if err := c.Err(); err != nil && !errors.Is(err, redis.Nil) && !WrongType(err) {
			return err
		}
	}
	if errors.Is(pipelined, redis.Nil) || WrongType(pipelined) {
		return nil
	}
	return pipelined
}

// ScanBatch is how many keys a SCAN asks for at a time.
const ScanBatch = 1000

// errStopScan ends a scan whose caller stopped.
var errStopScan = errors.New("scan stopped")

// Scan scans every primary for keys matching pattern, and hands them over
// in batches until each returns false. It returns the first error, or nil.
func Scan(ctx context.Context, client redis.UniversalClient, pattern string, each func(batch []string) bool) error {
	scanNode := func(ctx context.Context, node redis.Cmdable) error {
		var cursor uint64
		for {
			batch, next, err := node.Scan(ctx, cursor, pattern, ScanBatch).Result()
			if err != nil {
				return fmt.Errorf("scan %q: %w", pattern, err)
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
	if cluster, ok := client.(*redis.ClusterClient); ok {
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
			return fmt.Errorf("list the Cluster's primaries: %w", err)
		}
		for _, primary := range primaries {
			if err = scanNode(ctx, primary); err != nil {
				break
			}
		}
	} else {
		err = scanNode(ctx, client)
	}
	if errors.Is(err, errStopScan) {
		return nil
	}
	return err
}
