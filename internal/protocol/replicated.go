package protocol

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// ObtainReplicated sends obtain (an Obtain call) and WAIT replicas
// timeout in one pipeline, on one connection to the key's primary, as WAIT
// counts the acknowledgements of that connection's writes. It returns
// obtain.lua's reply and how many replicas acknowledged it: 0 if WAIT
// failed, with waitErr.
func ObtainReplicated(ctx context.Context, client redis.UniversalClient, obtain Call, replicas int, timeout time.Duration) (found ObtainReply, acked int64, waitErr, err error) {
	node := redis.Cmdable(client)
	cluster, _ := client.(*redis.ClusterClient)
	if cluster != nil {
		primary, err := cluster.MasterForKey(ctx, obtain.firstKey())
		if err != nil {
			return ObtainReply{}, 0, nil, err
		}
		node = primary
	}
	var acks *redis.Cmd
	run := func(eval func(*redis.Script, context.Context, redis.Scripter, []string, ...any) *redis.Cmd) {
		// Each command's own error is read below; Pipelined's is the first.
		_, _ = node.Pipelined(ctx, func(p redis.Pipeliner) error {
			obtain.Cmd = eval(obtain.Script.Script, ctx, p, obtain.Keys, obtain.Args...)
			acks = p.Do(ctx, "WAIT", replicas, timeout.Milliseconds())
			return nil
		})
	}
	run((*redis.Script).EvalSha)
	if redis.HasErrorPrefix(obtain.Cmd.Err(), "NOSCRIPT") {
		// EVAL loads the script, as Run does: the ACL needs no SCRIPT LOAD.
		run((*redis.Script).Eval)
	}
	if found, err = ReadObtain(obtain.Cmd); err != nil {
		if cluster != nil && StaleSlotMap(err) {
			// A pipeline on a node client neither follows a redirection nor
			// tells the cluster client, whose slot map would stay stale, and
			// every attempt fail, until its next reload (up to a minute):
			// reload it now, for the next attempt.
			cluster.ReloadState(ctx)
		}
		return ObtainReply{}, 0, nil, err
	}
	acked, waitErr = acks.Int64()
	return found, acked, waitErr, nil
}
