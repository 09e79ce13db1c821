package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/lockreg/lockreg"
	"github.com/lockreg/lockreg/internal/redistest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(redistest.M(m))
}

// lockctl builds the command once per test binary.
var lockctl = func() func(t *testing.T) string {
	var bin string
	var err error
	return func(t *testing.T) string {
		t.Helper()
		if bin == "" && err == nil {
			dir, mkErr := os.MkdirTemp("", "lockctl")
			require.NoError(t, mkErr)
			bin = filepath.Join(dir, "lockctl")
			out, buildErr := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
			if buildErr != nil {
				err = errors.New(string(out))
			}
		}
		require.NoError(t, err, "go build")
		return bin
	}
}()

// result is one run of the built lockctl.
type result struct {
	code           int
	stdout, stderr string
}

func runLockctl(t *testing.T, env []string, args ...string) result {
	t.Helper()
	cmd := exec.Command(lockctl(t), args...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return result{code, stdout.String(), stderr.String()}
}

// TestLockctlAgainstALiveRegistry runs the built binary: list, show, JSON,
// unlock, and the exit codes that tell "not found" from errors.
func TestLockctlAgainstALiveRegistry(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	url := "redis://" + srv.Addr()
	const ns = "orders"
	service, err := lockreg.New(srv.Client(t), ns, lockreg.WithOwner("billing/pod-7"))
	require.NoError(t, err)
	defer service.Close()
	held, err := service.Obtain("order-42").Acquire(ctx)
	require.NoError(t, err)
	token, err := held.Token(ctx)
	require.NoError(t, err)
	other, err := service.Obtain("order-7").Acquire(ctx)
	require.NoError(t, err)
	awaitOwnerName(t, service, "order-42", "billing/pod-7")

	res := runLockctl(t, nil, "-redis", url, "-namespace", ns, "list")
	require.Equal(t, exitOK, res.code, res.stderr)
	require.Empty(t, res.stderr)
	lines := strings.Split(strings.TrimSuffix(res.stdout, "\n"), "\n")
	require.Len(t, lines, 3, res.stdout)
	require.Regexp(t, `^\s+TTL\s+TOKEN\s+WAITING\s+STATE\s+OWNER\s+KEY$`, lines[0])
	require.Regexp(t, `^\s*\d+\.\ds\s+\d+\s+0\s+live\s+billing/pod-7\s+"order-42"$`, lines[1], "sorted by key")
	require.Regexp(t, `^\s*\d+\.\ds\s+-\s+0\s+live\s+billing/pod-7\s+"order-7"$`, lines[2], "no token drawn")

	res = runLockctl(t, []string{"REDIS_URL=" + url}, "-namespace", ns, "-json", "show", "order-42")
	require.Equal(t, exitOK, res.code, res.stderr)
	var shown lockJSON
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &shown))
	require.Equal(t, "order-42", shown.Key)
	require.Equal(t, "billing/pod-7", shown.Owner)
	require.Equal(t, token, shown.Token)
	require.Positive(t, shown.TTLms)

	res = runLockctl(t, nil, "-redis", url, "-namespace", ns, "show", "order-1")
	require.Equal(t, exitNotFound, res.code)
	require.Equal(t, "lockctl: \"order-1\" is not held in namespace \"orders\"\n", res.stderr, "the namespace is in use: no hint")

	res = runLockctl(t, nil, "-redis", url, "-namespace", ns, "unlock", "order-42")
	require.Equal(t, exitUsage, res.code, "no terminal to ask on")
	require.Contains(t, res.stderr, "-yes")
	requireOpen(t, held.Lost())

	res = runLockctl(t, nil, "-redis", url, "-namespace", ns, "unlock", "-yes", "order-42")
	require.Equal(t, exitOK, res.code, res.stderr)
	require.Equal(t, "unlocked \"order-42\", held by billing/pod-7 (live: it may still be working, and learns that it lost the lock)\n", res.stdout)
	requireLost(t, held)
	require.ErrorIs(t, held.Release(ctx), lockreg.ErrLockLost)

	res = runLockctl(t, nil, "-redis", url, "-namespace", ns, "-json", "list")
	require.Equal(t, exitOK, res.code, res.stderr)
	var listed []lockJSON
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &listed))
	require.Len(t, listed, 1)
	require.Equal(t, "order-7", listed[0].Key)
	require.NoError(t, other.Release(ctx))

	res = runLockctl(t, nil, "-redis", url, "-namespace", ns, "list")
	require.Equal(t, exitNotFound, res.code)
	require.Empty(t, res.stdout)
	require.Equal(t, "lockctl: no locks held in namespace \"orders\"; 1 registry of it is live: seen within "+twoLeases+"\n", res.stderr)

	res = runLockctl(t, nil, "-redis", url, "-namespace", "nobody", "list")
	require.Equal(t, exitNotFound, res.code)
	require.Contains(t, res.stderr, `no locks held in namespace "nobody"; no registry of this namespace seen`)
	require.Contains(t, res.stderr, `the namespaces in use are "orders"`)
}

