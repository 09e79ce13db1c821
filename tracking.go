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
// invalidation alone proves nothing; the read does. Arming and verifying
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
	mu       sync.Mutex // guards trackers
	trackers map[string]*tracker
	// single is the one tracker of a registry on one server (not a
	// Cluster), found without the lock.
	single atomic.Pointer[tracker]
	// on says that a tracker is up; refused, that tracking was refused,
	// which the registry logs once.
	on, refused atomic.Bool
}

// tracker is the registry's tracking on one Redis server. Two goroutines
// run it: run owns the target's subscription, and armLoop the tracking
// connection, which only it touches (a redis.Conn is not safe for
// concurrent use); run asks armLoop for what needs the connection.
type tracker struct {
	r      *Registry
	addr   string
	sub    *redis.Client // the target's client
	client *redis.Client // the client the tracking connection is drawn from
	subID  atomic.Int64  // the target's connection id, set as it connects
	// pubsub is the target's subscription, which Close closes to end run.
	pubsub atomic.Pointer[redis.PubSub]
	// refused says that the server refused tracking.
	refused atomic.Bool

	mu sync.Mutex // guards what follows, which kick tells armLoop of
	// queue holds the holds to arm or verify, with why (the cause a verify
	// gives a key found gone); waiting counts its armings not yet due.
	queue   []armRequest
	waiting int
	// retargetCause, unless lossNone, asks for a new tracking connection
	// (the target is new, or the old one broke), which has every held key
	// checked again for that cause; ping asks to check the connection.
	retargetCause LossCause
	ping          bool
	kick          chan struct{}
}

// armRequest is a hold to arm, or to verify after an invalidation or a
// lost connection: cause is what a key found gone says happened. due, if
// set, is when to arm it at the earliest (see armDelay).
type armRequest struct {
	h     *Hold
	cause LossCause
	due   time.Time
}

// armDelay is how long a hold goes unarmed after its acquisition. Most
// holds are shorter, and a hold released before its arming costs Redis
// nothing for tracking: no GET to arm it, no invalidation when its
// release deletes the key (an uncontended cycle stays two commands). A
// key changed before its arming is found gone by the arming read, so a
// holder's blind time after a change is at most armDelay plus a round
// trip; a hold released first learns of the change from its release,
// which reports ErrLockLost.
const armDelay = 5 * time.Millisecond

// arm has h's key tracked, in the background, armDelay after it was
// taken: an acquisition calls it for a hold it took in Redis (an attempt
// or a grant; a local hand-off keeps the key, and its arming). A key found
// changed loses h for cause. Without a tracker the hold learns of changes
// at its renewals.
func (r *Registry) arm(h *Hold, cause LossCause) {
	if t := r.trackerFor(h.redisKey()); t != nil {
		t.enqueue(armRequest{h: h, cause: cause, due: h.redisTaken.Add(armDelay)})
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
	}
	t := r.newTracker(base)
	if !r.goBackground(t.armLoop) {
		return nil
	}
	if !r.goBackground(t.run) {
		return nil
	}
	r.tracking.trackers[addr] = t
	if r.client == redis.UniversalClient(base) {
		r.tracking.single.Store(t)
	}
	return t
}

// stopTracking closes the trackers' subscriptions, which ends their
// goroutines once Close cancelled their context.
func (r *Registry) stopTracking() {
	r.tracking.mu.Lock()
	defer r.tracking.mu.Unlock()
	for _, t := range r.tracking.trackers {
		if sub := t.pubsub.Load(); sub != nil {
			_ = sub.Close()
		}
	}
}

// newTracker makes the tracker of base's server: two clients of its own,
// each of one connection, with base's options but RESP2 (so that
// invalidations arrive as messages) and no caching or notifications of
// go-redis's own.
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

