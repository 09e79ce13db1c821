package redisstat

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/lockreg/lockreg/internal/redistest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(redistest.M(m)) }

func TestCounterAndCommandStatsAgree(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	var counter Counter
	c := srv.Client(t, &counter)

	before, err := CommandStats(ctx, admin)
	require.NoError(t, err)
	trips := counter.RoundTrips()
	require.NoError(t, c.Set(ctx, "k", "1", 0).Err())
	_, err = c.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Incr(ctx, "k")
		p.Incr(ctx, "k")
		return nil
	})
	require.NoError(t, err)
	require.NoError(t, c.Eval(ctx, "return redis.call('GET', KEYS[1])", []string{"k"}).Err())
	after, err := CommandStats(ctx, admin)
	require.NoError(t, err)

	require.Equal(t, trips+3, counter.RoundTrips(), "a pipeline is one round trip")
	require.Equal(t, map[string]int64{"set": 1, "incr": 2, "eval": 1}, counter.Commands(), "connection handshakes are left out")
	delta := Delta(before, after)
	for name, want := range map[string]int64{"set": 1, "incr": 2, "eval": 1, "get": 1, "info": 1, "ping": 0} {
		require.Equal(t, want, delta[name], "server calls of %s (a GET inside the script counts)", name)
	}
}

func TestCommandMicrosCountsTheNamedCommandsOnly(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	c := srv.Client(t)
	busy := "local n = 0 for i = 1, tonumber(ARGV[1]) do n = n + i end return n"

	scripts := func() int64 {
		us, err := CommandMicros(ctx, c, "evalsha", "eval")
		require.NoError(t, err)
		return us
	}
	sets := func() int64 {
		us, err := CommandMicros(ctx, c, "set")
		require.NoError(t, err)
		return us
	}
	before, setsBefore := scripts(), sets()
	for range 1000 {
		require.NoError(t, c.Set(ctx, "k", "v", 0).Err())
	}
	afterSets := scripts()
	require.Equal(t, before, afterSets, "commands not named are not counted")
	require.Positive(t, sets()-setsBefore, "named ones are")

	start := time.Now()
	require.NoError(t, c.Eval(ctx, busy, nil, 20_000_000).Err())
	took := time.Since(start)
	spent := time.Duration(scripts()-afterSets) * time.Microsecond
	require.Greater(t, spent, took/4, "the script's run is counted")
	require.LessOrEqual(t, spent, took, "and no more than the call took")
}