// TestLockctlNamesTheCommandAnACLForbids: an inspector's user may list,
// but not force a lock open.
func TestLockctlNamesTheCommandAnACLForbids(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "inspector", "on", ">secret", "resetkeys", "resetchannels",
		"%R~orders:{*", "%R~orders:owner:*", "-@all", "+get", "+pttl", "+zrange", "+hget", "+time", "+scan", "+ping", "+hello").Err())
	service, err := lockreg.New(srv.Client(t), "orders")
	require.NoError(t, err)
	defer service.Close()
	h, err := service.Obtain("o-1").Acquire(ctx)
	require.NoError(t, err)
	url := "redis://inspector:secret@" + srv.Addr()
	res := runLockctl(t, nil, "-redis", url, "-namespace", "orders", "list")
	require.Equal(t, exitOK, res.code, res.stderr)
	res = runLockctl(t, nil, "-redis", url, "-namespace", "orders", "unlock", "-yes", "o-1")
	require.Equal(t, exitError, res.code)
	require.True(t, strings.Contains(res.stderr, "'evalsha'") || strings.Contains(res.stderr, "'eval'"), res.stderr)
	requireOpen(t, h.Lost())
	require.NoError(t, h.Release(ctx))
}

// clusterHolding starts a Cluster of 3 primaries on which a registry of
// namespace "orders" holds keys, and returns its addresses.
func clusterHolding(t *testing.T, keys ...string) []string {
	t.Helper()
	addrs := redistest.StartCluster(t, 3)
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = client.Close() })
	service, err := lockreg.New(client, "orders")
	require.NoError(t, err)
	t.Cleanup(func() { _ = service.Close() })
	for _, key := range keys {
		_, err := service.Obtain(key).Acquire(context.Background())
		require.NoError(t, err)
	}
	return addrs
}

func TestLockctlListsACluster(t *testing.T) {
	keys := []string{"a", "b", "c", "d", "e", "f"}
	addrs := clusterHolding(t, keys...)
	res := runLockctl(t, nil, "-redis", strings.Join(addrs, ","), "-namespace", "orders", "-json", "list")
	require.Equal(t, exitOK, res.code, res.stderr)
	var listed []lockJSON
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &listed))
	var got []string
	for _, l := range listed {
		got = append(got, l.Key)
	}
	require.ElementsMatch(t, keys, got)
}

