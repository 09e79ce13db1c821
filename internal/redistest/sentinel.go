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
// the primary counts as down after DownAfter without a reply, and a
// failover attempt that stalls (a split vote among the Sentinels) is given
// up after failoverTimeout and retried after twice that.
//
// A Sentinel pings every second, or every down-after if that is shorter,
// and counts a new primary's link from when it made it, so with a
// down-after of a second or less it can find the primary it has just
// switched to down before its first ping is answered: the Sentinels then
// fail over again, and back. StableDownAfter is long enough to rule that
// out, for runs that fail over again and again.
const (
	DownAfter       = 500 * time.Millisecond
	StableDownAfter = 1500 * time.Millisecond
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
	g, stop, err := LaunchSentinelGroup(DownAfter)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(stop)
	return g
}

// LaunchSentinelGroup is StartSentinelGroup outside of a test, with the
// Sentinels' down-after-milliseconds; stop stops every process of the
// group.
func LaunchSentinelGroup(downAfter time.Duration) (g *SentinelGroup, stop func(), err error) {
	bin, err := program("REDIS_SENTINEL", "redis-sentinel")
	if err != nil {
		return nil, nil, err
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, nil, fmt.Errorf("redistest: redis-sentinel not found (%v); install it (Debian/Ubuntu: apt-get install -y redis-sentinel, or run `make test`, which does), or set REDIS_SENTINEL to its path", err)
	}
	g = &SentinelGroup{}
	// The Sentinels stop first, and take no stopping server for a failed
	// one.
	stop = func() {
		for _, s := range append(g.sentinels, g.Replica, g.Primary) {
			if s != nil {
				s.close()
			}
		}
	}
	if g.Primary, err = start(); err != nil {
		return nil, nil, err
	}
	if g.Replica, err = LaunchReplica(g.Primary); err != nil {
		stop()
		return nil, nil, err
	}
	host, port, _ := net.SplitHostPort(g.Primary.addr)
	conf := fmt.Sprintf("sentinel monitor %[1]s %[2]s %[3]s 2\n"+
		"sentinel down-after-milliseconds %[1]s %[4]d\n"+
		"sentinel failover-timeout %[1]s %[5]d\n"+
		"sentinel parallel-syncs %[1]s 1\n",
		SentinelMaster, host, port, downAfter.Milliseconds(), failoverTimeout.Milliseconds())
	for range 3 {
		s, err := startProcess(path, conf)
		if err != nil {
			stop()
			return nil, nil, err
		}
		g.sentinels = append(g.sentinels, s)
	}
	// Sentinels find each other through hello messages on the primary,
	// every two seconds; until they have, none can win the vote.
	if err := g.awaitSentinels(15*time.Second, func(c *redis.SentinelClient) (bool, string) {
		master, err := c.Master(context.Background(), SentinelMaster).Result()
		ok := err == nil && master["num-other-sentinels"] == "2" && master["num-slaves"] == "1" && master["flags"] == "master"
		return ok, fmt.Sprintf("never saw the replica and the other Sentinels: %v %v", master, err)
	}); err != nil {
		stop()
		return nil, nil, err
	}
	return g, stop, nil
}

// awaitSentinels waits, at most timeout, until ok holds for every
// Sentinel.
func (g *SentinelGroup) awaitSentinels(timeout time.Duration, ok func(c *redis.SentinelClient) (bool, string)) error {
	deadline := time.Now().Add(timeout)
	for _, s := range g.sentinels {
		c := redis.NewSentinelClient(&redis.Options{Addr: s.addr})
		for {
			done, state := ok(c)
			if done {
				break
			}
			if time.Now().After(deadline) {
				_ = c.Close()
				return fmt.Errorf("redistest: Sentinel %s: %s\n%s", s.addr, state, s.logTail())
			}
			time.Sleep(50 * time.Millisecond)
		}
		_ = c.Close()
	}
	return nil
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
	s, err := g.AwaitFailover(old, timeout)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// AwaitFailover is WaitForFailover outside of a test.
func (g *SentinelGroup) AwaitFailover(old *Server, timeout time.Duration) (*Server, error) {
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
				if s.addr == addr && s.Role() == "master" {
					return s, nil
				}
			}
		}
		if time.Now().After(deadline) {
			var logs strings.Builder
			for _, s := range g.sentinels {
				fmt.Fprintf(&logs, "--- Sentinel %s\n%s", s.addr, s.logTail())
			}
			return nil, fmt.Errorf("redistest: no failover from %s within %v\n%s", old.addr, timeout, logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Rejoin starts old, a primary that crashed and was failed over, again as
// a replica of primary, and waits, at most timeout, until every Sentinel
// counts it as a healthy replica, so that a next failover can promote it.
func (g *SentinelGroup) Rejoin(old, primary *Server, timeout time.Duration) error {
	if err := old.RelaunchReplicaOf(primary); err != nil {
		return err
	}
	return g.awaitSentinels(timeout, func(c *redis.SentinelClient) (bool, string) {
		ctx := context.Background()
		master, err := c.Master(ctx, SentinelMaster).Result()
		if err != nil || net.JoinHostPort(master["ip"], master["port"]) != primary.addr || master["flags"] != "master" {
			return false, fmt.Sprintf("does not name %s as the primary: %v %v", primary.addr, master, err)
		}
		replicas, err := c.Replicas(ctx, SentinelMaster).Result()
		for _, r := range replicas {
			if net.JoinHostPort(r["ip"], r["port"]) == old.addr && r["flags"] == "slave" && r["master-link-status"] == "ok" {
				return true, ""
			}
		}
		return false, fmt.Sprintf("does not count %s as a healthy replica: %v %v", old.addr, replicas, err)
	})
}

// Role is what ROLE says the server is ("master", "slave"), or "" if it
// does not answer.
func (s *Server) Role() string {
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
