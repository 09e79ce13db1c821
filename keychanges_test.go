package lockreg

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg/internal/redistest"
)

// TestAHolderLearnsAtOnceOfEveryCommandThatChangesItsKey: not DEL and SET
// alone. Every command that takes a held key out of its database, or
// changes its value or type, tells the holder within a round trip or two,
// with the cause that names what became of the key.
func TestAHolderLearnsAtOnceOfEveryCommandThatChangesItsKey(t *testing.T) {
	t.Parallel() // a few seconds in all
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	for _, c := range []struct {
		name    string
		command func(redisKey string) [][]any
		cause   LossCause
	}{
		{"MOVE to another database", func(k string) [][]any { return [][]any{{"move", k, 1}} }, LossDeleted},
		{"RENAME", func(k string) [][]any { return [][]any{{"rename", k, k + ":renamed"}} }, LossDeleted},
		{"GETDEL", func(k string) [][]any { return [][]any{{"getdel", k}} }, LossDeleted},
		{"UNLINK", func(k string) [][]any { return [][]any{{"unlink", k}} }, LossDeleted},
		{"PEXPIRE 0", func(k string) [][]any { return [][]any{{"pexpire", k, 0}} }, LossDeleted},
		{"APPEND", func(k string) [][]any { return [][]any{{"append", k, "x"}} }, LossOverwritten},
		{"COPY onto it", func(k string) [][]any {
			return [][]any{{"set", k + ":src", "other"}, {"copy", k + ":src", k, "replace"}}
		}, LossOverwritten},
		{"RENAME onto it", func(k string) [][]any { return [][]any{{"set", k + ":src", "other"}, {"rename", k + ":src", k}} }, LossOverwritten},
		{"a list in its place", func(k string) [][]any { return [][]any{{"del", k}, {"rpush", k, "x"}} }, LossOverwritten},
	} {
		t.Run(c.name, func(t *testing.T) {
			// A key of each run's own: a run leaves a value of its own, with
			// no expiry, where the lock was, and a copy in database 1.
			key := fmt.Sprint("k", time.Now().UnixNano())
			h := holdAndChange(t, client, key, func(redisKey string) {
				// In one step: a read between a DEL and an RPUSH would find
				// the key gone, and rightly say deleted.
				_, err := client.TxPipelined(ctx, func(p redis.Pipeliner) error {
					for _, command := range c.command(redisKey) {
						p.Do(ctx, command...)
					}
					return nil
				})
				require.NoError(t, err)
			})
			requireCause(t, h, c.cause)
		})
	}
}

// TestAKeySwappedOutOfItsDatabaseCannotPassOnUnseen: SWAPDB tells no
// tracking client (Redis 7.0 and 8.0, Valkey 8.1), so a holder whose key
// a swap took out of its database learns it at its next renewal, not at
// once. Its key cannot pass on unseen meanwhile: tracking is by key name,
// whatever the database, so another owner's taking it tells the holder
// within a round trip or two.
func TestAKeySwappedOutOfItsDatabaseCannotPassOnUnseen(t *testing.T) {
	t.Parallel() // servers of their own, and a second or two
	ctx := context.Background()
	t.Run("another takes it", func(t *testing.T) {
		srv := redistest.Start(t)
		client := srv.Client(t)
		other := newRegistry(t, redis.NewClient(&redis.Options{Addr: srv.Addr()}))
		h := holdAndChange(t, client, "k", func(string) {
			require.NoError(t, client.Do(ctx, "swapdb", 0, 1).Err())
			taken, err := other.Obtain("k").Acquire(ctx)
			require.NoError(t, err)
			t.Cleanup(func() { _ = taken.Release(ctx) })
		})
		requireCause(t, h, LossOverwritten)
	})
	t.Run("at the renewal", func(t *testing.T) {
		srv := redistest.Start(t)
		client := srv.Client(t)
		const lease = 3 * time.Second
		h := holdAndChangeWithin(t, client, "k", lease/3+blindLimit, func(string) {
			require.NoError(t, client.Do(ctx, "swapdb", 0, 1).Err())
		}, WithExpireAfter(lease))
		requireCause(t, h, LossDeleted)
	})
}

// TestATrackerTurnTellsEachKeyItsOwnRead: a turn of the tracker reads
// several held keys in one pipeline; each hold learns its own key's
// fate, so that a key deleted next to one still held loses its hold, and
// only its hold.
func TestATrackerTurnTellsEachKeyItsOwnRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	r := newRegistry(t, srv.Client(t))
	reads := trackingReads(r)
	kept, err := r.Obtain("kept").Acquire(ctx)
	require.NoError(t, err)
	deleted, err := r.Obtain("deleted").Acquire(ctx)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return reads.Load() >= 2 }, 5*time.Second, time.Millisecond, "both keys are armed")
	tr := r.trackerFor(deleted.redisKey())
	require.NotNil(t, tr)
	// One turn reads both keys, the deleted one last; the invalidation of
	// the DEL waits for the queue, and reads it again after them.
	tr.mu.Lock()
	require.NoError(t, admin.Del(ctx, deleted.redisKey()).Err())
	tr.queue = append(tr.queue, armRequest{h: kept, cause: LossDeleted}, armRequest{h: deleted, cause: LossDeleted})
	tr.mu.Unlock()
	tr.wake()
	requireFires(t, deleted.Lost(), 5*time.Second, "the deleted key's hold is lost")
	requireCause(t, deleted, LossDeleted)
	readsSettled(reads)
	requireOpen(t, kept.Lost(), "the key still held lost its hold for another key's read")
	require.NoError(t, kept.Release(ctx))
}
