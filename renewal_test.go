package lockreg

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg/internal/protocol"
	"github.com/lockreg/lockreg/internal/redistest"
)

// TestARenewalThatFindsTheKeyGoneNamesTheCauseWhateverTheServer: a
// renewal sent after the process stood still past the lease finds the key
// gone, as Redis expired it: the hold is lost as expired, its own lapse,
// not as deleted behind its back, whether renew.lua or SET ... IFEQ
// (Valkey 8.1) renewed it; and a key found gone after a forced unlock
// whose note came first is lost as forced. make test runs this on Valkey
// 8.1 too.
func TestARenewalThatFindsTheKeyGoneNamesTheCauseWhateverTheServer(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	// Untracked (an ACL without CLIENT), once it said so: the registry's
	// client renews, and no check of the refusal reads the keys.
	r := untrackedRegistry(t, srv)
	lapsed, err := r.Obtain("lapsed").Acquire(ctx)
	require.NoError(t, err)
	forced, err := r.Obtain("forced").Acquire(ctx)
	require.NoError(t, err)
	require.False(t, r.tracking.on.Load(), "untracked")
	info, err := admin.Info(ctx, "server").Result()
	require.NoError(t, err)
	require.Equal(t, protocol.RenewsNatively(info), r.servers.native.Load(), "the registry knows what the server has")

	lapsed.tenure.leaseEnd.Store(int64(instantOf(time.Now().Add(-time.Millisecond))))
	forced.mu.Lock()
	forced.forced = true // its note came, the watchdog's round was under way
	forced.mu.Unlock()
	require.NoError(t, admin.Del(ctx, lapsed.redisKey(), forced.redisKey()).Err())
	r.renew(ctx, [][]*Hold{{lapsed}, {forced}})
	requireCause(t, forced, LossForced)
	requireCause(t, lapsed, LossExpired)
}