// TestLockctlFindsAClusterFromOneNode: an operator who gives one Cluster
// node's address, without -cluster, is shown the whole Cluster's locks,
// not that node's alone, nor told that none is held.
func TestLockctlFindsAClusterFromOneNode(t *testing.T) {
	t.Parallel()
	addrs := clusterHolding(t, "a")
	for _, addr := range addrs {
		res := runLockctl(t, nil, "-redis", addr, "-namespace", "orders", "-json", "list")
		require.Equal(t, exitOK, res.code, "%s: %s", addr, res.stderr)
		var listed []lockJSON
		require.NoError(t, json.Unmarshal([]byte(res.stdout), &listed))
		require.Len(t, listed, 1, addr)
		require.Equal(t, "a", listed[0].Key)
		res = runLockctl(t, nil, "-redis", "redis://"+addr, "-namespace", "orders", "show", "a")
		require.Equal(t, exitOK, res.code, "%s: %s", addr, res.stderr)
	}
}

// awaitOwnerName waits until Inspect names key's owner: a registry
// publishes its name in the background (publishSoon) when it first
// acquires.
func awaitOwnerName(t *testing.T, r *lockreg.Registry, key, name string) {
	t.Helper()
	require.Eventually(t, func() bool {
		info, err := r.Inspect(context.Background(), key)
		return err == nil && info.Owner == name
	}, 5*time.Second, 10*time.Millisecond, "the owner of %q published its name", key)
}

// requireLost waits for h to hear that its lock was forced open.
func requireLost(t *testing.T, h *lockreg.Hold) {
	t.Helper()
	select {
	case <-h.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("the holder did not hear of the forced unlock")
	}
}

func requireOpen(t *testing.T, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
		t.Fatal("signalled lost")
	default:
	}
}

// holderEnv makes the test binary a holder process: it takes the keys
// named in the variable, says so, and waits to be killed.
const holderEnv = "LOCKCTL_TEST_HOLDER"

func init() {
	spec, ok := os.LookupEnv(holderEnv)
	if !ok {
		return
	}
	addr, keys, _ := strings.Cut(spec, "|")
	client := redis.NewClient(&redis.Options{Addr: addr})
	registry, err := lockreg.New(client, "orders", lockreg.WithOwner("doomed-worker"))
	if err != nil {
		panic(err)
	}
	for _, key := range strings.Split(keys, ",") {
		if _, err := registry.Obtain(key).Acquire(context.Background()); err != nil {
			panic(err)
		}
	}
	os.Stdout.WriteString("holding\n")
	select {}
}

// TestLockctlFreesACrashedHoldersKeys: a holder killed with SIGKILL keeps
// its keys for its whole lease (30s by default); lockctl unlock frees
// them at once.
func TestLockctlFreesACrashedHoldersKeys(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	keys := []string{"order-1", "order-2", "order-3", "order-4"}
	self, err := os.Executable()
	require.NoError(t, err)
	holder := exec.Command(self, "-test.run", "^$")
	holder.Env = append(os.Environ(), holderEnv+"="+srv.Addr()+"|"+strings.Join(keys, ","))
	out, err := holder.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, holder.Start())
	line := make([]byte, len("holding\n"))
	_, err = io.ReadFull(out, line)
	require.NoError(t, err, "the holder took its keys")
	waiter, err := lockreg.New(srv.Client(t), "orders")
	require.NoError(t, err)
	defer waiter.Close()
	// Kill the holder once its name is there, else lockctl may find none
	// to print.
	awaitOwnerName(t, waiter, keys[0], "doomed-worker")
	require.NoError(t, holder.Process.Kill())
	_ = holder.Wait()

	for _, key := range keys {
		info, err := waiter.Inspect(ctx, key)
		require.NoError(t, err)
		require.Greater(t, info.TTL, 20*time.Second, "the dead holder's lease runs on")
	}
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	_, err = waiter.Obtain(keys[0]).Acquire(short)
	require.ErrorIs(t, err, lockreg.ErrNotObtained, "blocked by the dead holder")

	start := time.Now()
	for _, key := range keys {
		res := runLockctl(t, nil, "-redis", "redis://"+srv.Addr(), "-namespace", "orders", "unlock", "-yes", key)
		require.Equal(t, exitOK, res.code, res.stderr)
		// Its name outlives it by two leases: live, as lockctl counts it.
		require.Contains(t, res.stdout, "held by doomed-worker (live")
	}
	for _, key := range keys {
		h, err := waiter.Obtain(key).Acquire(ctx)
		require.NoError(t, err)
		require.NoError(t, h.Release(ctx))
	}
	t.Logf("4 keys of a killed holder freed by lockctl and taken in %v (its lease had 20s+ left)", time.Since(start))
}

