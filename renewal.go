package lockreg

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockreg/lockreg/internal/protocol"
)

// renewBatch is the most keys one renewal script call carries, so that a
// registry holding many keys neither sends one call per key nor blocks
// Redis for long with one huge script.
const renewBatch = 100

// watch is the registry's one watchdog goroutine: every expireAfter/3 it
// renews the leases of all held keys and signals the holds whose leases
// ran out. A renewal round runs in a goroutine of its own, one at a time
// per Redis node, so that a round that a node keeps waiting (a silent
// network, go-redis' timeouts and retries) holds no signal back: the
// leases it would have carried on run out as counted, and Lost fires then
// (nextLapse); the holds of the other nodes are renewed meanwhile.
func (r *Registry) watch(ctx context.Context) {
	ticker := time.NewTicker(r.cfg.expireAfter / 3)
	defer ticker.Stop()
	lapse := newLapseTimer()
	defer lapse.timer.Stop()
	var round sync.WaitGroup
	defer round.Wait()
	renewing := make(map[string]*atomic.Bool) // by node
	for {
		select {
		case <-ctx.Done():
			return
		case <-lapse.timer.C:
			r.loseLapsed()
			r.nextLapse(lapse)
			continue
		case end := <-r.grants.shortLeases:
			lapse.set(int64(end))
			continue
		case <-ticker.C:
		}
		r.contention.forgetLapsed()
		groups := r.byNode(ctx, r.dueForRenewal())
		// The owner key's refresh goes in the pipeline of its node's round
		// (any round's if that node holds no key), as a round trip's.
		ownerNode := r.nodeOf(ctx, protocol.OwnerKey(r.namespace, r.clientID))
		if _, ok := groups[ownerNode]; !ok {
			for node := range groups {
				ownerNode = node
				break
			}
		}
		for node, due := range groups {
			busy := renewing[node]
			if busy == nil {
				busy = new(atomic.Bool)
				renewing[node] = busy
			}
			if !busy.CompareAndSwap(false, true) {
				continue
			}
			var refresh []*protocol.Call
			if node == ownerNode {
				refresh = r.peer.RefreshOwner()
			}
			round.Add(1)
			go func() {
				defer round.Done()
				defer busy.Store(false)
				r.renew(ctx, r.renewalBatches(due), refresh...)
			}()
		}
		r.loseLapsed()
		r.nextLapse(lapse)
	}
}

// byNode groups holds by the Redis node that serves their keys (nodeOf).
func (r *Registry) byNode(ctx context.Context, holds []*Hold) map[string][]*Hold {
	groups := make(map[string][]*Hold)
	for _, h := range holds {
		node := r.nodeOf(ctx, h.redisKey())
		groups[node] = append(groups[node], h)
	}
	return groups
}

// nodeOf names the Redis node that serves key: "" but on Redis Cluster.
func (r *Registry) nodeOf(ctx context.Context, key string) string {
	if cluster, ok := r.client.(*redis.ClusterClient); ok {
		if node, err := cluster.MasterForKey(ctx, key); err == nil {
			return node.Options().Addr
		}
	}
	return ""
}

// loseLapsed signals the holds whose leases ran out unrenewed (renewal
// off, past WithMaxHold, or renewals failing): their keys may have passed
// to another owner.
func (r *Registry) loseLapsed() {
	r.forEachHold(func(h *Hold) {
		if h.leaseOver() {
			h.lose(r.lapseCause(h))
		}
	})
}

// lapseCause is why h's lease ran out unrenewed.
func (r *Registry) lapseCause(h *Hold) LossCause {
	if r.cfg.renewal && r.cfg.maxHold > 0 && h.taken.since() >= r.cfg.maxHold {
		return LossMaxHold
	}
	return LossExpired
}

// dueForRenewal picks the holds to renew.
func (r *Registry) dueForRenewal() []*Hold {
	if !r.cfg.renewal {
		return nil
	}
	var due []*Hold
	now := time.Now()
	r.forEachHold(func(h *Hold) {
		if r.renewable(h, now) {
			due = append(due, h)
		}
	})
	return due
}

// renewable says whether h may be renewed at now. A hold whose lease ran
// out is not: the key may have passed on and come back to this registry
// since (a grant, a new acquisition), and the owner check, by client id,
// cannot tell that from a key held all along.
func (r *Registry) renewable(h *Hold, now time.Time) bool {
	return !h.isLost() && !h.leaseOver() && (r.cfg.maxHold == 0 || now.Sub(h.taken.time()) < r.cfg.maxHold)
}

