package lockreg

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockreg/lockreg/internal/protocol"
	"github.com/redis/go-redis/v9"
)

// tracker is the registry's tracking on one Redis server (tracking.go has
// the design): the target's subscription, the tracking connection, and
// the holds it arms and verifies. Two goroutines
// run it: run owns the target's subscription, and armLoop the tracking
// connection, which only it touches (a redis.Conn is not safe for
// concurrent use); run asks armLoop for what needs the connection.
type tracker struct {
	r      *Registry
	addr   string
	sub    *redis.Client // the target's client
	client *redis.Client // the client the tracking connection is drawn from
	subID  atomic.Int64  // the target's connection id, set as it connects
	// pubsub is the target's subscription, which Close closes to end run
	// (go-redis does not end a read when its context ends); stopped says
	// that Close came, so that one made after it is closed at once.
	subMu   sync.Mutex
	pubsub  *redis.PubSub
	stopped bool
	// moving says that moveTarget closed the target's subscription, for
	// run to make a new one.
	moving atomic.Bool
	// refused says that the server refused tracking; up, that the
	// target's subscription is confirmed and has not broken since;
	// rehoming, that a watch of its holds runs while its server is down
	// (rehome.go).
	refused, up, rehoming atomic.Bool

	mu sync.Mutex // guards what follows, which kick tells armLoop of
	// queue holds the holds to arm or verify, with why (the cause a verify
	// gives a key found gone); timerSet says that armLoop's timer is set,
	// for the queue's first arming or for a sweep of the ended ones.
	queue    []armRequest
	timerSet bool
	// retargetCause, unless lossNone, asks for a new tracking connection
	// (the target is new, or the old one broke), which has every held key
	// checked again for that cause; ping asks to check the connection.
	retargetCause LossCause
	ping          bool
	// renewals are the watchdog's renewals to run on the tracking
	// connection (trackedrenewal.go, runOnConnection).
	renewals []trackedRenewal
	kick     chan struct{}
}

// run subscribes the target, again while Redis does not answer, until it
// can or the server refuses; then it routes what the target receives
// until Close, or until its connection died silently (see silence): a new
// target then takes over, with a new tracking connection, which checks
// every held key as after a restart.
func (t *tracker) run(stop context.Context) {
	defer func() { _ = t.sub.Close() }()
	cause := LossDeleted
	for pause := t.r.cfg.retryInterval; ; pause = min(2*pause, subscribeTimeout) {
		channels := t.r.peer.TrackingChannels()
		t.moving.Store(false)
		sub := t.sub.Subscribe(stop, channels...)
		if !t.keep(sub) {
			return
		}
		var err error
		for range channels { // one confirmation each
			if _, err = sub.ReceiveTimeout(stop, subscribeTimeout); err != nil {
				break
			}
		}
		switch {
		case err == nil:
			t.up.Store(true)
			t.retarget(cause)
			dead := t.route(stop, sub)
			_ = sub.Close()
			if !dead {
				return
			}
			cause, pause = LossRestart, t.r.cfg.retryInterval
			continue
		case t.moving.Load():
			// moveTarget closed it before its confirmations came (the
			// tracking connection reconnected first, after a restart):
			// redis.ErrClosed then says nothing of the server.
			_ = sub.Close()
			continue
		case protocol.Permanent(err):
			_ = sub.Close()
			t.refuse(err)
			return
		}
		_ = sub.Close()
		t.serverDown()
		select {
		case <-stop.Done():
			return
		case <-time.After(pause):
		}
	}
}

// keep records sub as the target's subscription, unless Close came, which
// it then closes.
func (t *tracker) keep(sub *redis.PubSub) bool {
	t.subMu.Lock()
	defer t.subMu.Unlock()
	if t.stopped {
		_ = sub.Close()
		return false
	}
	t.pubsub = sub
	return true
}

// stop closes the target's subscription, and any made later, which ends
// run once Close cancelled its context.
func (t *tracker) stop() {
	t.subMu.Lock()
	defer t.subMu.Unlock()
	t.stopped = true
	if t.pubsub != nil {
		_ = t.pubsub.Close()
	}
}

