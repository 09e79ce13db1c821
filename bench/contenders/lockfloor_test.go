package contenders

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/lockreg/lockreg/internal/redistest"
)

// TestLockFloorIsACorrectLock: the floor takes a free key with its owner
// and lease, another instance waits while it holds it, its release frees
// the key, and a release of a key it does not hold (taken over by another
// owner) deletes nothing and fails.
func TestLockFloorIsACorrectLock(t *testing.T) {
	a, b := newContender(t, LockFloor), newContender(t, LockFloor)
	key := testKey(t)
	rel := acquire(t, a, key)
	admin := redis.NewClient(&redis.Options{Addr: redistest.Shared(t).Addr()})
	defer admin.Close()
	ctx := context.Background()
	if ttl := admin.PTTL(ctx, key).Val(); ttl <= 0 || ttl > peerTTL {
		t.Errorf("the key's TTL is %v, want up to %v", ttl, peerTTL)
	}
	mustWait(t, b, key)
	release(t, rel)
	if n := admin.Exists(ctx, key).Val(); n != 0 {
		t.Fatalf("the key exists after the release")
	}
	rel = acquire(t, b, key)
	release(t, rel)

	rel = acquire(t, a, key)
	admin.Set(ctx, key, "someone else", 0)
	if err := rel(ctx); err == nil {
		t.Errorf("the release of a key another owner holds succeeded")
	}
	if v := admin.Get(ctx, key).Val(); v != "someone else" {
		t.Errorf("the other owner's key holds %q after the floor's release", v)
	}
}
