//go:build linux

package main

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockreg/lockreg/internal/faultproxy"
	"github.com/lockreg/lockreg/internal/redistest"
)

// The topologies the lock Redis can have (-topology).
const (
	topoSingle   = "single"
	topoSentinel = "sentinel"
	topoCluster  = "cluster"
)

// topologyFaults are the fault kinds that apply to each topology, and
// defaultFaults those a run rotates through unless -faults says
// otherwise: all that apply but the key faults, except that a single
// server's run keeps to the server faults it always had (make chaos-net
// adds the network ones, make chaos-keys the key faults).
var (
	workerFaults   = []string{faultStop, faultKill}
	networkFaults  = []string{faultNetStall, faultNetDelay, faultNetReset}
	keyFaults      = []string{faultDel, faultOverwrite, faultFlush, faultEvict}
	sentinelFaults = concat([]string{faultFailover}, networkFaults, workerFaults)
	clusterFaults  = concat([]string{faultClusterFailover, faultMigrate}, networkFaults, workerFaults)
	topologyFaults = map[string][]string{
		topoSingle:   concat([]string{faultStop, faultClientKill, faultRestart, faultPause, faultSleep, faultKill}, networkFaults, keyFaults),
		topoSentinel: concat(sentinelFaults, keyFaults[:2]),
		topoCluster:  concat(clusterFaults, keyFaults),
	}
	defaultFaults = map[string][]string{
		topoSingle:   topologyFaults[topoSingle][:6],
		topoSentinel: sentinelFaults,
		topoCluster:  clusterFaults,
	}
)

func concat(lists ...[]string) []string {
	var out []string
	for _, l := range lists {
		out = append(out, l...)
	}
	return out
}

// topology is the lock Redis as lockcheck started it.
type topology interface {
	// addrs are what workers connect to: the server, the Sentinels, or
	// the cluster's nodes.
	addrs() []string
	// servers are the Redis servers whose roles can change (none for a
	// single server).
	servers() []*redistest.Server
	// serves returns, of keys, those whose primary is at addr.
	serves(ctx context.Context, addr string, keys []string) ([]string, error)
	describe() string
	close()
}

// serverAddrs are the addresses of topo's Redis servers.
func serverAddrs(topo topology) []string {
	servers := topo.servers()
	if len(servers) == 0 {
		return topo.addrs() // a single server
	}
	addrs := make([]string, len(servers))
	for i, s := range servers {
		addrs[i] = s.Addr()
	}
	return addrs
}

func startTopology(name string) (topology, error) {
	switch name {
	case topoSentinel:
		g, stop, err := redistest.LaunchSentinelGroup(redistest.StableDownAfter)
		if err != nil {
			return nil, err
		}
		return &sentinelGroup{g: g, stop: stop}, nil
	case topoCluster:
		c, stop, err := redistest.LaunchCluster(3, 1)
		if err != nil {
			return nil, err
		}
		return &cluster{c: c, stop: stop, admin: redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})}, nil
	}
	srv, err := redistest.Launch()
	if err != nil {
		return nil, err
	}
	return &singleServer{srv: srv}, nil
}

// singleServer is one lock Redis, which the server faults strike.
type singleServer struct{ srv *redistest.Server }

func (t *singleServer) addrs() []string              { return []string{t.srv.Addr()} }
func (t *singleServer) servers() []*redistest.Server { return nil }
func (t *singleServer) describe() string             { return "lock Redis " + t.srv.Addr() }
func (t *singleServer) close()                       { t.srv.Shutdown() }
func (t *singleServer) serves(_ context.Context, _ string, keys []string) ([]string, error) {
	return keys, nil
}

// sentinelGroup is a primary, its replica and three Sentinels.
type sentinelGroup struct {
	g    *redistest.SentinelGroup
	stop func()
}

func (t *sentinelGroup) addrs() []string { return t.g.SentinelAddrs() }
func (t *sentinelGroup) servers() []*redistest.Server {
	return []*redistest.Server{t.g.Primary, t.g.Replica}
}
func (t *sentinelGroup) describe() string {
	return fmt.Sprintf("lock Redis %s and %s, Sentinels %v", t.g.Primary.Addr(), t.g.Replica.Addr(), t.g.SentinelAddrs())
}
func (t *sentinelGroup) close() { t.stop() }
func (t *sentinelGroup) serves(_ context.Context, _ string, keys []string) ([]string, error) {
	return keys, nil
}

// cluster is three primaries with a replica each.
type cluster struct {
	c     *redistest.Cluster
	stop  func()
	admin *redis.ClusterClient
}

func (t *cluster) addrs() []string              { return t.c.Addrs() }
func (t *cluster) servers() []*redistest.Server { return t.c.Nodes }
func (t *cluster) describe() string             { return fmt.Sprintf("lock Redis Cluster %v", t.c.Addrs()) }
func (t *cluster) close() {
	_ = t.admin.Close()
	t.stop()
}

// serves asks addr itself which slots it serves as a primary.
func (t *cluster) serves(ctx context.Context, addr string, keys []string) ([]string, error) {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	slots, err := c.ClusterSlots(ctx).Result()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, k := range keys {
		slot, err := t.slot(ctx, k)
		if err != nil {
			return nil, err
		}
		for _, s := range slots {
			if s.Start <= slot && slot <= s.End && s.Nodes[0].Addr == addr {
				out = append(out, k)
			}
		}
	}
	return out, nil
}

// slot is the hash slot of key's lock, whose hash tag is the key.
func (t *cluster) slot(ctx context.Context, key string) (int, error) {
	n, err := t.admin.ClusterKeySlot(ctx, key).Result()
	return int(n), err
}

// newLockClient is a client of the lock Redis for worker cfg, dialling
// through router unless it is "", its connections under the wiretap of
// leases (wiretap.go). Odd workers' clients end their calls at the
// context's deadline (ContextTimeoutEnabled), so that a run covers both
// ways an acquisition waits for Redis: in a goroutine of its own, and,
// for a first attempt that can, on the calling goroutine.
func newLockClient(cfg workerConfig, router string, leases *leaseTracker) redis.UniversalClient {
	// go-redis's own dial timeout, which a Dialer replaces.
	dial := (&net.Dialer{Timeout: 5 * time.Second}).DialContext
	if router != "" {
		dial = faultproxy.Dialer(router)
	}
	dial = tapDialer(dial, leases.renewed)
	deadlines := cfg.ID%2 == 1
	switch cfg.Topology {
	case topoSentinel:
		return redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName: redistest.SentinelMaster, SentinelAddrs: cfg.LockAddrs,
			ContextTimeoutEnabled: deadlines, Dialer: dial,
		})
	case topoCluster:
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: cfg.LockAddrs, ContextTimeoutEnabled: deadlines, Dialer: dial})
	}
	return redis.NewClient(&redis.Options{Addr: cfg.LockAddrs[0], ContextTimeoutEnabled: deadlines, Dialer: dial})
}

// addHook adds hook to every call of c.
func addHook(c redis.UniversalClient, hook redis.Hook) {
	if cc, ok := c.(*redis.ClusterClient); ok {
		// On the nodes, not the cluster client: the library sends an
		// acquisition that waits for replicas straight to the key's
		// primary, and every call through the cluster client reaches a
		// node's hooks too.
		cc.OnNewNode(func(node *redis.Client) { node.AddHook(hook) })
		return
	}
	c.AddHook(hook)
}