// route acts on what the target receives until Close, or until its
// connection died silently, which it then reports.
func (t *tracker) route(stop context.Context, sub *redis.PubSub) (dead bool) {
	r := t.r
	var silence silence
	for {
		received, err := sub.ReceiveTimeout(stop, subscriptionCheck)
		if stop.Err() != nil {
			return false
		}
		if silence.dead(sub, stop, received, err) {
			return true
		}
		switch msg := received.(type) {
		case *redis.Message:
			if keys, ok := protocol.ReadInvalidation(msg); ok {
				t.invalidated(keys)
			} else {
				r.deliver(msg.Payload) // a forced unlock, read before its key's invalidation
			}
		case *redis.Subscription:
			// go-redis resubscribed on a new connection, whose id is new:
			// Redis may have restarted or failed over meanwhile.
			if msg.Kind == "subscribe" && msg.Count == len(r.peer.TrackingChannels()) {
				t.retarget(LossRestart)
			}
		}
		switch {
		case err == nil:
			if !t.up.Load() {
				t.up.Store(true) // go-redis resubscribed
			}
		case protocol.FlushedAll(err):
			r.verifyHolds(LossFlushed)
		case isTimeout(err):
			// The tracking connection was silent too: a dead one answers no
			// PING (silence has pinged the target).
			t.ask(lossNone, true)
		case t.moving.Load():
			return true // moveTarget closed it: a new one takes over
		default:
			if !protocol.IsReply(err) {
				t.serverDown()
			}
			select {
			case <-stop.Done():
				return false
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
	// Holds queued for arming while there was no connection are checked
	// once on the registry's client instead.
	t.r.verifyHolds(LossDeleted)
}

// invalidated queues a verify of the held keys among keys, which changed.
func (t *tracker) invalidated(keys []string) {
	r := t.r
	for _, redisKey := range keys {
		key, ok := protocol.KeyOf(r.namespace, redisKey)
		if !ok {
			continue
		}
		if local, ok := r.locals.m.Load(key); ok {
			if h := local.hold.Load(); h != nil {
				local.unchecked.Add(1)
				t.enqueue(armRequest{h: h, cause: LossDeleted, invalidated: true})
			}
		}
	}
}

// retarget asks for a new tracking connection for the target, which
// subscribed anew; after a restart it has the held keys checked at once
// too, as that connection may come seconds later (armLoop reads them on
// the registry's client meanwhile: checkUntracked), and the servers'
// policies looked at again: a failover may have put another server there.
func (t *tracker) retarget(cause LossCause) {
	if cause == LossRestart {
		t.r.verifyHolds(cause)
		t.r.recheckServers()
	}
	t.ask(cause, false)
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
	wait, check := time.NewTimer(armDelay), time.NewTicker(trackingCheck)
	defer func() { drop(); _ = t.client.Close(); wait.Stop(); check.Stop() }()
	var used time.Time // when conn last answered
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
		case <-check.C:
		}
		now := time.Now()
		t.mu.Lock()
		batch, next := t.dueNow(now)
		cause, ping := t.retargetCause, t.ping
		t.retargetCause, t.ping = lossNone, false
		renewals := t.renewals
		t.renewals = nil
		t.mu.Unlock()
		// (Half a check: a tick comes a check after the last, whose use of
		// the connection may have come a little after it.)
		if conn != nil && (ping || now.Sub(used) >= trackingCheck/2) {
			if !t.checkConnection(stop, conn) {
				drop()
				cause = LossRestart // the keys it read are tracked no more
			}
			used = now
		}
		if cause == lossNone && retryCause != lossNone && !now.Before(retryAt) {
			cause = retryCause
		}
		if cause != lossNone {
			drop()
			conn = t.connect(stop, cause)
			used = now
			retryCause = lossNone
			if conn != nil {
				// A key this turn reads first on the new connection and finds
				// gone is gone for the connection's cause (a restart, say), as
				// the check of every held key that connect queued would say.
				for i := range batch {
					batch[i].cause = cause
				}
			}
			if conn == nil && !t.refused.Load() {
				retryCause, retryAt = cause, now.Add(pause)
				pause = min(2*pause, subscribeTimeout)
			} else {
				pause = resubscribePause
			}
		}
		switch {
		case len(batch) == 0:
		case conn == nil:
			// Held keys are checked when a connection comes; a release
			// waiting for its confirmation (tenure.go) may wait for one
			// whose hold is not held then, so its read waits here.
			t.keepConfirming(batch)
			t.r.checkUntracked(batch)
		case !t.armBatch(stop, conn, batch):
			drop()
			t.ask(LossRestart, false) // the connection broke: a new one checks every key
		default:
			used = now
		}
		// The invalidations of batch are checked, or given up on with their
		// connection, whose successor checks every key: hand-offs go on.
		for _, req := range batch {
			if req.invalidated {
				req.h.local.unchecked.Add(-1)
			}
		}
		if len(renewals) > 0 && !runRenewals(stop, conn, renewals) {
			drop()
			t.ask(LossRestart, false) // as for an arming
		}
		if retryCause != lossNone && (next.IsZero() || retryAt.Before(next)) {
			next = retryAt
		}
		if !next.IsZero() {
			wait.Reset(time.Until(next))
		}
	}
}
