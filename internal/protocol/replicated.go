package protocol

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// ObtainReplicated sends obtain (an Obtain call) and WAIT replicas
// timeout in one pipeline, on one connection to the key's primary, as WAIT
// counts the acknowledgements of that connection's writes. It returns
// obtain.lua's reply and how many replicas acknowledged it: 0 if WAIT
// failed, with waitErr. While the key's slot migrates, obtain goes on the
// lock's key alone, to the node that has the key.
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
	asking := false
	run := func(eval func(*redis.Script, context.Context, redis.Scripter, []string, ...any) *redis.Cmd) {
		// Each command's own error is read below; Pipelined's is the first.
		_, _ = node.Pipelined(ctx, func(p redis.Pipeliner) error {
			if asking {
				p.Do(ctx, "asking")
			}
			obtain.Cmd = eval(obtain.Script.Script, ctx, p, obtain.Keys, obtain.Args...)
			acks = p.Do(ctx, "WAIT", replicas, timeout.Milliseconds())
			return nil
		})
	}
	send := func() {
		run((*redis.Script).EvalSha)
		if redis.HasErrorPrefix(obtain.Cmd.Err(), "NOSCRIPT") {
			// EVAL loads the script, as Run does: the ACL needs no SCRIPT LOAD.
			run((*redis.Script).Eval)
		}
	}
	send()
	if cluster != nil && SlotMigrating(obtain.Cmd.Err()) {
		// Redis refuses the four keys from the first step of a slot's
		// migration to the last: obtain.lua runs on the lock's key alone
		// then, as Run's callers do (Call.OnLockKeyOnly), on the node that
		// has it. A node pipeline follows no ASK: a key not on the source
		// is the target's, asked for with ASKING on WAIT's connection.
		obtain = obtain.OnLockKeyOnly()
		send()
		if target := askedNode(ctx, cluster, obtain.Cmd.Err()); target != nil {
			node, asking = target, true
			send()
		}
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

// askedNode is the primary an ASK redirection names, or nil if err is
// none, or names no primary the cluster client knows.
func askedNode(ctx context.Context, cluster *redis.ClusterClient, err error) *redis.Client {
	var reply redis.Error
	if !errors.As(err, &reply) {
		return nil
	}
	fields := strings.Fields(reply.Error())
	if len(fields) != 3 || fields[0] != "ASK" {
		return nil
	}
	var mu sync.Mutex
	var found *redis.Client
	_ = cluster.ForEachMaster(ctx, func(_ context.Context, primary *redis.Client) error {
		if primary.Options().Addr == fields[2] {
			mu.Lock()
			found = primary
			mu.Unlock()
		}
		return nil
	})
	return found
}