func TestLockctlFollowsSentinels(t *testing.T) {
	ctx := context.Background()
	g := redistest.StartSentinelGroup(t)
	service, err := lockreg.New(g.FailoverClient(t), "orders", lockreg.WithOwner("behind-sentinels"))
	require.NoError(t, err)
	defer service.Close()
	h, err := service.Obtain("o-1").Acquire(ctx)
	require.NoError(t, err)
	res := runLockctl(t, nil, "-redis", strings.Join(g.SentinelAddrs(), ","), "-sentinel", redistest.SentinelMaster, "-namespace", "orders", "show", "o-1")
	require.Equal(t, exitOK, res.code, res.stderr)
	require.Contains(t, res.stdout, "o-1")
	require.NoError(t, h.Release(ctx))
}

// TestLockctlFollowsSentinelsThatAskForAPassword: Sentinels and their
// servers often share one password; -redis's then reaches both.
func TestLockctlFollowsSentinelsThatAskForAPassword(t *testing.T) {
	ctx := context.Background()
	g := redistest.StartSentinelGroup(t)
	for _, srv := range []*redistest.Server{g.Replica, g.Primary} {
		require.NoError(t, srv.Client(t).ConfigSet(ctx, "masterauth", "pw").Err())
		require.NoError(t, srv.Client(t).ConfigSet(ctx, "requirepass", "pw").Err())
	}
	for _, addr := range g.SentinelAddrs() {
		sentinel := redis.NewSentinelClient(&redis.Options{Addr: addr})
		require.NoError(t, sentinel.Set(ctx, redistest.SentinelMaster, "auth-pass", "pw").Err())
		require.NoError(t, sentinel.Process(ctx, redis.NewStatusCmd(ctx, "acl", "setuser", "default", "resetpass", ">pw")))
		require.NoError(t, sentinel.Close())
	}
	client := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName: redistest.SentinelMaster, SentinelAddrs: g.SentinelAddrs(), Password: "pw", SentinelPassword: "pw",
	})
	defer client.Close()
	service, err := lockreg.New(client, "orders", lockreg.WithOwner("behind-sentinels"))
	require.NoError(t, err)
	defer service.Close()
	h, err := service.Obtain("o-1").Acquire(ctx)
	require.NoError(t, err)
	var addrs []string
	for _, addr := range g.SentinelAddrs() {
		addrs = append(addrs, "redis://:pw@"+addr)
	}
	res := runLockctl(t, nil, "-redis", strings.Join(addrs, ","), "-sentinel", redistest.SentinelMaster, "-namespace", "orders", "show", "o-1")
	require.Equal(t, exitOK, res.code, res.stderr)
	require.Contains(t, res.stdout, "behind-sentinels")
	require.NoError(t, h.Release(ctx))
}

// TestLockctlExitsPromptly: lockreg's Close can wait 15s when it races the
// tracking subscription that New starts (about one run in five); lockctl
// does not wait for it.
func TestLockctlExitsPromptly(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	service, err := lockreg.New(srv.Client(t), "orders")
	require.NoError(t, err)
	defer service.Close()
	h, err := service.Obtain("o-1").Acquire(ctx)
	require.NoError(t, err)
	defer func() { require.NoError(t, h.Release(ctx)) }()
	for i := range 20 {
		start := time.Now()
		res := runLockctl(t, nil, "-redis", srv.Addr(), "-namespace", "orders", "list")
		require.Equal(t, exitOK, res.code, res.stderr)
		require.Less(t, time.Since(start), 5*time.Second, "run %d", i)
	}
}
