package lockreg

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockreg/lockreg/internal/protocol"
)

// notifications is a registry's one subscription, shared by all its keys:
// to the namespace's release channel, where releases wake the waiters
// of every registry, and to its own grant channel, where it receives the
// grants to it alone, so that a grant wakes no other process
// (protocol.Peer.Channels names them). It is opened on the first wait or
// hold, with pub/sub on.
type notifications struct {
	names []string      // the channels subscribed to
	mu    sync.Mutex    // serializes opening sub
	sub   *redis.PubSub // guarded by mu
	// subscribed says that sub is open. subscribing, that subscribeSoon
	// opens it; subscribeAfter (unix ns), when it may try again after a
	// failure.
	subscribed     atomic.Bool
	subscribing    atomic.Bool
	subscribeAfter atomic.Int64
	// refusalTold says that a refusal was logged as a warning: it lasts
	// (an ACL, a proxy), and each later try would say it again.
	refusalTold atomic.Bool
	// noteRefusalTold says the same of a release's note to the waiters,
	// which Redis refused (PUBLISH; see releaseRedis).
	noteRefusalTold atomic.Bool
}

// subscribe opens the registry's one subscription, to the release
// notifications of its namespace and to its grants, unless it is open;
// it returns once Redis confirmed it. Every key the registry waits for
// shares it: a notification names its key, and route wakes that key's
// waiter.
func (r *Registry) subscribe(ctx context.Context) error {
	n := &r.notes
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.subscribed.Load() {
		return nil
	}
	sub := r.client.Subscribe(ctx, n.names...)
	// go-redis reads these with no deadline unless given one, whatever the
	// client's ReadTimeout, and this waits holding subscribeMu, which Close
	// takes too: a Redis that never confirms must not hold either for ever.
	for range n.names { // one confirmation per channel
		if _, err := sub.ReceiveTimeout(ctx, subscribeTimeout); err != nil {
			_ = sub.Close()
			return fmt.Errorf("%w: subscribe to %q: %w", ErrRedis, n.names, err)
		}
	}
	if !r.goBackground(func(stop context.Context) { r.route(stop, sub) }) {
		_ = sub.Close()
		return ErrClosed
	}
	n.sub = sub
	n.subscribed.Store(true)
	return nil
}

// subscribeSoon opens the subscription in the background once the
// registry holds a key, if pub/sub is on: besides grants and wake-ups for
// waiters, it carries news for holders, as its reconnection after Redis
// restarted or failed over (see verifyHolds). A failed attempt is not
// repeated for subscribeTimeout.
func (r *Registry) subscribeSoon() {
	n := &r.notes
	if !r.cfg.pubSub || n.subscribed.Load() || time.Now().UnixNano() < n.subscribeAfter.Load() ||
		!n.subscribing.CompareAndSwap(false, true) {
		return
	}
	if !r.goBackground(func(ctx context.Context) {
		defer n.subscribing.Store(false)
		err := r.subscribe(ctx)
		if err == nil {
			return
		}
		n.subscribeAfter.Store(time.Now().Add(subscribeTimeout).UnixNano())
		if protocol.Permanent(err) && !errors.Is(err, redis.ErrClosed) && n.refusalTold.CompareAndSwap(false, true) {
			// Unlike a Redis that is down, which everything else reports,
			// a refusal costs nothing that fails: waiters poll instead of
			// being told, and holders hear of a restart late.
			r.cfg.logger.Warn("lockreg: subscription refused; waiters poll, and holders hear of a Redis restart at the next renewal", "error", err)
			return
		}
		r.cfg.logger.Debug("lockreg: could not subscribe; holders hear of a Redis restart at the next renewal", "error", err)
	}) {
		n.subscribing.Store(false)
	}
}

// unsubscribe closes the subscription, which ends route's read.
func (r *Registry) unsubscribe() {
	r.notes.mu.Lock()
	defer r.notes.mu.Unlock()
	if r.notes.sub != nil {
		_ = r.notes.sub.Close()
	}
}

// subscriptionCheck is how long a subscription (the registry's, a
// tracker's target) may stay silent before a PING checks that its
// connection still works, and, with no PONG, before it is given up for a
// new one; a variable, which tests shorten. resubscribePause is the
// longest pause before resubscribing after an error; subscribeTimeout
// bounds the wait for Redis to confirm a subscription, as long as a
// default go-redis client waits for any reply (its ReadTimeout).
var subscriptionCheck = 15 * time.Second

const (
	resubscribePause = 100 * time.Millisecond
	subscribeTimeout = 5 * time.Second
)