// renewRestored renews at once, in the background, holds whose keys a
// check after a restart (or a reconnect, which may hide one) found this
// registry's. A server that restarted with its data (an RDB snapshot, an
// AOF) brings a key back with the time to live it had when that data was
// written, which later renewals may have outrun: the key would expire, and
// another registry take it, while its hold counts its lease live.
// A hold whose lease is fixed (renewal off, or past WithMaxHold) has its
// key's time to live set to what is left of its lease, and no longer.
func (r *Registry) renewRestored(holds []*Hold) {
	if len(holds) == 0 {
		return
	}
	r.goBackground(func(ctx context.Context) {
		now := time.Now()
		var renewed []*Hold
		var fixed []*protocol.Call
		for _, h := range holds {
			switch {
			case r.cfg.renewal && r.renewable(h, now):
				renewed = append(renewed, h)
			case !h.isLost() && !h.leaseOver():
				c := r.peer.RenewFor(h.redisKey(), instant(h.tenure.leaseEnd.Load()).time().Sub(now))
				fixed = append(fixed, &c)
			}
		}
		r.renew(ctx, r.renewalBatches(renewed))
		if len(fixed) > 0 && r.countCallsAside(OpRenew, fixed) == nil {
			protocol.RunPipeline(ctx, r.client, fixed) // a key found changed is told by its check
		}
	})
}

// renewalBatches cuts holds into script calls of at most renewBatch keys;
// on Redis Cluster each call's keys share a slot, as a script's must.
func (r *Registry) renewalBatches(holds []*Hold) [][]*Hold {
	_, cluster := r.client.(*redis.ClusterClient)
	bySlot := make(map[int][]*Hold)
	for _, h := range holds {
		slot := 0
		if cluster {
			slot = protocol.Slot(h.redisKey())
		}
		bySlot[slot] = append(bySlot[slot], h)
	}
	var batches [][]*Hold
	for _, group := range bySlot {
		for len(group) > 0 {
			n := min(len(group), renewBatch)
			batches = append(batches, group[:n])
			group = group[n:]
		}
	}
	return batches
}

// renew extends the leases of holds, batches of one slot each. Where
// tracking is on, a batch goes on the tracking connection of its server
// (trackedrenewal.go); the rest go in one pipeline on the registry's
// client: one round trip per node. Errors are logged and the batch is
// tried again on the next tick; a key found gone or taken is lost.
// refresh, if any, are calls the round sends in the client's pipeline:
// the owner key's refresh (owner.go).
func (r *Registry) renew(ctx context.Context, batches [][]*Hold, refresh ...*protocol.Call) {
	if len(batches) == 0 {
		return
	}
	rest := r.renewOnTrackers(ctx, batches)
	if r.servers.native.Load() {
		if r.renewNatively(ctx, slices.Concat(rest...), refresh) {
			return
		}
		// A server refused SET ... IFEQ: renew.lua from now on, starting
		// with this round's keys. The refresh went.
		refresh = nil
	}
	r.renewByScript(ctx, rest, refresh...)
}

// renewByScript renews batches by renew.lua on the registry's client, one
// call per batch, in one pipeline. While a slot moves between Redis
// Cluster nodes, its keys may be split between them: a batch Redis refuses
// for that is renewed key by key, as is one that a key of another type
// fails.
func (r *Registry) renewByScript(ctx context.Context, batches [][]*Hold, refresh ...*protocol.Call) {
	if len(batches) == 0 && len(refresh) == 0 {
		return
	}
	calls := make([]*protocol.Call, len(batches), len(batches)+len(refresh))
	for i, batch := range batches {
		c := r.peer.Renew(lockKeysOf(batch))
		calls[i] = &c
	}
	sent := r.sendRenewals(ctx, calls, refresh)
	evicted, settle := r.evictionsOf(ctx)
	defer settle(slices.Concat(batches...))
	var oneByOne [][]*Hold
	for i, batch := range batches {
		// A key of another type fails the whole call: its batch goes key
		// by key, as the native renewal does, so that the others are
		// renewed, and that key, no registry's, is lost.
		switch err := calls[i].Cmd.Err(); {
		case len(batch) > 1 && (protocol.SlotMigrating(err) || protocol.WrongType(err)):
			for _, h := range batch {
				oneByOne = append(oneByOne, []*Hold{h})
			}
		case protocol.WrongType(err):
			// Named as a renewal that finds the key another's, its lapse or
			// a forced unlock first.
			r.changedBehindItsBack(batch[0], LossDeleted, false, false)
		default:
			r.applyRenewal(ctx, batch, calls[i].Cmd, sent, func() bool { return evicted(batch[0].redisKey()) })
		}
	}
	r.renewByScript(ctx, oneByOne)
}

