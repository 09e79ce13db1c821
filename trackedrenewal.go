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

// trackedRenewalTurn is the most keys a turn renews, and
// trackedTurnsPerPass the most turns armLoop sends in one pipeline, so
// that the armings and verifications queued meanwhile wait for one pass
// (about 5 ms of Redis time), not a whole round, while a round of many
// keys costs a round trip per pass, not per turn.
const (
	trackedRenewalTurn  = 500
	trackedTurnsPerPass = 4
)

// trackedRenewalWait is how long, as a fraction of the lease, a round
// waits for a turn's answer before it renews on the registry's client:
// a sixth leaves the client half a renewal interval.
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

// queueRenewal queues calls for armLoop to run on the tracking
// connection; the caller wakes it.
func (t *tracker) queueRenewal(calls []*protocol.Call) trackedRenewal {
	turn := trackedRenewal{calls: calls, sent: make(chan time.Time, 1), abandoned: new(atomic.Bool)}
	t.mu.Lock()
	t.renewals = append(t.renewals, turn)
	t.mu.Unlock()
	return turn
}

// await returns when turn's calls were sent: zero if they did not run (no
// connection), or if they were not answered within wait, or stop ended
// first: the caller then renews on the registry's client, as armLoop may
// be stuck (a silent tracking connection waits out its ReadTimeout), and
// a lease must not wait on it. A turn may wait behind armLoop's other
// work, so its lease counts from when it went out, not from the call
// (extendLease).
func (turn trackedRenewal) await(stop context.Context, wait time.Duration) (sent time.Time) {
	timeout := time.NewTimer(wait)
	defer timeout.Stop()
	select {
	case sent = <-turn.sent:
		return sent
	case <-timeout.C:
	case <-stop.Done():
	}
	return turn.abandon()
}

// abandon tells armLoop not to run turn, and returns when it was sent if
// it was answered meanwhile, else zero (armLoop may write calls no one
// reads any more).
func (turn trackedRenewal) abandon() time.Time {
	turn.abandoned.Store(true)
	select {
	case sent := <-turn.sent:
		return sent
	default:
		return time.Time{}
	}
}

// runRenewals is armLoop's part: it sends the calls of renewals on conn,
// if there is one, in one pipeline. It reports false if the connection
// broke.
func runRenewals(ctx context.Context, conn *redis.Conn, renewals []trackedRenewal) bool {
	var calls []*protocol.Call
	var run []trackedRenewal
	for _, turn := range renewals {
		if conn == nil || turn.abandoned.Load() {
			turn.sent <- time.Time{}
			continue
		}
		run = append(run, turn)
		calls = append(calls, turn.calls...)
	}
	if len(run) == 0 {
		return true
	}
	sent := time.Now()
	protocol.RunPipeline(ctx, conn, calls)
	intact := true
	for _, c := range calls {
		if err := c.Cmd.Err(); err != nil && !protocol.IsReply(err) {
			intact = false
		}
	}
	for _, turn := range run {
		turn.sent <- sent
	}
	return intact
}

// renewOnTrackers renews, where tracking is on, batches (one slot each)
// on the tracking connection of their server, and returns the batches
// left for the registry's client. Every tracker's turns are queued at
// once; a tracker that leaves one unanswered (no connection, or a stuck
// one) has the rest of its turns go to the client too, rather than each
// wait in vain.
func (r *Registry) renewOnTrackers(ctx context.Context, batches [][]*Hold) (rest [][]*Hold) {
	type queued struct {
		t       *tracker
		batches [][]*Hold
		turn    trackedRenewal
	}
	var turns []queued
	filling := make(map[*tracker]int) // each tracker's last turn, in turns
	for _, batch := range batches {
		var t *tracker
		if r.tracking.on.Load() {
			t = r.trackerFor(batch[0].redisKey())
		}
		if t == nil {
			rest = append(rest, batch)
			continue
		}
		// A turn is whole batches of one tracker, at most
		// trackedRenewalTurn keys.
		if i, ok := filling[t]; ok && keyCount(turns[i].batches)+len(batch) <= trackedRenewalTurn {
			turns[i].batches = append(turns[i].batches, batch)
			continue
		}
		filling[t] = len(turns)
		turns = append(turns, queued{t: t, batches: [][]*Hold{batch}})
	}
	for i := range turns {
		turns[i].turn = turns[i].t.queueRenewal(r.renewalCalls(turns[i].batches))
	}
	for t := range filling {
		t.wake()
	}
	stuck := make(map[*tracker]bool)
	wait := r.cfg.expireAfter / trackedRenewalWait
	for _, q := range turns {
		var sent time.Time
		if stuck[q.t] {
			sent = q.turn.abandon()
		} else {
			sent = q.turn.await(ctx, wait)
		}
		if sent.IsZero() {
			stuck[q.t] = true
			rest = append(rest, q.batches...)
			continue
		}
		rest = append(rest, r.applyTurn(ctx, q.t, q.batches, q.turn.calls, sent)...)
	}
	return rest
}

// keyCount is how many holds batches carry.
func keyCount(batches [][]*Hold) (n int) {
	for _, b := range batches {
		n += len(b)
	}
	return n
}

// renewalCalls are the renew.lua calls, one per batch, that renew
// batches on a tracking connection and read their keys again.
func (r *Registry) renewalCalls(batches [][]*Hold) []*protocol.Call {
	calls := make([]*protocol.Call, len(batches))
	for i, batch := range batches {
		c := r.peer.RenewTracked(lockKeysOf(batch))
		calls[i] = &c
	}
	return calls
}

// applyTurn applies the replies of a turn's calls, renewals of batches
// on t's tracking connection sent at sent, and returns the batches left
// for the registry's client: those that failed for the connection, went
// to the wrong Cluster node, or that the client's round renews key by key
// (a slot moving, a key of another type).
func (r *Registry) applyTurn(ctx context.Context, t *tracker, batches [][]*Hold, calls []*protocol.Call, sent time.Time) (left [][]*Hold) {
	r.countCalls(OpRenew, len(calls))
	evicted := sync.OnceValue(func() bool { return r.evictedSince(ctx, t.addr, t.client) })
	for i, batch := range batches {
		err := calls[i].Cmd.Err()
		if err != nil && (!protocol.IsReply(err) || protocol.Redirected(err) || protocol.SlotMigrating(err) || protocol.WrongType(err)) {
			left = append(left, batch)
			continue
		}
		r.applyRenewal(ctx, batch, calls[i].Cmd, sent, evicted)
	}
	return left
}
