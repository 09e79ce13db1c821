package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// The servers, Sentinels and redis-cli that the tests start are those that
// LOCKREG_SERVER names: the server's INFO says its name and version, a
// Sentinel's says so too and that it runs as a Sentinel, and the cli says
// its version. Unset, whatever runs from PATH passes, but the Sentinel must
// still be one.
func TestServersAreThoseOfLockregServer(t *testing.T) {
	want := os.Getenv(ServerEnv)
	if os.Getenv("REDIS_SERVER") != "" || os.Getenv("REDIS_SENTINEL") != "" {
		want = "" // they override it
	}

	s := Start(t)
	info := infoServer(t, s.Client(t))
	got := serverOf(info)
	t.Logf("server: %s (%s=%q)", got, ServerEnv, os.Getenv(ServerEnv))
	if want != "" {
		require.True(t, strings.HasPrefix(got, want+"."), "%s=%s, but the server is %s:\n%v", ServerEnv, want, got, info)
	}

	bin, err := program("REDIS_SENTINEL", "redis-sentinel")
	require.NoError(t, err)
	path, err := exec.LookPath(bin)
	require.NoError(t, err)
	host, port, _ := net.SplitHostPort(s.Addr())
	sentinel, err := startProcess(path, fmt.Sprintf("sentinel monitor %s %s %s 1\n", SentinelMaster, host, port))
	require.NoError(t, err)
	t.Cleanup(sentinel.close)
	sinfo := infoServer(t, redis.NewClient(&redis.Options{Addr: sentinel.Addr()}))
	mode := sinfo["redis_mode"]
	if mode == "" {
		mode = sinfo["server_mode"] // Valkey's
	}
	require.Equal(t, "sentinel", mode, "%s runs as a Sentinel:\n%v", path, sinfo)
	require.Equal(t, got, serverOf(sinfo), "the Sentinel is of the server's version")

	cli, err := program("", "redis-cli")
	require.NoError(t, err)
	out, err := exec.Command(cli, "--version").CombinedOutput()
	require.NoError(t, err, "%s", out)
	t.Logf("cli: %s", strings.TrimSpace(string(out)))
	if want != "" {
		name, version, _ := strings.Cut(got, "-")
		require.Equal(t, []string{name + "-cli", version}, strings.Fields(string(out)), "%s=%s, but %s is not of the server's version", ServerEnv, want, cli)
	}
}

// infoServer is INFO server of c, by field.
func infoServer(t *testing.T, c *redis.Client) map[string]string {
	t.Helper()
	defer c.Close()
	info, err := c.Info(context.Background(), "server").Result()
	require.NoError(t, err)
	fields := map[string]string{}
	for _, line := range strings.Split(info, "\r\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			fields[k] = v
		}
	}
	return fields
}

// serverOf names the server of INFO server's fields as ServerEnv does, with
// its full version: redis-8.0.2, or valkey-8.1.1 (Valkey says
// server_name:valkey and its own valkey_version, and a redis_version of
// 7.2.4, the Redis it is compatible with).
func serverOf(info map[string]string) string {
	if info["server_name"] == "valkey" {
		return "valkey-" + info["valkey_version"]
	}
	return "redis-" + info["redis_version"]
}

func TestLockregServerUnknownOrMissingFails(t *testing.T) {
	t.Setenv("REDIS_SERVER", "")
	t.Setenv("LOCKREG_SERVERS_DIR", t.TempDir())

	t.Setenv(ServerEnv, "redis-5.0")
	_, err := start()
	require.ErrorContains(t, err, "LOCKREG_SERVER=redis-5.0: unknown server; one of redis-7.0, redis-8.0, valkey-8.1")

	t.Setenv(ServerEnv, "valkey-8.1")
	_, err = start()
	require.ErrorContains(t, err, "LOCKREG_SERVER=valkey-8.1: not installed")
	require.ErrorContains(t, err, "run scripts/servers install valkey-8.1")
	_, _, err = LaunchCluster(3, 0)
	require.ErrorContains(t, err, "run scripts/servers install valkey-8.1")

	// REDIS_SERVER still overrides.
	t.Setenv("REDIS_SERVER", "/nonexistent/redis-server")
	_, err = start()
	require.ErrorContains(t, err, "apt-get install -y redis-server")
}

func TestLockregServerBinDir(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("LOCKREG_SERVERS_DIR", dir)
	bin := filepath.Join(dir, "valkey-8.1", "bin")
	require.NoError(t, os.MkdirAll(bin, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(bin, "valkey-sentinel"), nil, 0o755))
	t.Setenv(ServerEnv, "valkey-8.1")
	t.Setenv("REDIS_SENTINEL", "")
	path, err := program("REDIS_SENTINEL", "redis-sentinel")
	require.NoError(t, err)
	require.Equal(t, filepath.Join(bin, "valkey-sentinel"), path)
	t.Setenv("REDIS_SENTINEL", "/opt/redis-sentinel")
	path, err = program("REDIS_SENTINEL", "redis-sentinel")
	require.NoError(t, err)
	require.Equal(t, "/opt/redis-sentinel", path)
}
