package lockreg

import (
	"context"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
)

// What a tracker does while its server does not answer, or has moved.
//
// On Redis Cluster a tracker serves one primary's address. When that
// primary stops answering, its slots may pass to a replica by a failover:
// the holds whose keys it served then live on another node, where nothing
// read them, so no change there would be told (and a key the failover
// lost would not be found) until their renewals; the crashed primary's
// tracker, which a new connection would have check them, cannot connect.
// So while a tracker's server is down, the holds it served are watched,
// at a pause that doubles up to rehomePause: once the cluster client
// names another primary for a hold's key, the hold is checked, and armed,
// on that node's tracker, as after a restart. The watch ends when its
// holds are all moved or ended, or the tracker's server answers again
// (its new connection then checks every hold).
//
// On Sentinel the client may move while the tracker's server still
// answers: see reachedByClient.

// rehomePause is the longest pause of the watch: a failover is told to a
// holder at most about that long after the cluster agreed on it.
const rehomePause = time.Second

// serverDown is called by run when the target's subscription broke or
// could not be made: on Cluster it starts the watch of t's holds, unless
// it runs already.
func (t *tracker) serverDown() {
	r := t.r
	t.up.Store(false)
	cluster, ok := r.client.(*redis.ClusterClient)
	if !ok || !t.rehoming.CompareAndSwap(false, true) {
		return
	}
	// The slot map still names t's server for its keys: a failover takes
	// longer than the breaking of a connection.
	var holds []*Hold
	r.forEachHold(func(h *Hold) {
		if !h.isLost() && r.nodeOf(r.life.stopCtx, h.redisKey()) == t.addr {
			holds = append(holds, h)
		}
	})
	// Without holds too: the watch ends t if its server left the Cluster.
	if !r.goBackground(func(ctx context.Context) { t.rehome(ctx, cluster, holds) }) {
		t.rehoming.Store(false)
	}
}

// rehome moves holds, which t's server served, to the trackers of the
// nodes that serve their keys once the cluster client names others.
func (t *tracker) rehome(ctx context.Context, cluster *redis.ClusterClient, holds []*Hold) {
	defer t.rehoming.Store(false)
	r := t.r
	pause := time.NewTimer(0)
	defer pause.Stop()
	for wait := min(r.cfg.retryInterval, resubscribePause); len(holds) > 0; wait = min(2*wait, rehomePause) {
		select {
		case <-pause.C:
		case <-ctx.Done():
			return
		}
		if t.up.Load() {
			return // the server answers again: its new connection checks every hold
		}
		cluster.ReloadState(ctx) // seen by a later turn: the reload is lazy
		holds = slices.DeleteFunc(holds, func(h *Hold) bool {
			h = currentOf(h)
			if h.Err() != nil {
				return true // ended
			}
			node, err := cluster.MasterForKey(ctx, h.redisKey())
			if err != nil || node.Options().Addr == t.addr {
				return false // not moved yet
			}
			if nt := r.trackerFor(h.redisKey()); nt != nil {
				// A change the failover made counts as unchecked until the
				// read: no local hand-off meanwhile.
				h.local.unchecked.Add(1)
				nt.enqueue(armRequest{h: h, cause: LossRestart, invalidated: true})
			} else {
				r.verify(h, LossRestart)
			}
			return true
		})
		pause.Reset(wait)
	}
	// run calls serverDown again at each failed subscription, which looks
	// again, as a failover takes longer than a broken connection.
	if !t.up.Load() && !servesSlots(ctx, cluster, t.addr) {
		r.retireTracker(t)
	}
}

// servesSlots reports whether the Cluster names addr as a primary, or
// cannot tell.
func servesSlots(ctx context.Context, cluster *redis.ClusterClient, addr string) bool {
	slots, err := cluster.ClusterSlots(ctx).Result()
	if err != nil {
		return true
	}
	for _, s := range slots {
		if len(s.Nodes) > 0 && s.Nodes[0].Addr == addr {
			return true
		}
	}
	return false
}

// retireTracker ends t, whose server left the Cluster and holds nothing of
// the registry's: left, it would dial that server, and keep its goroutines
// and clients, until Close. A node that serves slots again later gets a
// new tracker (trackerFor). Holds queued on t meanwhile are armed anew
// where their keys are.
func (r *Registry) retireTracker(t *tracker) {
	r.tracking.mu.Lock()
	if r.tracking.trackers[t.addr] != t {
		r.tracking.mu.Unlock()
		return
	}
	retire := r.tracking.retire[t.addr]
	delete(r.tracking.trackers, t.addr)
	delete(r.tracking.retire, t.addr)
	r.tracking.mu.Unlock()
	retire()
	t.stop()
	t.mu.Lock()
	queued := t.queue
	t.queue = nil
	t.mu.Unlock()
	if len(queued) == 0 {
		return
	}
	r.rearm(queued)
	for _, req := range queued {
		if req.invalidated {
			req.h.local.unchecked.Add(-1) // as armLoop does once it read them
		}
	}
}

