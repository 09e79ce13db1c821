package lockreg

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/lockreg/lockreg/internal/protocol"
)

// A holder learns at once that its key changed behind its back (a DEL, an
// overwrite, a flush, an eviction, an expiry, a restart) through Redis's
// CLIENT TRACKING (internal/protocol/tracking.go has the wire side). Per
// Redis server that holds its keys, a registry keeps a tracker: two
// connections of its own, cloned from the user's client's options but
// speaking RESP2,
//
//   - the target, subscribed to the invalidation channel, and
//   - the tracking connection, which redirects its invalidations to the
//     target and reads each held key once (arming it).
//
// An invalidation for a held key sends it back to the tracking connection:
// a read that tells whether the key is still this registry's and arms it
// again. Its own renewals and releases change the key too, so an
// invalidation alone proves nothing; the read does. (Renewals of tracked
// keys run on the tracking connection itself, and cost no invalidation:
// trackedrenewal.go.) Arming and verifying
// run on the tracker's goroutine, off the caller's path: an uncontended
// cycle gains one GET on the server and one invalidation, and no round
// trip for the caller. A key changed between its acquisition and its
// arming is found by the arming read itself, so there is no window.
//
// Where tracking is refused (an ACL without CLIENT, a proxy), or the
// client is one the registry cannot clone (a Ring, another implementation
// of UniversalClient), the registry logs it once, at INFO, shows it in
// Stats, and learns of changes at its next renewal, as before.

// tracking is a registry's trackers, by server address.
type tracking struct {
	mu       sync.Mutex // guards trackers and retire
	trackers map[string]*tracker
	retire   map[string]context.CancelFunc // ends a tracker's goroutines (retireTracker)
	// single is the one tracker of a registry on one server (not a
	// Cluster), found without the lock.
	single atomic.Pointer[tracker]
	// on says that a tracker is up; refused, that tracking was refused,
	// which the registry logs once.
	on, refused atomic.Bool
}

// trackingCheck is how long a tracking connection may go unused before a
// PING checks it. Redis tells nobody when it closes one (CLIENT KILL, its
// idle timeout, maxmemory-clients): the keys it read are tracked no more,
// so a change to them would go untold until the next renewal. The PING
// finds the connection gone, and its successor checks every held key.
const trackingCheck = time.Second

// arm has h's key tracked, in the background, armDelay after it was
// taken: an acquisition calls it for a hold it took in Redis (an attempt
// or a grant; a local hand-off keeps the key, and its arming). A key found
// changed loses h for cause. Without a tracker the hold learns of changes
// at its renewals.
//
// A key that goroutines of this registry wait for is armed at once: its
// holds may be handed off locally, which asks Redis nothing, so a change
// unseen until the arming would pass on to the next hold of the tenure.
// (The hand-offs do not wait for the arming: that would cost the
// contended hand-off a round trip, as bench S4 measured, for a window of
// a round trip.)
func (r *Registry) arm(h *Hold, cause LossCause, waited bool) {
	t := r.trackerFor(h.redisKey())
	switch {
	case t == nil:
	case waited:
		t.enqueue(armRequest{h: h, cause: cause})
	default:
		t.enqueue(armRequest{h: h, cause: cause, due: h.redisTaken.time().Add(armDelay)})
	}
}

// trackerFor returns the tracker of the server that holds redisKey, or
// nil if tracking is refused or impossible there.
func (r *Registry) trackerFor(redisKey string) *tracker {
	if t := r.tracking.single.Load(); t != nil {
		if t.refused.Load() {
			return nil
		}
		return t
	}
	var base *redis.Client
	switch c := r.client.(type) {
	case *redis.Client:
		base = c
	case *redis.ClusterClient:
		ctx, cancel := context.WithTimeout(r.life.stopCtx, r.cfg.retryInterval)
		node, err := c.MasterForKey(ctx, redisKey)
		cancel()
		if err != nil {
			return nil
		}
		base = node
	default:
		r.trackingRefused(errors.New("the client is neither a *redis.Client nor a *redis.ClusterClient"))
		return nil
	}
	addr := base.Options().Addr
	r.tracking.mu.Lock()
	defer r.tracking.mu.Unlock()
	if t, ok := r.tracking.trackers[addr]; ok {
		if t.refused.Load() {
			return nil
		}
		return t
	}
	if r.tracking.trackers == nil {
		r.tracking.trackers = make(map[string]*tracker)
		r.tracking.retire = make(map[string]context.CancelFunc)
	}
	t := r.newTracker(base)
	// Its goroutines end at Close, or once its server left the Cluster.
	ctx, retire := context.WithCancel(r.life.stopCtx)
	if !r.goBackground(func(context.Context) { t.armLoop(ctx) }) { // closing: no goroutine closes them
		retire()
		_, _ = t.client.Close(), t.sub.Close()
		return nil
	}
	if !r.goBackground(func(context.Context) { t.run(ctx) }) {
		retire()
		_ = t.sub.Close() // armLoop closes t.client as it ends
		return nil
	}
	if len(r.tracking.trackers) > 0 {
		r.recheckServers() // a primary that took a failed one's place, or joined
	}
	r.tracking.trackers[addr] = t
	r.tracking.retire[addr] = retire
	if r.client == redis.UniversalClient(base) {
		r.tracking.single.Store(t)
	}
	return t
}

