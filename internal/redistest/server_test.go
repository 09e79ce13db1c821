package redistest

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(M(m)) }

func TestRestartKeepsAddressAndDropsData(t *testing.T) {
	ctx := context.Background()
	s := Start(t)
	c := s.Client(t)
	require.NoError(t, c.Set(ctx, "k", "v", 0).Err())
	addr := s.Addr()

	s.Stop(t)
	require.Error(t, c.Ping(ctx).Err(), "stopped")
	s.Restart(t)
	require.Equal(t, addr, s.Addr())
	require.Zero(t, c.Exists(ctx, "k").Val(), "no persistence: a restart loses every key")
}

func TestSharedIsOneServer(t *testing.T) {
	require.Equal(t, Shared(t).Addr(), SharedAddr())
	require.NoError(t, Shared(t).Client(t).Ping(context.Background()).Err())
}

func TestMissingBinaryFailsWithInstallHint(t *testing.T) {
	t.Setenv("REDIS_SERVER", "/nonexistent/redis-server")
	_, err := start()
	require.ErrorContains(t, err, "apt-get install -y redis-server")
}
