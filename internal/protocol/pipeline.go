package protocol

import (
	"context"
	"errors"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Run makes one call on client and sets its Cmd. A script call is sent by
// EVALSHA, and again by EVAL if Redis lost the script (a restart).
func Run(ctx context.Context, client redis.UniversalClient, c *Call) {
	if c.Script == nil {
		c.Cmd = client.Do(ctx, c.Args...)
		return
	}
	// EVALSHA's arguments in one slice, with the script's SHA1 boxed
	// already: go-redis's Script.Run makes three more allocations per call,
	// which an uncontended cycle felt (#32's S1).
	args := make([]any, 0, 3+len(c.Keys)+len(c.Args))
	args = append(args, "evalsha", c.Script.hash, len(c.Keys))
	for _, key := range c.Keys {
		args = append(args, key)
	}
	c.Cmd = redis.NewCmd(ctx, append(args, c.Args...)...)
	c.Cmd.SetFirstKeyPos(3) // for Redis Cluster's routing
	// redis.HasErrorPrefix allocates, even for a nil error.
	if err := client.Process(ctx, c.Cmd); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		c.Cmd = c.Script.Eval(ctx, client, c.Keys, c.Args...)
	}
}

// Failed is the reply of a call that was not made, for err.
func Failed(ctx context.Context, err error) *redis.Cmd {
	cmd := redis.NewCmd(ctx)
	cmd.SetErr(err)
	return cmd
}

// Pipeliner is what RunPipeline sends calls through: a client, or one of
// its connections (redis.Conn).
type Pipeliner interface {
	Pipelined(ctx context.Context, fn func(redis.Pipeliner) error) ([]redis.Cmder, error)
}

// RunPipeline sends calls as one pipeline, one per node on Redis Cluster,
// and sets each call's Cmd. If Redis lost the scripts (a restart), the
// script calls it refused for that go again by EVAL, which loads them.
func RunPipeline(ctx context.Context, client Pipeliner, calls []*Call) {
	if cluster, ok := client.(*redis.ClusterClient); ok {
		runClusterPipeline(ctx, cluster, calls)
		return
	}
	runNodePipeline(ctx, client, calls)
}

func runNodePipeline(ctx context.Context, client Pipeliner, calls []*Call) {
	send(ctx, client, calls, (*redis.Script).EvalSha)
	var again []*Call
	for _, c := range calls {
		if redis.HasErrorPrefix(c.Cmd.Err(), "NOSCRIPT") {
			again = append(again, c)
		}
	}
	if len(again) > 0 {
		send(ctx, client, again, (*redis.Script).Eval)
	}
}

func send(ctx context.Context, client Pipeliner, calls []*Call, eval func(*redis.Script, context.Context, redis.Scripter, []string, ...any) *redis.Cmd) {
	// Each call's own error is read from its Cmd.
	_, _ = client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, c := range calls {
			if c.Script == nil {
				c.Cmd = p.Do(ctx, c.Args...)
			} else {
				c.Cmd = eval(c.Script.Script, ctx, p, c.Keys, c.Args...)
			}
		}
		return nil
	})
}

// MaxInFlight is how many calls or pipelines a registry keeps on the wire
// at once before it queues calls: below it a call goes out alone, with no
// added latency; above it the queue leaves as one pipeline when a call in
// flight returns. Redis runs one command at a time, so more in flight buys
// little, while each write and read costs both sides a system call:
// BenchmarkDistinctKeys measured 1, 2, 4, 8 and 16 on two cores, and 4 was
// the fastest. A Cluster pipeline's redirected calls go again at most that
// many at a time too.
const MaxInFlight = 4

// runClusterPipeline splits calls by the primary of their slot and sends
// each group as one pipeline on that node's own client. It does not use
// ClusterClient's pipeline: when the first call of a node's batch gets a
// retryable error (TRYAGAIN while a slot moves), go-redis v9 sends the
// node's whole batch again, so calls that ran run twice (a release then
// finds its key gone and reports a false loss), and a call it redirected
// by ASK goes to two nodes at once (a data race in go-redis). The calls a
// node refused without running them (see Redirected) go again one by one
// through the ClusterClient, which follows a single command's
// redirections.
func runClusterPipeline(ctx context.Context, cluster *redis.ClusterClient, calls []*Call) {
	groups := make(map[*redis.Client][]*Call)
	var alone []*Call
	for _, c := range calls {
		node, err := cluster.MasterForKey(ctx, c.firstKey())
		if err != nil {
			alone = append(alone, c)
			continue
		}
		groups[node] = append(groups[node], c)
	}
	var wg sync.WaitGroup
	for node, group := range groups {
		wg.Go(func() { runNodePipeline(ctx, node, group) })
	}
	wg.Wait()
	stale := false
	for _, group := range groups {
		for _, c := range group {
			err := c.Cmd.Err()
			stale = stale || (err != nil && StaleSlotMap(err))
			if Redirected(err) {
				alone = append(alone, c)
			}
		}
	}
	if stale && ctx.Err() == nil {
		// A node's pipeline does not tell the cluster client that its slot
		// map is stale, as the client's own calls do.
		cluster.ReloadState(ctx)
	}
	// At most MaxInFlight at a time: after a failover a node's whole batch
	// may come back MOVED.
	slots := make(chan struct{}, MaxInFlight)
	for _, c := range alone {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			runRedirected(ctx, cluster, c)
		})
	}
	wg.Wait()
}

// runRedirected sends a call that a node refused again through the
// cluster client, which follows MOVED and ASK. A plain call (a read) goes
// in a pipeline with a TIME: go-redis sends a lone read to a replica when
// the client reads from replicas (ReadOnly), and a replica may lag, or not
// know that its slot is migrating, while the reads sent here judge holds
// (a grant's token, a hold's owner). A pipeline with a command that is no
// read goes to primaries.
func runRedirected(ctx context.Context, cluster *redis.ClusterClient, c *Call) {
	if c.Script != nil || !cluster.Options().ReadOnly {
		Run(ctx, cluster, c)
		return
	}
	c.Cmd = redis.NewCmd(ctx, c.Args...)
	_, _ = cluster.Pipelined(ctx, func(p redis.Pipeliner) error {
		_ = p.Process(ctx, c.Cmd)
		p.Time(ctx)
		return nil
	})
}

// Redirected reports whether a Redis Cluster node refused a call without
// running it, so that it may be sent again safely: the slot lives, or is
// moving, elsewhere (MOVED, ASK, TRYAGAIN), or the node cannot serve it
// now (CLUSTERDOWN, a primary turned replica, LOADING).
func Redirected(err error) bool {
	for _, prefix := range []string{"MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN", "READONLY", "LOADING"} {
		if redis.HasErrorPrefix(err, prefix) {
			return true
		}
	}
	return false
}

// SlotMigrating reports whether Redis Cluster refused a call because a
// slot of its keys is moving between nodes: TRYAGAIN when some keys have
// moved or do not exist, or ASK once go-redis ran out of redirections.
func SlotMigrating(err error) bool {
	return err != nil && (redis.HasErrorPrefix(err, "TRYAGAIN") || redis.HasErrorPrefix(err, "ASK"))
}

// StaleSlotMap reports whether a call to the node a cluster client named
// for a key failed in a way that says the client's slot map may be stale:
// the slot moved (MOVED), is moving (ASK, TRYAGAIN), or the node does not
// answer (a failover took its place).
func StaleSlotMap(err error) bool {
	var reply redis.Error
	return redis.HasErrorPrefix(err, "MOVED") || SlotMigrating(err) || !errors.As(err, &reply)
}
