package lockreg

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
)

// maxInFlight is how many script calls or pipelines a registry keeps on the
// wire at once before it queues calls. Below it a call goes out alone, with
// no added latency; above it the queue leaves as one pipeline when a call
// in flight returns. Redis runs one command at a time, so more in flight
// buys little, while each write and read costs both sides a system call:
// BenchmarkDistinctKeys measured 1, 2, 4, 8 and 16 on two cores, and 4 was
// the fastest.
const maxInFlight = 4

// batcher sends the acquisition and release calls of concurrent
// goroutines, up to maxInFlight at a time, coalescing the rest into
// pipelines (auto-pipelining): one write and one read for many calls, on
// the client and on the server.
type batcher struct {
	client redis.UniversalClient

	mu       sync.Mutex // guards inFlight and queue
	inFlight int
	queue    []*call
}

// call is one call to Redis, alone or in a pipeline: a script with its
// keys and arguments, or, with no script, the plain command args. A
// queued call's done is closed when cmd has its reply or when the call
// must lead the queue (batch is then set).
type call struct {
	script *redis.Script
	keys   []string
	args   []any
	cmd    *redis.Cmd
	done   chan struct{}
	batch  []*call
}

// run makes a call, alone or in a pipeline with other goroutines' calls,
// and returns its reply: script on keys with args, or, if script is nil,
// the plain command args. As with Script.Run, a NOSCRIPT reply is
// answered by sending the script itself.
func (b *batcher) run(ctx context.Context, script *redis.Script, keys []string, args ...any) *redis.Cmd {
	cmd, _ := b.send(ctx, true, script, keys, args...)
	return cmd
}

// send is run, but unless queue is set, it sends the call only if it can
// go out at once, alone: a queued call waits for the calls before it and
// then for its pipeline, whose context ends with none of its callers'.
// wentOut says whether the call was made.
func (b *batcher) send(ctx context.Context, queue bool, script *redis.Script, keys []string, args ...any) (cmd *redis.Cmd, wentOut bool) {
	b.mu.Lock()
	if b.inFlight < maxInFlight {
		b.inFlight++
		b.mu.Unlock()
		if script == nil {
			cmd = b.client.Do(ctx, args...)
		} else {
			cmd = script.Run(ctx, b.client, keys, args...)
		}
		b.next()
		return cmd, true
	}
	if !queue {
		b.mu.Unlock()
		return nil, false
	}
	c := &call{script: script, keys: keys, args: args, done: make(chan struct{})}
	b.queue = append(b.queue, c)
	b.mu.Unlock()
	<-c.done
	if c.batch != nil {
		// The calls were made with their callers' contexts; one caller's
		// cancellation must not fail the others.
		b.pipeline(context.WithoutCancel(ctx), c.batch)
		b.next()
	}
	return c.cmd, true
}

// next hands the slot of a call that returned to the queued calls, whose
// first caller sends them all as one pipeline, or frees it.
func (b *batcher) next() {
	b.mu.Lock()
	if len(b.queue) == 0 {
		b.inFlight--
		b.mu.Unlock()
		return
	}
	batch := b.queue
	b.queue = nil
	b.mu.Unlock()
	batch[0].batch = batch
	close(batch[0].done)
}

// pipeline sends batch as one pipeline and wakes every caller but the
// first, which is the one sending.
func (b *batcher) pipeline(ctx context.Context, batch []*call) {
	runPipeline(ctx, b.client, batch)
	for _, c := range batch[1:] {
		close(c.done)
	}
}

// runPipeline sends calls as one pipeline, one per node on Redis Cluster,
// and sets each call's cmd. If Redis lost the scripts (a restart), the
// script calls it refused for that go again by EVAL, which loads them.
func runPipeline(ctx context.Context, client redis.UniversalClient, calls []*call) {
	if cluster, ok := client.(*redis.ClusterClient); ok {
		runClusterPipeline(ctx, cluster, calls)
		return
	}
	runNodePipeline(ctx, client, calls)
}

