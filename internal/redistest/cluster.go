package redistest

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Cluster is a Redis Cluster of private redis-server processes.
type Cluster struct {
	Nodes []*Server
}

// StartCluster starts a Redis Cluster of n primaries (no replicas), each a
// private redis-server, joined with redis-cli --cluster create, and waits
// until every node reports the cluster ok. It returns the nodes' addresses.
func StartCluster(tb testing.TB, n int) []string {
	tb.Helper()
	return startCluster(tb, n, 0)
}

// StartClusterWithReplicas starts a Redis Cluster of n primaries (at least
// 3, as redis-cli requires for replicas) with one replica each, and waits
// until the cluster is ok and every replica is in sync with its primary.
// It returns all 2n nodes' addresses.
func StartClusterWithReplicas(tb testing.TB, n int) []string {
	tb.Helper()
	return startCluster(tb, n, 1)
}

func startCluster(tb testing.TB, primaries, replicasEach int) []string {
	tb.Helper()
	c, stop, err := LaunchCluster(primaries, replicasEach)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(stop)
	return c.Addrs()
}

// LaunchCluster is StartCluster (replicasEach 0) or
// StartClusterWithReplicas (1) outside of a test; stop stops every node.
func LaunchCluster(primaries, replicasEach int) (c *Cluster, stop func(), err error) {
	cli, err := program("", "redis-cli")
	if err != nil {
		return nil, nil, err
	}
	cli, err = exec.LookPath(cli)
	if err != nil {
		return nil, nil, fmt.Errorf("redistest: redis-cli not found (%v); install it (Debian/Ubuntu: apt-get install -y redis-tools, which redis-server pulls in)", err)
	}
	c = &Cluster{}
	stop = func() {
		for _, s := range c.Nodes {
			s.close()
		}
	}
	for range primaries * (1 + replicasEach) {
		s, err := start("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000")
		if err != nil {
			stop()
			return nil, nil, err
		}
		c.Nodes = append(c.Nodes, s)
	}
	args := append(append([]string{"--cluster", "create"}, c.Addrs()...), "--cluster-replicas", strconv.Itoa(replicasEach), "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		stop()
		return nil, nil, fmt.Errorf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, s := range c.Nodes {
		if err := awaitNode(s, deadline, func(replication string, slots []redis.ClusterSlot) bool {
			return (strings.Contains(replication, "master_link_status:up") ||
				strings.Contains(replication, "connected_slaves:"+strconv.Itoa(replicasEach))) &&
				listsReplicas(slots, replicasEach)
		}); err != nil {
			stop()
			return nil, nil, err
		}
	}
	return c, stop, nil
}

// awaitNode waits until node reports the cluster ok and synced accepts its
// INFO replication and CLUSTER SLOTS, or deadline passes.
func awaitNode(node *Server, deadline time.Time, synced func(replication string, slots []redis.ClusterSlot) bool) error {
	c := redis.NewClient(&redis.Options{Addr: node.addr})
	defer c.Close()
	for {
		info, _ := c.ClusterInfo(context.Background()).Result()
		replication, _ := c.Info(context.Background(), "replication").Result()
		slots, _ := c.ClusterSlots(context.Background()).Result()
		if strings.Contains(info, "cluster_state:ok") && synced(replication, slots) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redistest: cluster node %s never became ok and in sync:\n%s\n%s\n%v", node.addr, info, replication, slots)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// listsReplicas reports whether slots, a node's CLUSTER SLOTS, name n
// replicas for every range. A node leaves out a replica until gossip told
// it that the replica has synced.
func listsReplicas(slots []redis.ClusterSlot, n int) bool {
	for _, s := range slots {
		if len(s.Nodes) != 1+n {
			return false
		}
	}
	return len(slots) > 0
}

// Addrs are the nodes' addresses.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.Nodes))
	for i, s := range c.Nodes {
		addrs[i] = s.addr
	}
	return addrs
}

// Shard returns the primary that serves slot, as the first node that
// answers CLUSTER SLOTS says, and its first replica (nil if none).
func (c *Cluster) Shard(slot int) (primary, replica *Server, err error) {
	slots, err := c.slots()
	if err != nil {
		return nil, nil, err
	}
	r, ok := serving(slots, slot)
	if !ok {
		return nil, nil, fmt.Errorf("redistest: no node serves slot %d", slot)
	}
	if len(r.Nodes) > 1 {
		replica = c.node(r.Nodes[1].Addr)
	}
	return c.node(r.Nodes[0].Addr), replica, nil
}

// serving returns the range of slots that holds slot.
func serving(slots []redis.ClusterSlot, slot int) (redis.ClusterSlot, bool) {
	i := slices.IndexFunc(slots, func(r redis.ClusterSlot) bool { return r.Start <= slot && slot <= r.End })
	if i < 0 {
		return redis.ClusterSlot{}, false
	}
	return slots[i], true
}

// Primaries are the addresses of the primaries that serve slots.
func (c *Cluster) Primaries() ([]string, error) {
	slots, err := c.slots()
	if err != nil {
		return nil, err
	}
	var addrs []string
	for _, s := range slots {
		if !slices.Contains(addrs, s.Nodes[0].Addr) {
			addrs = append(addrs, s.Nodes[0].Addr)
		}
	}
	slices.Sort(addrs)
	return addrs, nil
}

// slots is CLUSTER SLOTS from the first node that answers it.
func (c *Cluster) slots() ([]redis.ClusterSlot, error) {
	var errs []error
	for _, s := range c.Nodes {
		if s.proc == nil {
			continue
		}
		slots, err := s.clusterSlots()
		if err == nil {
			return slots, nil
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("redistest: CLUSTER SLOTS: %w", errors.Join(errs...))
}

func (s *Server) clusterSlots() ([]redis.ClusterSlot, error) {
	client := redis.NewClient(&redis.Options{Addr: s.addr, MaxRetries: -1})
	defer client.Close()
	return client.ClusterSlots(context.Background()).Result()
}

func (c *Cluster) node(addr string) *Server {
	for _, s := range c.Nodes {
		if s.addr == addr {
			return s
		}
	}
	return nil
}

// AwaitFailover waits, at most timeout, until replica, the replica of a
// failed primary, serves slot as a primary by its own account and by
// every other live node's.
func (c *Cluster) AwaitFailover(slot int, replica *Server, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if replica.Role() == "master" && c.agree(slot, replica.addr) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redistest: %s did not take slot %d over within %v\n%s", replica.addr, slot, timeout, replica.logTail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// agree reports whether every live node's CLUSTER SLOTS names primary for
// slot.
func (c *Cluster) agree(slot int, primary string) bool {
	for _, s := range c.Nodes {
		if s.proc == nil {
			continue
		}
		slots, err := s.clusterSlots()
		if err != nil {
			return false
		}
		if r, ok := serving(slots, slot); !ok || r.Nodes[0].Addr != primary {
			return false
		}
	}
	return true
}

// Rejoin starts a crashed node again on its address, empty but with its
// cluster configuration (nodes.conf), as a restarted node comes back: the
// cluster has failed it over, so it turns into a replica of the node that
// took its slots. Rejoin waits, at most timeout, until it is in sync and
// every node reports the cluster ok.
func (c *Cluster) Rejoin(node *Server, timeout time.Duration) error {
	if err := node.Relaunch(); err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	for _, s := range c.Nodes {
		if err := awaitNode(s, deadline, func(replication string, slots []redis.ClusterSlot) bool {
			return (s != node || strings.Contains(replication, "master_link_status:up")) && listsReplicas(slots, 1)
		}); err != nil {
			return err
		}
	}
	return nil
}
