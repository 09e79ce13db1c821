package contenders

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// LockFloorName names the floor of a correct lock in S1.
const LockFloorName = "lock floor"

// LockFloor is the least a correct lock can send for an uncontended
// cycle: `SET <key> <owner> NX PX <lease>`, then a one-line owner-checked
// DEL by EVALSHA, on one go-redis client, with nothing else: no renewal,
// no notification, no local state, no token per hold. S1 times it in
// turn with the contenders, cycle by cycle in the same sessions, so that
// a contender's cycle can be given as a multiple of it: a figure that
// travels between machines, where "two PINGs" does not (a script's own
// cost in Redis weighs more against a round trip on a faster machine).
//
// Its owner is drawn once per instance, as lockreg's client id is: it is
// correct for one goroutine per instance (S1's), which is all it is for.
var LockFloor = Factory{Name: LockFloorName, New: func(addr string) (Contender, error) {
	return NewLockFloor(addr)
}}

// lockFloorRelease is the floor's release: the owner check and the DEL in
// one script, so that no other owner's key is deleted.
const lockFloorRelease = `if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0`

// lockFloorRetry is how often the floor's Acquire tries again while
// another owner holds the key (never, in S1).
const lockFloorRetry = 10 * time.Millisecond

type lockFloor struct {
	client *redis.Client
	// owner, the lease in ms and the script's SHA1, boxed once, as
	// lockreg boxes its own arguments.
	owner, lease, sha any
}

// NewLockFloor makes the floor of a correct lock with its own client, its
// release script loaded.
func NewLockFloor(addr string) (Contender, error) {
	client := redis.NewClient(&redis.Options{Addr: addr})
	sha, err := client.ScriptLoad(context.Background(), lockFloorRelease).Result()
	if err != nil {
		return nil, errors.Join(err, client.Close())
	}
	var id [16]byte
	_, _ = rand.Read(id[:])
	return &lockFloor{client: client, owner: base64.RawURLEncoding.EncodeToString(id[:]), lease: peerTTL.Milliseconds(), sha: sha}, nil
}

func (c *lockFloor) Acquire(ctx context.Context, key string) (func(context.Context) error, error) {
	for {
		cmd := redis.NewStatusCmd(ctx, "set", key, c.owner, "nx", "px", c.lease)
		err := c.client.Process(ctx, cmd)
		switch {
		case err == nil:
			return func(ctx context.Context) error { return c.release(ctx, key) }, nil
		case !errors.Is(err, redis.Nil):
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("lock floor: key %q held by another owner: %w", key, ctx.Err())
		case <-time.After(lockFloorRetry):
		}
	}
}

func (c *lockFloor) release(ctx context.Context, key string) error {
	cmd := redis.NewIntCmd(ctx, "evalsha", c.sha, 1, key, c.owner)
	if err := c.client.Process(ctx, cmd); err != nil {
		return err
	}
	if cmd.Val() != 1 {
		return fmt.Errorf("lock floor: key %q was not held", key)
	}
	return nil
}

func (c *lockFloor) Reentrant() bool { return false }

func (c *lockFloor) Close() error { return c.client.Close() }
