package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelMaster is the name under which a SentinelGroup's Sentinels
// monitor its primary.
const SentinelMaster = "lockreg"

// Sentinel timings, short so that a test's failover ends within seconds:
// the primary counts as down after downAfter without a reply, and a
// failover attempt that stalls (a split vote among the Sentinels) is given
// up after failoverTimeout and retried after twice that.
const (
	downAfter       = 500 * time.Millisecond
	failoverTimeout = 2 * time.Second
)

// SentinelGroup is a primary, one replica of it and three Sentinels that
// watch them and promote the replica when the primary fails, each a
// private process on a free loopback port.
type SentinelGroup struct {
	// Primary and Replica are the servers' roles at the start; a failover
	// swaps them (see WaitForFailover).
	Primary, Replica *Server
	sentinels        []*Server
}

// StartSentinelGroup starts a primary, a replica and three Sentinels
// (redis-sentinel, or REDIS_SENTINEL), and waits until every Sentinel
// knows the replica and the other two, so that killing the primary leads
// to a failover. Everything stops when the test ends.
func StartSentinelGroup(tb testing.TB) *SentinelGroup {
	tb.Helper()
	bin := os.Getenv("REDIS_SENTINEL")
	if bin == "" {
		bin = "redis-sentinel"
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		tb.Fatalf("redistest: redis-sentinel not found (%v); install it (Debian/Ubuntu: apt-get install -y redis-sentinel, or run `make test`, which does), or set REDIS_SENTINEL to its path", err)
	}
	primary := Start(tb)
	g := &SentinelGroup{Primary: primary, Replica: StartReplica(tb, primary)}
	host, port, _ := net.SplitHostPort(primary.addr)
	conf := fmt.Sprintf("sentinel monitor %[1]s %[2]s %[3]s 2\n"+
		"sentinel down-after-milliseconds %[1]s %[4]d\n"+
		"sentinel failover-timeout %[1]s %[5]d\n"+
		"sentinel parallel-syncs %[1]s 1\n",
		SentinelMaster, host, port, downAfter.Milliseconds(), failoverTimeout.Milliseconds())
	for range 3 {
		s, err := startProcess(path, conf)
		if err != nil {
			tb.Fatal(err)
		}
		// Registered after the servers', so the Sentinels stop first and
		// take no stopping server for a failed one.
		tb.Cleanup(s.close)
		g.sentinels = append(g.sentinels, s)
	}
	// Sentinels find each other through hello messages on the primary,
	// every two seconds; until they have, none can win the vote.
	ctx := context.Background()
	deadline := time.Now().Add(15 * time.Second)
	for _, s := range g.sentinels {
		c := redis.NewSentinelClient(&redis.Options{Addr: s.addr})
		for {
			master, err := c.Master(ctx, SentinelMaster).Result()
			if err == nil && master["num-other-sentinels"] == "2" && master["num-slaves"] == "1" && master["flags"] == "master" {
				break
			}
			if time.Now().After(deadline) {
				_ = c.Close()
				tb.Fatalf("redistest: Sentinel %s never saw the replica and the other Sentinels: %v %v\n%s", s.addr, master, err, s.logTail())
			}
			time.Sleep(50 * time.Millisecond)
		}
		_ = c.Close()
	}
	return g
}

// SentinelAddrs are the Sentinels' addresses, for redis.FailoverOptions.
func (g *SentinelGroup) SentinelAddrs() []string {
	addrs := make([]string, len(g.sentinels))
	for i, s := range g.sentinels {
		addrs[i] = s.addr
	}
	return addrs
}

// FailoverClient returns a redis.NewFailoverClient of the group, which
// follows the primary the Sentinels name; it is closed when the test ends.
func (g *SentinelGroup) FailoverClient(tb testing.TB, hooks ...redis.Hook) *redis.Client {
	tb.Helper()
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: SentinelMaster, SentinelAddrs: g.SentinelAddrs()})
	for _, h := range hooks {
		c.AddHook(h)
	}
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// WaitForFailover waits, at most timeout, until a Sentinel names a primary
// other than old and that server has taken the role, and returns it.
func (g *SentinelGroup) WaitForFailover(tb testing.TB, old *Server, timeout time.Duration) *Server {
	tb.Helper()
	ctx := context.Background()
	clients := make([]*redis.SentinelClient, len(g.sentinels))
	for i, s := range g.sentinels {
		clients[i] = redis.NewSentinelClient(&redis.Options{Addr: s.addr})
		defer clients[i].Close()
	}
	deadline := time.Now().Add(timeout)
	for {
		for _, c := range clients {
			hostPort, err := c.GetMasterAddrByName(ctx, SentinelMaster).Result()
			if err != nil || len(hostPort) != 2 {
				continue
			}
			addr := net.JoinHostPort(hostPort[0], hostPort[1])
			if addr == old.addr {
				continue
			}
			for _, s := range []*Server{g.Primary, g.Replica} {
				if s.addr == addr && s.role() == "master" {
					return s
				}
			}
		}
		if time.Now().After(deadline) {
			var logs strings.Builder
			for _, s := range g.sentinels {
				fmt.Fprintf(&logs, "--- Sentinel %s\n%s", s.addr, s.logTail())
			}
			tb.Fatalf("redistest: no failover from %s within %v\n%s", old.addr, timeout, logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// role is what ROLE says the server is ("master", "slave"), or "" if it
// does not answer.
func (s *Server) role() string {
	c := redis.NewClient(&redis.Options{Addr: s.addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	role, err := c.Do(ctx, "ROLE").Slice()
	if err != nil || len(role) == 0 {
		return ""
	}
	name, _ := role[0].(string)
	return name
}

// logTail is the end of the server's log, for failure messages.
func (s *Server) logTail() string {
	log, _ := os.ReadFile(s.logFile())
	const keep = 4000
	if len(log) > keep {
		log = log[len(log)-keep:]
	}
	return string(log)
}