// run subscribes the target, again while Redis does not answer, until it
// can or the server refuses; then it routes what the target receives
// until Close.
func (t *tracker) run(stop context.Context) {
	defer func() { _ = t.sub.Close() }()
	for pause := t.r.cfg.retryInterval; ; pause = min(2*pause, subscribeTimeout) {
		sub := t.sub.Subscribe(stop, protocol.InvalidationChannel)
		t.pubsub.Store(sub)
		_, err := sub.ReceiveTimeout(stop, subscribeTimeout)
		switch {
		case err == nil:
			defer func() { _ = sub.Close() }()
			t.ask(LossDeleted, false)
			t.route(stop, sub)
			return
		case protocol.Permanent(err):
			_ = sub.Close()
			t.refuse(err)
			return
		}
		_ = sub.Close()
		select {
		case <-stop.Done():
			return
		case <-time.After(pause):
		}
	}
}

// route acts on what the target receives until Close.
func (t *tracker) route(stop context.Context, sub *redis.PubSub) {
	r := t.r
	for {
		received, err := sub.ReceiveTimeout(stop, subscriptionCheck)
		if stop.Err() != nil {
			return
		}
		switch msg := received.(type) {
		case *redis.Message:
			if keys, ok := protocol.ReadInvalidation(msg); ok {
				t.invalidated(keys)
			}
		case *redis.Subscription:
			// go-redis resubscribed on a new connection, whose id is new:
			// Redis may have restarted or failed over meanwhile.
			t.ask(LossRestart, false)
		}
		switch {
		case err == nil:
		case protocol.FlushedAll(err):
			r.verifyHolds(LossFlushed)
		case isTimeout(err):
			// Both connections were silent: a dead one answers no PING.
			_ = sub.Ping(stop)
			t.ask(lossNone, true)
		default:
			select {
			case <-stop.Done():
				return
			case <-time.After(resubscribePause):
			}
		}
	}
}

// refuse ends the tracker for good: the server refused tracking. Its holds
// learn of changes at their renewals.
func (t *tracker) refuse(err error) {
	t.refused.Store(true)
	t.r.trackingRefused(err)
}

// trackingRefused logs, once, that the registry works without tracking.
func (r *Registry) trackingRefused(err error) {
	if r.tracking.refused.CompareAndSwap(false, true) && r.life.stopCtx.Err() == nil {
		r.cfg.logger.Info("lockreg: CLIENT TRACKING unavailable; a holder learns that its key changed at its next renewal", "error", err)
	}
}

// invalidated queues a verify of the held keys among keys, which changed.
func (t *tracker) invalidated(keys []string) {
	r := t.r
	for _, redisKey := range keys {
		key, ok := protocol.KeyOf(r.registryKey, redisKey)
		if !ok {
			continue
		}
		if local, ok := r.locals.m.Load(key); ok {
			if h := local.hold.Load(); h != nil {
				t.enqueue(armRequest{h: h, cause: LossDeleted})
			}
		}
	}
}

func (t *tracker) enqueue(req armRequest) {
	t.mu.Lock()
	t.queue = append(t.queue, req)
	// armLoop's timer is set for the first arming that waits, which falls
	// due before this one (holds are taken in time order): waking it for
	// this one would cost a goroutine switch per acquisition.
	wake := req.due.IsZero() || t.waiting == 0
	if !req.due.IsZero() {
		t.waiting++
	}
	t.mu.Unlock()
	if wake {
		t.wake()
	}
}

// ask asks armLoop for a new tracking connection, whose new holds are
// checked for cause (unless lossNone), or for a check of the connection.
func (t *tracker) ask(cause LossCause, ping bool) {
	t.mu.Lock()
	if cause != lossNone {
		t.retargetCause = cause
	}
	t.ping = t.ping || ping
	t.mu.Unlock()
	t.wake()
}

func (t *tracker) wake() {
	select {
	case t.kick <- struct{}{}:
	default:
	}
}

