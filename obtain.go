package lockreg

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/redis/go-redis/v9"
)

// tryObtain makes one attempt to take the key and returns the hold it
// took, or nil and what it found: another owner holds the key. wait says
// that the caller will wait for the key, so that a failed attempt marks
// the registry (obtain.lua); marked, that an earlier attempt marked it,
// which a success withdraws. With WithWaitReplicas, a hold too few
// replicas acknowledged is released again and reported as
// ErrNotReplicated.
//
// An unmarked attempt on a key this registry has not seen contended is a
// plain SET NX PX, the least Redis can do to take a key; only if that
// finds the key taken does obtain.lua follow, which marks this registry as
// waiting, or finds the key its own already.
func (l *Lock) tryObtain(ctx context.Context, wait, marked bool) (h *Hold, found obtainReply, err error) {
	r := l.r
	r.attempting(ctx, l.key)
	sent := time.Now()
	switch {
	case r.cfg.waitReplicas > 0:
		found, err = l.obtainReplicated(ctx, wait, marked)
	case l.plainSetFirst(marked):
		if found, _, err = l.setIfFree(ctx, true); !found.held && err == nil {
			found, err = l.obtainScripted(ctx, wait, marked)
		}
	default:
		found, err = l.obtainScripted(ctx, wait, marked)
	}
	if !found.held {
		r.stats.failed.Add(1)
		if err == nil {
			r.contention.saw(l.key)
		}
		return nil, found, err
	}
	return l.took(sent), found, nil
}

// plainSetFirst says whether an attempt starts with a plain SET: unmarked,
// on a key this registry has not seen contended, without WithWaitReplicas.
func (l *Lock) plainSetFirst(marked bool) bool {
	return l.r.cfg.waitReplicas == 0 && !marked && !l.r.contention.looksContended(l.key)
}

// took returns the hold of an attempt, sent at sent, that took the key.
func (l *Lock) took(sent time.Time) *Hold {
	h := newHold(l, 0, sent, l.r.cfg.expireAfter)
	if h.leaseOver() {
		// The reply came a lease or more after the call was sent (Redis or
		// this process stalled): the key may have expired and passed on.
		h.lose(LossExpired)
	}
	return h
}

// setIfFree sets the key to the client id with the lease if no one holds
// it. Unless queue is set, the SET goes out only if it need not queue
// behind other calls (see batcher.send); wentOut says whether it did.
func (l *Lock) setIfFree(ctx context.Context, queue bool) (found obtainReply, wentOut bool, err error) {
	r := l.r
	cmd, wentOut := r.calls.send(ctx, queue, nil, nil, r.args.setIfFreeArgs(l.keys.lock)...)
	if !wentOut {
		return obtainReply{}, false, nil
	}
	r.called(OpAcquire, 1)
	switch err := cmd.Err(); {
	case err == nil:
		return obtainReply{held: true}, true, nil
	case errors.Is(err, redis.Nil):
		return obtainReply{}, true, nil
	default:
		return obtainReply{}, true, fmt.Errorf("%w: obtain %q: %w", ErrRedis, l.key, err)
	}
}

// obtainScripted runs obtain.lua once.
func (l *Lock) obtainScripted(ctx context.Context, wait, marked bool) (obtainReply, error) {
	l.r.called(OpAcquire, 1)
	n, err := l.runScript(ctx, obtainScript, l.keys.script, l.r.args.obtainArgs(wait, marked)...).Int64()
	if err != nil {
		return obtainReply{}, fmt.Errorf("%w: obtain %q: %w", ErrRedis, l.key, err)
	}
	return parseObtainReply(n), nil
}

// obtainReplicated sends obtain.lua and WAIT in one pipeline, on one
// connection to the key's primary, as WAIT counts the acknowledgements of
// that connection's writes.
func (l *Lock) obtainReplicated(ctx context.Context, wait, marked bool) (obtainReply, error) {
	r := l.r
	node := redis.Cmdable(r.client)
	cluster, _ := r.client.(*redis.ClusterClient)
	if cluster != nil {
		primary, err := cluster.MasterForKey(ctx, l.keys.lock)
		if err != nil {
			return obtainReply{}, fmt.Errorf("%w: obtain %q: %w", ErrRedis, l.key, err)
		}
		node = primary
	}
	r.called(OpAcquire, 1)
	var obtained, acks *redis.Cmd
	run := func() {
		// Each command's own error is read below; Pipelined's is the first.
		_, _ = node.Pipelined(ctx, func(p redis.Pipeliner) error {
			obtained = obtainScript.EvalSha(ctx, p, l.keys.script, r.args.obtainArgs(wait, marked)...)
			acks = p.Do(ctx, "WAIT", r.cfg.waitReplicas, r.cfg.waitTimeout.Milliseconds())
			return nil
		})
	}
	run()
	if redis.HasErrorPrefix(obtained.Err(), "NOSCRIPT") {
		if err := obtainScript.Load(ctx, node).Err(); err != nil {
			return obtainReply{}, fmt.Errorf("%w: obtain %q: %w", ErrRedis, l.key, err)
		}
		run()
	}
	n, err := obtained.Int64()
	if err != nil {
		if cluster != nil && staleSlotMap(err) {
			// A pipeline on a node client neither follows a redirection nor
			// tells the cluster client, whose slot map would stay stale, and
			// every attempt fail, until its next reload (up to a minute):
			// reload it now, for the next attempt.
			cluster.ReloadState(ctx)
		}
		return obtainReply{}, fmt.Errorf("%w: obtain %q: %w", ErrRedis, l.key, err)
	}
	found := parseObtainReply(n)
	acked, err := acks.Int64()
	if !found.held || (err == nil && acked >= int64(r.cfg.waitReplicas)) {
		return found, nil
	}
	// Too few replicas have the key: a failover now could lose it. Give it
	// back rather than hold a lock that might not survive.
	if _, err := l.releaseRedis(ctx, 0, false, ""); err != nil {
		return obtainReply{}, err
	}
	return obtainReply{}, errors.Join(fmt.Errorf("%w: %d of %d replicas acknowledged %q within %v", ErrNotReplicated, acked, r.cfg.waitReplicas, l.key, r.cfg.waitTimeout), err)
}

// staleSlotMap reports whether a call to the node a cluster client named
// for a key failed in a way that says the client's slot map may be stale:
// the slot moved (MOVED), is moving (ASK, TRYAGAIN), or the node does not
// answer (a failover took its place).
func staleSlotMap(err error) bool {
	var reply redis.Error
	return redis.HasErrorPrefix(err, "MOVED") || slotMigrating(err) || !errors.As(err, &reply)
}

// mayHaveRun reports whether a failed call may have run its script after
// all: a timeout, a cancelled context or a broken connection can come after
// Redis ran it. An error reply from Redis, or no connection to be had,
// means it did not.
func mayHaveRun(err error) bool {
	if err == nil || errors.Is(err, ErrNotReplicated) {
		return false
	}
	var reply redis.Error
	var netErr *net.OpError
	return !errors.As(err, &reply) && !errors.Is(err, redis.ErrPoolTimeout) &&
		!(errors.As(err, &netErr) && netErr.Op == "dial")
}
