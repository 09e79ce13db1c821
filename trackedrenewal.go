package lockreg

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockreg/lockreg/internal/protocol"
)

// Where a held key is tracked (tracking.go), the watchdog renews it on
// the tracking connection of the key's server rather than on the
// registry's client: by renew.lua, which then reads the keys it renewed
// again, or where the server has SET ... IFEQ (Valkey 8.1, Redis 8.4), by
// that SET and a GET of the key.
//
//   - The connection's NOLOOP spares it the invalidation of its own
//     renewal, which on the registry's client costs Redis an invalidation
//     and the tracker a read to arm the key again (S8's server time per
//     renewed key, bench/RESULTS.md).
//   - The renewal ended the key's tracking, as any change does, and the
//     read tracks it again. renew.lua reads in the same atomic step; the
//     native GET also tells whether the key is still this registry's, as
//     a change between the two commands, which no invalidation reports,
//     would show there.
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

// renewNatively renews holds one SET ... IFEQ each in one pipeline on the
// registry's client (protocol.Peer.RenewOne), with refresh. It reports
// false if a server refused the command (a failover to an older one): the
// registry then renews by renew.lua, starting with this round.
func (r *Registry) renewNatively(ctx context.Context, holds []*Hold, refresh []*protocol.Call) bool {
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

// renewOnTrackers renews, where tracking is on, batches (one slot each)
// on the tracking connection of their server, natively or by renew.lua,
// and returns what is left for the registry's client: whole batches, or
// the holds of a native turn. ok is false if a server refused SET ...
// IFEQ.
func (r *Registry) renewOnTrackers(ctx context.Context, batches [][]*Hold, native bool) (rest [][]*Hold, ok bool) {
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
		for mine := byTracker[t]; len(mine) > 0; {
			// A turn is whole batches, at most trackedRenewalTurn keys.
			n, keys := 1, len(mine[0])
			for n < len(mine) && keys+len(mine[n]) <= trackedRenewalTurn {
				keys += len(mine[n])
				n++
			}
			turn := mine[:n]
			mine = mine[n:]
			if !native {
				rest = append(rest, r.renewScriptTurn(ctx, t, turn)...)
				continue
			}
			left, ok := r.renewTurn(ctx, t, slices.Concat(turn...))
			if !ok {
				return nil, false
			}
			if len(left) > 0 {
				rest = append(rest, left)
			}
		}
	}
	return rest, true
}

// renewScriptTurn renews batches on t's tracking connection, a renew.lua
// call each that reads its keys again, and returns the batches left for
// the registry's client: all of them if the calls did not run, else those
// that failed for the connection, went to the wrong Cluster node, or that
// the client's round renews key by key (a slot moving, a key of another
// type).
func (r *Registry) renewScriptTurn(ctx context.Context, t *tracker, batches [][]*Hold) (left [][]*Hold) {
	calls := make([]*protocol.Call, len(batches))
	for i, batch := range batches {
		c := r.peer.RenewTracked(lockKeysOf(batch))
		calls[i] = &c
	}
	sent := time.Now()
	if !t.runOnConnection(ctx, calls) {
		return batches
	}
	r.countCalls(OpRenew, len(calls))
	for i, batch := range batches {
		err := calls[i].Cmd.Err()
		if err != nil && (!protocol.IsReply(err) || protocol.Redirected(err) || protocol.SlotMigrating(err) || protocol.WrongType(err)) {
			left = append(left, batch)
			continue
		}
		r.applyRenewal(ctx, batch, calls[i].Cmd, sent)
	}
	return left
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