// lockKeysOf are the lock keys of holds.
func lockKeysOf(holds []*Hold) []string {
	keys := make([]string, len(holds))
	for i, h := range holds {
		keys[i] = h.redisKey()
	}
	return keys
}

// sendRenewals sends calls, renewals, with refresh in one pipeline on the
// registry's client, and returns when they were sent.
func (r *Registry) sendRenewals(ctx context.Context, calls, refresh []*protocol.Call) (sent time.Time) {
	sent = time.Now()
	if len(calls) > 0 && r.countCallsAside(OpRenew, calls) != nil {
		return sent // the refresh waits for the next round
	}
	protocol.RunPipeline(ctx, r.client, append(calls, refresh...))
	if len(refresh) > 0 {
		r.refreshed(refresh, sent)
	}
	return sent
}

// applyRenewal applies renew.lua's reply for batch, sent at sent. A key
// found changed is lost for the cause a verify would name (an overwrite,
// an eviction), as the renewal may come before the verify that the key's
// invalidation asked for; evicted, if not nil, tells whether the key's
// server evicted keys meanwhile.
func (r *Registry) applyRenewal(ctx context.Context, batch []*Hold, cmd *redis.Cmd, sent time.Time, evicted func() bool) {
	found, err := protocol.ReadRenew(cmd)
	if err != nil {
		r.renewalFailed(ctx, err, "keys", len(batch))
		return
	}
	leaseEnd := int64(instantOf(sent.Add(r.cfg.expireAfter)))
	for i, h := range batch {
		state := protocol.Gone // a reply short of keys renewed none of the rest
		if i < len(found) {
			state = found[i]
		}
		if state == protocol.Ours {
			r.extended(h, true, false, sent, leaseEnd)
			continue
		}
		gone := state == protocol.Gone
		r.changedBehindItsBack(h, LossDeleted, gone, gone && evicted != nil && evicted())
	}
}

// extended applies a renewal of h, sent at sent, that renewed its key or
// found it gone or taken; evicted says that its server evicted keys since.
func (r *Registry) extended(h *Hold, renewed, evicted bool, sent time.Time, leaseEnd int64) {
	// The hold was picked while its lease lived, but the process may have
	// stood still before sending (a stop, a long pause). Once a lease has
	// run out, the key may have passed through other owners and come back,
	// which the owner check cannot tell: only a renewal sent and answered
	// within the lease carries the hold on (extendLease).
	switch {
	case !renewed:
		// Gone, or another's (SET ... IFEQ tells them not apart): named as
		// renew.lua's reply would be, its lapse or a forced unlock first.
		r.changedBehindItsBack(h, LossDeleted, true, evicted)
	case !h.extendLease(sent, leaseEnd):
		h.endLease(r.lapseCause(h))
	}
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
	evicted, settle := r.evictionsOf(ctx)
	defer settle(holds)
	leaseEnd := int64(instantOf(sent.Add(r.cfg.expireAfter)))
	var full []*Hold
	for i, h := range holds {
		renewed, err := protocol.ReadRenewOne(calls[i].Cmd)
		switch {
		case protocol.NativeRenewalRefused(err):
			r.servers.native.Store(false)
			return false
		case protocol.OutOfMemory(err):
			// A full server (noeviction) refuses SET, but not renew.lua's
			// PEXPIRE: the hold is kept, rather than its lease let run out.
			full = append(full, h)
		case protocol.WrongType(err):
			// A key of another type is no registry's: retried, it would
			// fail each tick until the lease ran out, named expired.
			r.changedBehindItsBack(h, LossDeleted, false, false)
		case err != nil:
			r.renewalFailed(ctx, err, "key", printedKey(h.Key()))
		default:
			r.extended(h, renewed, !renewed && evicted(h.redisKey()), sent, leaseEnd)
		}
	}
	r.renewByScript(ctx, r.renewalBatches(full))
	return true
}

// renewalFailed logs a renewal that failed with err, of the holds attrs
// name; the next tick tries again. A refusal that lasts (an ACL) is logged
// once: every tick and batch would say it again until the leases ran out,
// and their losses are reported anyway.
func (r *Registry) renewalFailed(ctx context.Context, err error, attrs ...any) {
	if ctx.Err() != nil || protocol.Permanent(err) && !r.servers.renewalRefusalTold.CompareAndSwap(false, true) {
		return
	}
	r.cfg.logger.Warn("lockreg: lease renewal failed; retrying on the next tick", append(attrs, "error", err)...)
}