// trackingUp reports whether a tracker's subscription is up, on which
// invalidations arrive: on a Cluster, any node's.
func (r *Registry) trackingUp() bool {
	if t := r.tracking.single.Load(); t != nil {
		return t.up.Load()
	}
	r.tracking.mu.Lock()
	defer r.tracking.mu.Unlock()
	for _, t := range r.tracking.trackers {
		if t.up.Load() && !t.refused.Load() {
			return true
		}
	}
	return false
}

// stopTracking closes the trackers' subscriptions, which ends their
// goroutines once Close cancelled their context.
func (r *Registry) stopTracking() {
	r.tracking.mu.Lock()
	defer r.tracking.mu.Unlock()
	for _, t := range r.tracking.trackers {
		t.stop()
	}
}

// newTracker makes the tracker of base's server: two clients of its own,
// the target's and the tracking connection's (whose pool may open a
// second connection, for INFO stats), with base's options but RESP2 (so
// that invalidations arrive as messages) and no caching or notifications
// of go-redis's own.
func (r *Registry) newTracker(base *redis.Client) *tracker {
	opt := *base.Options()
	opt.Protocol = 2
	// Two connections: the tracking one, and one for INFO stats (evictedSince).
	opt.PoolSize, opt.MinIdleConns, opt.MaxIdleConns, opt.MaxActiveConns = 2, 0, 2, 0
	opt.ClientSideCache, opt.ClientSideCacheConfig, opt.AutoPipelineOptions = nil, nil, nil
	opt.PushNotificationProcessor = nil
	opt.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	userOnConnect := opt.OnConnect
	t := &tracker{r: r, addr: opt.Addr, kick: make(chan struct{}, 1)}

	subOpt := opt
	subOpt.OnConnect = func(ctx context.Context, cn *redis.Conn) error {
		if userOnConnect != nil {
			if err := userOnConnect(ctx, cn); err != nil {
				return err
			}
		}
		id, err := cn.Do(ctx, protocol.ClientIDArgs...).Int64()
		if err != nil {
			return err
		}
		t.subID.Store(id)
		return nil
	}
	t.sub, t.client = redis.NewClient(&subOpt), redis.NewClient(&opt)
	return t
}

// trackingRefused logs, once, that the registry works without tracking.
func (r *Registry) trackingRefused(err error) {
	if r.tracking.refused.CompareAndSwap(false, true) && r.life.stopCtx.Err() == nil {
		r.cfg.logger.Info("lockreg: CLIENT TRACKING unavailable; a holder learns that its key changed at its next renewal", "error", err)
	}
}

// errTargetElsewhere: a new tracking connection reached another server
// than its target.
var errTargetElsewhere = errors.New("the tracking connection reached another server than its target")

// connect makes a new tracking connection, redirecting to the target,
// and has every held key checked on it for cause: the keys a former one
// read are tracked no more. It returns nil if it cannot.
func (t *tracker) connect(ctx context.Context, cause LossCause) *redis.Conn {
	conn := t.client.EphemeralConn()
	err := conn.Do(ctx, protocol.TrackingArgs(t.subID.Load())...).Err()
	if err == nil {
		// A connection id is the target's on the target's server alone:
		// elsewhere it may be any client's, which Redis then sends the
		// invalidations to. The target is on this server if it hears the
		// probe (a server that refuses PUBLISH cannot tell).
		heard, perr := conn.Do(ctx, t.r.peer.TargetProbe()...).Int64()
		switch {
		case perr == nil && heard == 0:
			err = errTargetElsewhere
		case perr != nil && !protocol.IsReply(perr):
			err = perr
		}
	}
	switch {
	case errors.Is(err, errTargetElsewhere) || protocol.TargetGone(err):
		t.r.cfg.logger.Debug("lockreg: the tracking connection and its target are on different servers, or the target is reconnecting; moving the target", "error", err)
		t.moveTarget()
	case err == nil:
		t.r.tracking.on.Store(true)
		t.r.verifyHolds(cause)
		return conn
	case protocol.Permanent(err) && !protocol.TargetGone(err):
		t.refuse(err)
	default:
		t.r.cfg.logger.Debug("lockreg: could not turn tracking on; holders hear of changes at their renewals", "error", err)
	}
	_ = conn.Close()
	return nil
}