// armLoop owns the tracking connection: it makes it, checks it, and arms
// and verifies the queued holds on it, in one pipeline per turn.
func (t *tracker) armLoop(stop context.Context) {
	var conn *redis.Conn
	drop := func() {
		if conn != nil {
			_ = conn.Close()
			conn = nil
		}
	}
	wait := time.NewTimer(armDelay)
	defer func() { drop(); _ = t.client.Close(); wait.Stop() }()
	// A new connection that could not be made is tried again, for the same
	// cause, after a pause that doubles up to subscribeTimeout: go-redis
	// fails dials for a while after failed ones, and the target may be
	// reconnecting, so a retry only when asked again could be never.
	var retryCause LossCause
	var retryAt time.Time
	pause := resubscribePause
	for {
		select {
		case <-stop.Done():
			return
		case <-t.kick:
		case <-wait.C:
		}
		now := time.Now()
		t.mu.Lock()
		batch, next := t.dueNow(now)
		cause, ping := t.retargetCause, t.ping
		t.retargetCause, t.ping = lossNone, false
		t.mu.Unlock()
		if ping && conn != nil && conn.Ping(stop).Err() != nil {
			drop()
			cause = LossRestart // the keys it read are tracked no more
		}
		if cause == lossNone && retryCause != lossNone && !now.Before(retryAt) {
			cause = retryCause
		}
		if cause != lossNone {
			drop()
			conn = t.connect(stop, cause)
			retryCause = lossNone
			if conn == nil && !t.refused.Load() {
				retryCause, retryAt = cause, now.Add(pause)
				pause = min(2*pause, subscribeTimeout)
			} else {
				pause = resubscribePause
			}
		}
		if len(batch) > 0 && conn != nil && !t.armBatch(stop, conn, batch) {
			drop()
			t.ask(LossRestart, false) // the connection broke: a new one checks every key
		}
		if retryCause != lossNone && (next.IsZero() || retryAt.Before(next)) {
			next = retryAt
		}
		if !next.IsZero() {
			wait.Reset(time.Until(next))
		}
	}
}

// dueNow takes from the queue the requests due at now, and returns them
// with when the next one falls due (zero if none waits). An arming whose
// hold has ended by then is dropped, unless a hold handed off from it
// keeps the key, which is armed instead. t.mu is held.
func (t *tracker) dueNow(now time.Time) (due []armRequest, next time.Time) {
	waiting := t.queue[:0]
	for _, req := range t.queue {
		switch {
		case req.due.IsZero():
			due = append(due, req)
		case req.due.After(now):
			waiting = append(waiting, req)
			if next.IsZero() || req.due.Before(next) {
				next = req.due
			}
		default:
			if current := req.h.local.hold.Load(); current != nil && current.leaseEnd == req.h.leaseEnd {
				req.h = current
				due = append(due, req)
			}
		}
	}
	clear(t.queue[len(waiting):])
	t.queue, t.waiting = waiting, len(waiting)
	return due, next
}

// connect makes a new tracking connection, redirecting to the target,
// and has every held key checked on it for cause: the keys a former one
// read are tracked no more. It returns nil if it cannot.
func (t *tracker) connect(ctx context.Context, cause LossCause) *redis.Conn {
	conn := t.client.EphemeralConn()
	err := conn.Do(ctx, protocol.TrackingArgs(t.subID.Load())...).Err()
	switch {
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
	for i, req := range batch {
		calls[i] = r.peer.Arm(req.h.redisKey())
	}
	r.countCalls(OpTrack, len(calls))
	protocol.RunPipeline(ctx, conn, calls)
	var moved []*Hold
	evicted := sync.OnceValue(func() bool { return r.evictedSince(ctx, t.addr, t.client) })
	for i, req := range batch {
		owner, err := r.peer.ReadOwner(calls[i])
		switch {
		case protocol.Redirected(err):
			// The key's slot moved to another node (a slot migration, a
			// failover): the registry's client follows it.
			moved = append(moved, req.h)
		case err != nil && !protocol.IsReply(err):
			return false
		case err != nil:
			r.cfg.logger.Debug("lockreg: could not arm or verify a held key; its renewal checks it", "key", printedKey(req.h.Key()), "error", err)
		case owner == protocol.Gone:
			r.changedBehindItsBack(req.h, req.cause, true, evicted())
		case owner == protocol.Other:
			r.changedBehindItsBack(req.h, req.cause, false, false)
		}
	}
	if len(moved) > 0 {
		r.checkHolds(ctx, moved, LossDeleted)
	}
	return true
}
