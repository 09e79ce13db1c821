package lockreg

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockreg/lockreg/internal/protocol"
)

// Where the server has SET ... IFEQ (Valkey 8.1, Redis 8.4), the watchdog
// renews each key with one command rather than renew.lua. Where the key
// is tracked (tracking.go), it sends that command on the tracking
// connection of the key's server, followed by a GET:
//
//   - the connection's NOLOOP spares it the invalidation of its own SET,
//     which on the registry's client would cost Redis an invalidation and
//     the tracker a read to arm the key again: on Valkey 8.1, S8's server
//     time per renewed key went from 3.55-3.93 µs to 2.85-2.93
//     (bench/RESULTS.md);
//   - the SET ended the key's tracking, as any change does, and the GET
//     tracks it again; it also tells whether the key is still this
//     registry's, as a change between the two commands, which no
//     invalidation reports, would show there.
//
// Holds whose tracker has no connection, or whose key moved to another
// Cluster node, are renewed on the registry's client, as before.

// trackedRenewalTurn is the most keys a turn of a tracker renews, so that
// the armings and verifications queued meanwhile wait for one turn, not a
// whole round.
const trackedRenewalTurn = 500

// trackedRenewal is a turn of renewal calls for a tracker's armLoop to
// run; ran tells the watchdog whether they ran (false: no connection).
type trackedRenewal struct {
	calls []*protocol.Call
	ran   chan bool
}

// runOnConnection has armLoop run calls on the tracking connection, and
// reports whether they ran: false if there is no connection, or if stop
// ends first.
func (t *tracker) runOnConnection(stop context.Context, calls []*protocol.Call) bool {
	turn := trackedRenewal{calls: calls, ran: make(chan bool, 1)}
	t.mu.Lock()
	t.renewals = append(t.renewals, turn)
	t.mu.Unlock()
	t.wake()
	select {
	case ran := <-turn.ran:
		return ran
	case <-stop.Done():
		return false
	}
}

// runRenewals is armLoop's part of runOnConnection: it runs renewals on
// conn, if there is one. It reports false if the connection broke.
func runRenewals(ctx context.Context, conn *redis.Conn, renewals []trackedRenewal) bool {
	intact := true
	for _, turn := range renewals {
		ran := conn != nil && intact
		if ran {
			protocol.RunPipeline(ctx, conn, turn.calls)
			for _, c := range turn.calls {
				if err := c.Cmd.Err(); err != nil && !protocol.IsReply(err) {
					intact = false
				}
			}
		}
		turn.ran <- ran
	}
	return intact
}

// renewNatively renews the holds of batches one SET ... IFEQ each: on
// the tracking connections where it can (renewOnTrackers), the rest in
// one pipeline on the registry's client (protocol.Peer.RenewOne), with
// refresh. It reports false if a server refused the command (a failover
// to an older one): the registry then renews by renew.lua, starting with
// this round.
func (r *Registry) renewNatively(ctx context.Context, batches [][]*Hold, refresh []*protocol.Call) bool {
	holds, native := r.renewOnTrackers(ctx, batches)
	if !native {
		return false
	}
	if len(holds) == 0 && len(refresh) == 0 {
		return true
	}
	calls := make([]*protocol.Call, len(holds), len(holds)+len(refresh))
	for i, h := range holds {
		c := r.peer.RenewOne(h.redisKey())
		calls[i] = &c
	}
	sent := r.sendRenewals(ctx, calls, refresh)
	leaseEnd := int64(instantOf(sent.Add(r.cfg.expireAfter)))
	for i, h := range holds {
		renewed, err := protocol.ReadRenewOne(calls[i].Cmd)
		switch {
		case protocol.NativeRenewalRefused(err):
			r.servers.native.Store(false)
			return false
		case err != nil:
			r.renewalFailed(ctx, h, err)
		default:
			r.extended(h, renewed, sent, leaseEnd)
		}
	}
	return true
}

// renewOnTrackers renews, where tracking is on, the holds of batches (one
// slot each) on the tracking connection of their server, and returns the
// holds left for the registry's client; native is false if a server
// refused SET ... IFEQ.
func (r *Registry) renewOnTrackers(ctx context.Context, batches [][]*Hold) (rest []*Hold, native bool) {
	var order []*tracker
	byTracker := make(map[*tracker][]*Hold)
	for _, batch := range batches {
		var t *tracker
		if r.tracking.on.Load() {
			t = r.trackerFor(batch[0].redisKey())
		}
		if t == nil {
			rest = append(rest, batch...)
			continue
		}
		if _, ok := byTracker[t]; !ok {
			order = append(order, t)
		}
		byTracker[t] = append(byTracker[t], batch...)
	}
	for _, t := range order {
		for mine := byTracker[t]; len(mine) > 0; {
			turn := mine[:min(len(mine), trackedRenewalTurn)]
			mine = mine[len(turn):]
			left, ok := r.renewTurn(ctx, t, turn)
			if !ok {
				return nil, false
			}
			rest = append(rest, left...)
		}
	}
	return rest, true
}

// renewTurn renews holds on t's tracking connection, each key a SET ...
// IFEQ and a GET, and returns the holds left for the registry's client:
// all of them if the calls did not run, else those whose calls failed for
// the connection or went to the wrong Cluster node. ok is false if the
// server refused SET ... IFEQ.
func (r *Registry) renewTurn(ctx context.Context, t *tracker, holds []*Hold) (left []*Hold, ok bool) {
	calls := make([]*protocol.Call, 2*len(holds))
	for i, h := range holds {
		set := r.peer.RenewOne(h.redisKey())
		calls[2*i], calls[2*i+1] = &set, r.peer.Arm(h.redisKey())
	}
	sent := time.Now()
	if !t.runOnConnection(ctx, calls) {
		return holds, true
	}
	r.countCalls(OpRenew, len(calls)) // the GETs too: they are the renewal's
	leaseEnd := int64(instantOf(sent.Add(r.cfg.expireAfter)))
	// A key found changed is lost for the cause a verify would name (an
	// overwrite, an eviction), as the renewal may come before the verify
	// that the key's invalidation asked for.
	evicted := sync.OnceValue(func() bool { return r.evictedSince(ctx, t.addr, t.client) })
	for i, h := range holds {
		renewed, err := protocol.ReadRenewOne(calls[2*i].Cmd)
		owner, readErr := r.peer.ReadOwner(calls[2*i+1])
		switch {
		case protocol.NativeRenewalRefused(err):
			r.servers.native.Store(false)
			return nil, false
		case err != nil && (!protocol.IsReply(err) || protocol.Redirected(err)):
			left = append(left, h) // the client reconnects, and follows the key
		case err != nil:
			r.renewalFailed(ctx, h, err)
		case readErr != nil:
			r.extended(h, renewed, sent, leaseEnd)
			if renewed {
				// Renewed, but not tracked again: arm it as after an
				// acquisition.
				t.enqueue(armRequest{h: h, cause: LossDeleted})
			}
		case !renewed || owner != protocol.Ours:
			gone := owner == protocol.Gone
			r.changedBehindItsBack(h, LossDeleted, gone, gone && evicted())
		default:
			r.extended(h, true, sent, leaseEnd)
		}
	}
	return left, true
}

// renewalFailed logs a renewal of h that Redis refused; the next tick
// tries again.
func (r *Registry) renewalFailed(ctx context.Context, h *Hold, err error) {
	if ctx.Err() == nil {
		r.cfg.logger.Warn("lockreg: lease renewal failed; retrying on the next tick", "key", printedKey(h.Key()), "error", err)
	}
}