func runNodePipeline(ctx context.Context, client redis.UniversalClient, calls []*call) {
	send(ctx, client, calls, (*redis.Script).EvalSha)
	var again []*call
	for _, c := range calls {
		if redis.HasErrorPrefix(c.cmd.Err(), "NOSCRIPT") {
			again = append(again, c)
		}
	}
	if len(again) > 0 {
		send(ctx, client, again, (*redis.Script).Eval)
	}
}

func send(ctx context.Context, client redis.UniversalClient, calls []*call, eval func(*redis.Script, context.Context, redis.Scripter, []string, ...any) *redis.Cmd) {
	// Each call's own error is read from its cmd.
	_, _ = client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, c := range calls {
			if c.script == nil {
				c.cmd = p.Do(ctx, c.args...)
			} else {
				c.cmd = eval(c.script, ctx, p, c.keys, c.args...)
			}
		}
		return nil
	})
}

// runClusterPipeline splits calls by the primary of their slot and sends
// each group as one pipeline on that node's own client. It does not use
// ClusterClient's pipeline: when the first call of a node's batch gets a
// retryable error (TRYAGAIN while a slot moves), go-redis v9 sends the
// node's whole batch again, so calls that ran run twice (a release then
// finds its key gone and reports a false loss), and a call it redirected
// by ASK goes to two nodes at once (a data race in go-redis). The calls a
// node refused without running them (see redirected) go again one by one
// through the ClusterClient, which follows a single command's redirections.
func runClusterPipeline(ctx context.Context, cluster *redis.ClusterClient, calls []*call) {
	groups := make(map[*redis.Client][]*call)
	var alone []*call
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
		wg.Add(1)
		go func() {
			defer wg.Done()
			runNodePipeline(ctx, node, group)
		}()
	}
	wg.Wait()
	stale := false
	for _, group := range groups {
		for _, c := range group {
			err := c.cmd.Err()
			stale = stale || (err != nil && staleSlotMap(err))
			if redirected(err) {
				alone = append(alone, c)
			}
		}
	}
	if stale && ctx.Err() == nil {
		// A node's pipeline does not tell the cluster client that its slot
		// map is stale, as the client's own calls do.
		cluster.ReloadState(ctx)
	}
	// At most maxInFlight at a time: after a failover a node's whole batch
	// may come back MOVED.
	slots := make(chan struct{}, maxInFlight)
	for _, c := range alone {
		slots <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			if c.script == nil {
				c.cmd = cluster.Do(ctx, c.args...)
			} else {
				c.cmd = c.script.Run(ctx, cluster, c.keys, c.args...)
			}
		}()
	}
	wg.Wait()
}

// firstKey is the key that places c on a Redis Cluster node: a script's
// first key, or a plain command's first argument after its name. All the
// keys of one call share a slot.
func (c *call) firstKey() string {
	if c.script != nil {
		if len(c.keys) > 0 {
			return c.keys[0]
		}
		return ""
	}
	if len(c.args) > 1 {
		if key, ok := c.args[1].(string); ok {
			return key
		}
	}
	return ""
}

// redirected reports whether a Redis Cluster node refused a call without
// running it, so that it may be sent again safely: the slot lives, or is
// moving, elsewhere (MOVED, ASK, TRYAGAIN), or the node cannot serve it
// now (CLUSTERDOWN, a primary turned replica, LOADING).
func redirected(err error) bool {
	for _, prefix := range []string{"MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN", "READONLY", "LOADING"} {
		if redis.HasErrorPrefix(err, prefix) {
			return true
		}
	}
	return false
}

// slotMigrating reports whether Redis Cluster refused a call because a
// slot of its keys is moving between nodes: TRYAGAIN when some keys have
// moved or do not exist, or ASK once go-redis ran out of redirections.
func slotMigrating(err error) bool {
	return err != nil && (redis.HasErrorPrefix(err, "TRYAGAIN") || redis.HasErrorPrefix(err, "ASK"))
}