// armBatch reads the keys of batch on the tracking connection and ends the
// holds whose keys are not this registry's any more. It reports false if
// the connection broke.
func (t *tracker) armBatch(ctx context.Context, conn *redis.Conn, batch []armRequest) bool {
	r := t.r
	calls := make([]*protocol.Call, len(batch))
	// The releases waiting for a read of their key after their local
	// hand-off (tenure.go) are answered by one sent from now on.
	confirming := make([][]chan verdict, len(batch))
	for i, req := range batch {
		calls[i] = r.peer.Arm(req.h.redisKey())
		confirming[i] = req.h.tenure.toConfirm()
	}
	if err := r.countCallsAside(OpTrack, calls); err != nil {
		// As reads the node refused for now (below): a broken connection's
		// successor would read, and fail, at once again.
		for i, req := range batch {
			req.h.tenure.settle(confirming[i], false)
		}
		r.rearm(batch)
		return true
	}
	protocol.RunPipeline(ctx, conn, calls)
	var redirected []armRequest
	// Where the server may evict, each batch reads how many keys it
	// evicted, so that a key found gone is put down to eviction only if
	// the count rose since the last batch, not since an eviction long ago.
	evicted := sync.OnceValue(func() bool { return r.evictedSince(ctx, t.addr, t.client) })
	if r.servers.evicts.Load() {
		defer evicted()
	}
	// A key found not ours may be read where the client is no more.
	astray := sync.OnceValue(func() bool { return t.readAstray(ctx, conn) })
	broke := false
	var restored []*Hold
	defer func() { r.renewRestored(restored) }()
	for i, req := range batch {
		owner, err := r.peer.ReadOwner(calls[i])
		ours := false
		switch {
		case broke:
		case protocol.Redirected(err):
			redirected = append(redirected, req)
		case err != nil && !protocol.IsReply(err):
			broke = true
		case err != nil && !protocol.Permanent(err):
			// Refused for now (BUSY during a long script, MASTERDOWN): the
			// read tracked nothing, so no later change would be told.
			redirected = append(redirected, req)
		case err != nil:
			r.cfg.logger.Debug("lockreg: could not arm or verify a held key; its renewal checks it", "key", printedKey(req.h.Key()), "error", err)
		case owner != protocol.Ours && astray():
			redirected = append(redirected, req)
		case owner == protocol.Gone:
			r.changedBehindItsBack(req.h, req.cause, true, evicted())
		case owner == protocol.Other:
			r.changedBehindItsBack(req.h, req.cause, false, false)
		default:
			ours = true
			spareForced(req.h, req.cause)
			if req.cause == LossRestart {
				restored = append(restored, req.h)
			}
		}
		req.h.tenure.settle(confirming[i], ours)
	}
	if broke {
		return false
	}
	if len(redirected) > 0 {
		r.rearm(redirected)
	}
	return true
}

// rearm takes the holds whose reads a node refused without running them
// (protocol.Redirected): their key's slot moved to another node (a
// migration, a failover), or the node cannot serve it yet (it is loading
// its data after a restart, or busy with a long script). It checks them
// at once on the registry's client, which follows the slot and reloads
// its map of the Cluster, and a retry interval later has them armed
// again, on the tracker of the node that serves their key by then: left
// to their renewals, they would go
// unwatched for up to a renewal interval. A change they were verified for
// (invalidated) stays unchecked until that arming, so that no local
// hand-off passes it on. (armLoop counts the batch's changes down after
// armBatch: each is counted up here first.)
func (r *Registry) rearm(reqs []armRequest) {
	for _, req := range reqs {
		if req.invalidated {
			req.h.local.unchecked.Add(1)
		}
	}
	checked := func(req armRequest) {
		if req.invalidated {
			req.h.local.unchecked.Add(-1)
		}
	}
	started := r.goBackground(func(ctx context.Context) {
		byCause := make(map[LossCause][]*Hold)
		for _, req := range reqs {
			byCause[req.cause] = append(byCause[req.cause], req.h)
		}
		for cause, holds := range byCause {
			r.checkHolds(ctx, holds, cause)
		}
		pause := time.NewTimer(r.cfg.retryInterval)
		defer pause.Stop()
		select {
		case <-pause.C:
		case <-ctx.Done():
		}
		for _, req := range reqs {
			h := currentOf(req.h)
			t := r.trackerFor(h.redisKey())
			if ctx.Err() != nil || t == nil || h.Err() != nil { // closing, untracked, or ended
				checked(req)
				continue
			}
			t.enqueue(armRequest{h: h, cause: req.cause, invalidated: req.invalidated})
		}
	})
	if !started {
		for _, req := range reqs {
			checked(req)
		}
	}
}