// route delivers notifications until Close. It reads the subscription
// itself rather than through go-redis's Channel, which would add a
// goroutine hop to every wake-up. go-redis reconnects and resubscribes
// after a lost connection; what was published meanwhile is lost, which
// costs the waiters at most a retry interval.
func (r *Registry) route(stop context.Context, sub *redis.PubSub) {
	var silence silence
	for {
		received, err := sub.ReceiveTimeout(stop, subscriptionCheck)
		if stop.Err() != nil {
			return
		}
		if silence.dead(sub, stop, received, err) {
			r.resubscribe(stop, sub)
			return
		}
		switch msg := received.(type) {
		case *redis.Message:
			r.stats.notes.Add(1)
			r.deliver(msg.Payload)
		case *redis.Subscription:
			// subscribe confirmed the first subscription: this is go-redis
			// resubscribing on a new connection. A grant published in
			// between is lost; each waiter's next attempt finds its key, so
			// make that attempt now rather than a retry interval later,
			// once every channel is back. Redis may have restarted or
			// failed over meanwhile: check that the holds' keys survived.
			if msg.Kind == "subscribe" && msg.Count == len(r.notes.names) {
				r.wakeAll()
				r.verifyHolds(LossRestart)
			}
		}
		switch {
		case err == nil, isTimeout(err):
		default:
			// Pause before resubscribing. Every failed dial counts towards
			// go-redis's dial breaker, which never forgets: the PoolSize-th
			// makes every call of the client fail for a second, renewals
			// included. Resubscribing at once after a lost connection
			// found a lost grant in 6ms instead of about 70, but tripped
			// that breaker after one Redis restart in fifteen.
			r.cfg.logger.Debug("lockreg: subscription interrupted; resubscribing", "error", err)
			select {
			case <-stop.Done():
				return
			case <-time.After(min(r.cfg.retryInterval, resubscribePause)):
			}
		}
	}
}

// silence watches a subscription for a connection that died without a
// word (its host gone, a NAT or load balancer that dropped it): writes go
// into the void and reads time out, which go-redis, reading with a
// timeout, never takes for a broken connection, so it would never
// reconnect, and until the kernel gave up on it (about 15 minutes) every
// grant and wake-up for the registry would be lost. A silence of
// subscriptionCheck is answered with a PING; a second one with no PONG,
// nor anything else, meanwhile says that the connection is dead.
type silence struct{ pinged bool }

// dead takes what a read of sub returned, and reports whether the
// connection is dead; it sends the PING after a first silence.
func (s *silence) dead(sub *redis.PubSub, stop context.Context, received any, err error) bool {
	switch {
	case !isTimeout(err):
		// Something came: a message, a reply (an error reply too, as
		// BUSY during a long script), or an error that makes go-redis
		// reconnect.
		s.pinged = false
	case s.pinged:
		return true
	default:
		s.pinged = true
		_ = sub.Ping(stop)
	}
	return false
}

// resubscribe replaces the registry's subscription, whose connection died
// silently (see silence), with a new one, trying again while Redis does
// not answer; then, as on go-redis's own resubscription, it wakes the
// waiters and checks the held keys, as news was lost meanwhile.
func (r *Registry) resubscribe(stop context.Context, dead *redis.PubSub) {
	n := &r.notes
	n.mu.Lock()
	if n.sub == dead {
		n.sub = nil
		n.subscribed.Store(false)
	}
	n.mu.Unlock()
	_ = dead.Close()
	r.cfg.logger.Debug("lockreg: subscription silent, even to a PING; subscribing again")
	for pause := min(r.cfg.retryInterval, resubscribePause); ; pause = min(2*pause, subscribeTimeout) {
		err := r.subscribe(stop)
		switch {
		case stop.Err() != nil, errors.Is(err, ErrClosed):
			return
		case err == nil:
			r.wakeAll()
			r.verifyHolds(LossRestart)
			return
		}
		select {
		case <-stop.Done():
			return
		case <-time.After(pause):
		}
	}
}

// isTimeout reports whether err is a read that timed out.
func isTimeout(err error) bool {
	var netErr net.Error
	return errors.As(err, &netErr) && netErr.Timeout()
}

// wakeAll wakes every waiter of the registry.
func (r *Registry) wakeAll() {
	r.locals.m.Range(func(_ string, local *localLock) bool {
		local.wakeUp()
		return true
	})
}

// deliver acts on a notification (protocol.Note): a wake-up wakes this
// registry's waiter for its key, if any; a grant to this registry goes to
// receiveGrant (grant.go), and news of a forced unlock of its hold to
// receiveForced (forceunlock.go). Notifications of kinds this version does
// not know (another version's) are ignored: their waiters fall back to
// polling.
func (r *Registry) deliver(payload string) {
	n, known, err := protocol.ParseNote(payload)
	switch {
	case !known || (n.Kind != protocol.WakeNote && n.ClientID != r.clientID):
	case err != nil:
		r.cfg.logger.Warn("lockreg: malformed note ignored; a grant's key expires after a short lease", "note", payload)
	case n.Kind == protocol.GrantNote:
		r.receiveGrant(n.Key, n.Token)
	case n.Kind == protocol.ForcedNote:
		r.receiveForced(n.Key)
	default:
		if local, ok := r.locals.m.Load(n.Key); ok {
			local.wakeUp()
		}
	}
}
