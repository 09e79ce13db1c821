package lockreg

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockreg/lockreg/internal/protocol"
)

// Where a held key is tracked (tracking.go), the watchdog renews it on
// the tracking connection of the key's server rather than on the
// registry's client, by renew.lua, which then reads the keys it renewed
// again:
//
//   - The connection's NOLOOP spares it the invalidation of its own
//     PEXPIRE, which from the registry's client costs Redis an
//     invalidation and the tracker a read to arm the key again.
//   - The PEXPIRE still ended the key's tracking, as any change does: the
//     script's read, in the same atomic step, tracks it again.
//
// This costs Redis less than renew.lua from the registry's client, and
// less than SET ... IFEQ and a GET per key on the tracking connection,
// even where the server has it (Valkey 8.1): S8's server CPU per renewed
// key, bench/RESULTS.md. Holds whose tracker has no connection, or whose
// key moved to another Cluster node, are renewed on the registry's client.

// trackedRenewalTurn is the most keys a turn of a tracker renews, so that
// the armings and verifications queued meanwhile wait for one turn, not a
// whole round.
const trackedRenewalTurn = 500

// trackedRenewalWait is how long, as a fraction of the lease, a round
// waits for a tracker's turns before it renews the rest on the
// registry's client: a sixth leaves the client half a renewal interval.
// A turn of a lease nearer its end (a grant's) waits less: timeLeft.
const trackedRenewalWait = 6

// trackedRenewal is a turn of renewal calls for a tracker's armLoop to
// run; sent tells the watchdog when they went on the wire, or zero if
// they did not run (no connection); abandoned, that the watchdog waits no
// more, so that armLoop need not run them.
type trackedRenewal struct {
	calls     []*protocol.Call
	sent      chan time.Time
	abandoned *atomic.Bool
}

// runOnConnection has armLoop run calls on the tracking connection, and
// returns when they were sent: zero if they did not run (no connection),
// or if they were not answered within wait, or stop ended first: the
// caller then renews on the registry's client, as armLoop may be stuck
// (a silent tracking connection waits out its ReadTimeout), and a lease
// must not wait on it. A turn may wait behind armLoop's other work, so
// its lease counts from when it went out, not from the call (extendLease).
func (t *tracker) runOnConnection(stop context.Context, calls []*protocol.Call, wait time.Duration) (sent time.Time) {
	turn := trackedRenewal{calls: calls, sent: make(chan time.Time, 1), abandoned: new(atomic.Bool)}
	t.mu.Lock()
	t.renewals = append(t.renewals, turn)
	t.mu.Unlock()
	t.wake()
	timeout := time.NewTimer(wait)
	defer timeout.Stop()
	select {
	case sent = <-turn.sent:
		return sent
	case <-timeout.C:
	case <-stop.Done():
	}
	turn.abandoned.Store(true)
	select {
	case sent = <-turn.sent: // answered meanwhile
		return sent
	default:
		return time.Time{} // armLoop writes calls no one reads any more
	}
}

// runRenewals is armLoop's part of runOnConnection: it runs renewals on
// conn, if there is one. It reports false if the connection broke.
func runRenewals(ctx context.Context, conn *redis.Conn, renewals []trackedRenewal) bool {
	intact := true
	for _, turn := range renewals {
		var sent time.Time
		if conn != nil && intact && !turn.abandoned.Load() {
			sent = time.Now()
			protocol.RunPipeline(ctx, conn, turn.calls)
			for _, c := range turn.calls {
				if err := c.Cmd.Err(); err != nil && !protocol.IsReply(err) {
					intact = false
				}
			}
		}
		turn.sent <- sent
	}
	return intact
}

// renewOnTrackers renews, where tracking is on, batches (one slot each)
// on the tracking connection of their server, and returns the batches
// left for the registry's client.
func (r *Registry) renewOnTrackers(ctx context.Context, batches [][]*Hold) (rest [][]*Hold) {
	var order []*tracker
	byTracker := make(map[*tracker][][]*Hold)
	for _, batch := range batches {
		var t *tracker
		if r.tracking.on.Load() {
			t = r.trackerFor(batch[0].redisKey())
		}
		if t == nil {
			rest = append(rest, batch)
			continue
		}
		if _, ok := byTracker[t]; !ok {
			order = append(order, t)
		}
		byTracker[t] = append(byTracker[t], batch)
	}
	for _, t := range order {
		if t.strayed(ctx) {
			rest = append(rest, byTracker[t]...)
			continue
		}
		// A round gives a tracker's turns a sixth of the lease in all: on a
		// network whose round trips are long against the turns' work, the
		// turns left then go in the client's pipeline, one round trip.
		deadline := time.Now().Add(r.cfg.expireAfter / trackedRenewalWait)
		for mine := byTracker[t]; len(mine) > 0; {
			// A turn is whole batches, at most trackedRenewalTurn keys.
			n, keys := 1, len(mine[0])
			for n < len(mine) && keys+len(mine[n]) <= trackedRenewalTurn {
				keys += len(mine[n])
				n++
			}
			// Nor may a turn wait past half of what is left of its shortest
			// lease (a grant's, which an extension renews, is far shorter
			// than a sixth of the registry's): the client must be in time.
			wait := min(time.Until(deadline), timeLeft(mine[:n])/2)
			left, ran := r.renewTurn(ctx, t, mine[:n], wait)
			rest = append(rest, left...)
			mine = mine[n:]
			if !ran {
				// No connection, or a stuck one: the rest go on the client
				// too, rather than each wait in vain.
				rest = append(rest, mine...)
				break
			}
		}
	}
	return rest
}

// timeLeft is how long the shortest lease among batches (a turn's, never
// empty) has left, as the registry counts it: one clock read per turn,
// not one per key.
func timeLeft(batches [][]*Hold) time.Duration {
	end := batches[0][0].tenure.leaseEnd.Load()
	for _, batch := range batches {
		for _, h := range batch {
			end = min(end, h.tenure.leaseEnd.Load())
		}
	}
	return time.Until(instant(end).time())
}

// renewTurn renews batches on t's tracking connection, a renew.lua call
// each that reads its keys again, and returns the batches left for the
// registry's client: all of them if the calls did not run (ran false:
// no connection, or none that answered within wait), else those that failed
// for the connection, went to the wrong Cluster node, or that the
// client's round renews key by key (a slot moving, a key of another
// type).
func (r *Registry) renewTurn(ctx context.Context, t *tracker, batches [][]*Hold, wait time.Duration) (left [][]*Hold, ran bool) {
	if wait <= 0 {
		return batches, false
	}
	calls := make([]*protocol.Call, len(batches))
	for i, batch := range batches {
		c := r.peer.RenewTracked(lockKeysOf(batch))
		calls[i] = &c
	}
	sent := t.runOnConnection(ctx, calls, wait)
	if sent.IsZero() {
		return batches, false
	}
	if r.countCallsAside(OpRenew, calls) != nil {
		// Failed, though the calls ran: the client's round sends them again.
		return batches, false
	}
	evicted := sync.OnceValue(func() bool { return r.evictedSince(ctx, t.addr, t.client) })
	for i, batch := range batches {
		err := calls[i].Cmd.Err()
		if err != nil && (!protocol.IsReply(err) || protocol.Redirected(err) || protocol.SlotMigrating(err) || protocol.WrongType(err)) {
			left = append(left, batch)
			continue
		}
		r.applyRenewal(ctx, batch, calls[i].Cmd, sent, evicted)
	}
	return left, true
}