// moveTarget closes the target's subscription, for run to make a new one,
// which dials the server anew: a tracking connection found no target of
// its id where it connected (TargetGone). The two connections dial on their
// own and may reach different servers, as after a failover, when the
// target resubscribed on the old primary (back as a replica, say) while
// the tracking connection reached the new one; left there, the target would
// never be found, and holders would hear of changes at their renewals.
func (t *tracker) moveTarget() {
	t.subMu.Lock()
	defer t.subMu.Unlock()
	if t.stopped || t.pubsub == nil {
		return
	}
	t.moving.Store(true)
	_ = t.pubsub.Close()
}

// reachedByClient reports whether t's target is on the server the
// registry's client reaches, or it cannot tell. A Sentinel failover moves
// the client to the new primary at once, while t's connections stay on
// the old one, which the Sentinels demote (and which then closes them)
// only once they reach it again: meanwhile t would renew its holds there,
// in a server nobody else uses, and their keys would lapse on the new
// primary, free for any other registry to take. The target hears the
// probe on its own server alone (see protocol.Peer.TargetProbe). Only a
// Sentinel client (go-redis names its address "FailoverClient") is asked,
// at the cost of a round trip: other clients' servers do not move under
// their connections.
func (t *tracker) reachedByClient(ctx context.Context) bool {
	c, ok := t.sentinelClient()
	return !ok || t.targetHears(ctx, c)
}

// sentinelClient returns the registry's client if it is a Sentinel client.
func (t *tracker) sentinelClient() (*redis.Client, bool) {
	c, ok := t.r.client.(*redis.Client)
	return c, ok && c.Options().Addr == failoverClientAddr
}

// targetHears reports whether t's target hears the probe sent on c, a
// client or a connection, or it cannot tell.
func (t *tracker) targetHears(ctx context.Context, c interface {
	Do(context.Context, ...any) *redis.Cmd
}) bool {
	heard, err := c.Do(ctx, t.r.peer.TargetProbe()...).Int64()
	return err != nil || heard > 0
}

// readAstray reports whether conn, a tracking connection of t that found
// a key not ours, may have read it where the client is no more: t's
// target is not on the client's server (strayed, which moves it), or,
// on Sentinel, conn is not on its target's server, as conn was made
// before the target moved and is replaced only after this read.
func (t *tracker) readAstray(ctx context.Context, conn *redis.Conn) bool {
	if t.strayed(ctx) {
		return true
	}
	_, sentinel := t.sentinelClient()
	return sentinel && !t.targetHears(ctx, conn)
}

// strayed reports whether t's server is not the one the registry's client
// reaches (reachedByClient), and then moves t's target, for run to make
// a new one, and a new tracking connection, where the client is.
func (t *tracker) strayed(ctx context.Context) bool {
	if t.reachedByClient(ctx) {
		return false
	}
	t.moveTarget()
	return true
}

// checkConnection pings the tracking connection, and reports whether it
// answered. On Sentinel it also has t follow the client if it moved
// (strayed): the changes there would go untold until then, as the
// renewals and armings that check too may be far off.
func (t *tracker) checkConnection(ctx context.Context, conn *redis.Conn) bool {
	if conn.Ping(ctx).Err() != nil {
		return false
	}
	t.strayed(ctx)
	return true
}

// failoverClientAddr is the address go-redis gives a Sentinel client
// (redis.NewFailoverClient).
const failoverClientAddr = "FailoverClient"

// checkUntracked checks at once, on the registry's client, the holds of
// reqs that a change may have struck (invalidated: a restart, a flush),
// while their tracker has no connection to read them on. That
// connection may come seconds after Redis answers again (go-redis fails
// its dials for a while after failed ones, and armLoop's retries back
// off), while the subscription that asked for the check (the
// registry's, or the target's) is back already: left for the connection,
// a key the restart lost would be told that much later. The change stays
// unchecked until the read, so that no local hand-off passes it on.
func (r *Registry) checkUntracked(reqs []armRequest) {
	byCause := make(map[LossCause][]*Hold)
	for _, req := range reqs {
		if req.invalidated {
			req.h.local.unchecked.Add(1)
			byCause[req.cause] = append(byCause[req.cause], req.h)
		}
	}
	if len(byCause) == 0 {
		return
	}
	checked := func() {
		for _, holds := range byCause {
			for _, h := range holds {
				h.local.unchecked.Add(-1)
			}
		}
	}
	if !r.goBackground(func(ctx context.Context) {
		defer checked()
		for cause, holds := range byCause {
			r.checkHolds(ctx, holds, cause)
		}
	}) {
		checked()
	}
}
