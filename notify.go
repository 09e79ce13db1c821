package lockreg

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// subscribe opens the registry's one subscription, to the release
// notifications of its registryKey and to its grants, unless it is open;
// it returns once Redis confirmed it. Every key the registry waits for
// shares it: a notification names its key, and route wakes that key's
// waiter.
func (r *Registry) subscribe(ctx context.Context) error {
	r.subscribeMu.Lock()
	defer r.subscribeMu.Unlock()
	if r.subscribed.Load() {
		return nil
	}
	sub := r.client.Subscribe(ctx, r.subscriptions...)
	// go-redis reads these with no deadline unless given one, whatever the
	// client's ReadTimeout, and this waits holding subscribeMu, which Close
	// takes too: a Redis that never confirms must not hold either for ever.
	for range r.subscriptions { // one confirmation per channel
		if _, err := sub.ReceiveTimeout(ctx, subscribeTimeout); err != nil {
			_ = sub.Close()
			return fmt.Errorf("%w: subscribe to %q: %w", ErrRedis, r.subscriptions, err)
		}
	}
	if !r.goBackground(func(stop context.Context) { r.route(stop, sub) }) {
		_ = sub.Close()
		return ErrClosed
	}
	r.sub = sub
	r.subscribed.Store(true)
	return nil
}

// subscribeSoon opens the subscription in the background once the
// registry holds a key, if pub/sub is on: besides grants and wake-ups for
// waiters, it carries news for holders, as its reconnection after Redis
// restarted or failed over (see verifyHolds). A failed attempt is not
// repeated for subscribeTimeout.
func (r *Registry) subscribeSoon() {
	if !r.cfg.pubSub || r.subscribed.Load() || time.Now().UnixNano() < r.subscribeAfter.Load() ||
		!r.subscribing.CompareAndSwap(false, true) {
		return
	}
	if !r.goBackground(func(ctx context.Context) {
		defer r.subscribing.Store(false)
		if err := r.subscribe(ctx); err != nil {
			r.subscribeAfter.Store(time.Now().Add(subscribeTimeout).UnixNano())
			r.cfg.logger.Debug("lockreg: could not subscribe; holders hear of a Redis restart at the next renewal", "error", err)
		}
	}) {
		r.subscribing.Store(false)
	}
}

// unsubscribe closes the subscription, which ends route's read.
func (r *Registry) unsubscribe() {
	r.subscribeMu.Lock()
	defer r.subscribeMu.Unlock()
	if r.sub != nil {
		_ = r.sub.Close()
	}
}

// subscriptionCheck is how long the subscription may stay silent before a
// PING checks that its connection still works; resubscribePause is the
// longest pause before resubscribing after an error; subscribeTimeout
// bounds the wait for Redis to confirm a subscription, as long as a
// default go-redis client waits for any reply (its ReadTimeout).
const (
	subscriptionCheck = 15 * time.Second
	resubscribePause  = 100 * time.Millisecond
	subscribeTimeout  = 5 * time.Second
)

// route delivers notifications until Close. It reads the subscription
// itself rather than through go-redis's Channel, which would add a
// goroutine hop to every wake-up. go-redis reconnects and resubscribes
// after a lost connection; what was published meanwhile is lost, which
// costs the waiters at most a retry interval.
func (r *Registry) route(stop context.Context, sub *redis.PubSub) {
	for {
		received, err := sub.ReceiveTimeout(stop, subscriptionCheck)
		if stop.Err() != nil {
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
			if msg.Kind == "subscribe" && msg.Count == len(r.subscriptions) {
				r.wakeAll()
				r.goBackground(r.verifyHolds)
			}
		}
		var netErr net.Error
		switch {
		case err == nil:
		case errors.As(err, &netErr) && netErr.Timeout():
			// A silent connection may be a dead one: the PONG, or the error
			// that makes go-redis reconnect, comes with the next read.
			_ = sub.Ping(stop)
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

// verifyHolds checks, in one pipeline, that Redis still has the key of
// every hold, and signals the holds whose keys are gone lost: after the
// subscription's connection broke, Redis may have restarted or failed over
// without them, and their holders should hear it now, not at the next
// renewal, while another process may already hold the key. Keys that
// survived (persistence, a replica that had them) stay held. On Redis
// Cluster it covers the restarts of the node the subscription is on; the
// renewal covers the others.
func (r *Registry) verifyHolds(ctx context.Context) {
	var holds []*Hold
	r.forEachHold(func(h *Hold) {
		if !h.isLost() {
			holds = append(holds, h)
		}
	})
	if len(holds) == 0 {
		return
	}
	calls := make([]*call, len(holds))
	for i, h := range holds {
		calls[i] = &call{args: []any{"get", h.redisKey()}}
	}
	runPipeline(ctx, r.client, calls)
	for i, h := range holds {
		owner, err := calls[i].cmd.Text()
		switch {
		case err == nil && owner == r.clientID:
		case err == nil || errors.Is(err, redis.Nil):
			h.endLease(lossRestart)
		default:
			r.cfg.logger.Debug("lockreg: could not check the held keys after a reconnect; the renewal will", "error", err)
			return
		}
	}
}

// wakeAll wakes every waiter of the registry.
func (r *Registry) wakeAll() {
	r.locals.m.Range(func(_ string, local *localLock) bool {
		local.wakeUp()
		return true
	})
}

// deliver acts on a notification from release.lua: 'w<key>' wakes this
// registry's waiter for key, if any; 'g<token>:<client id>:<key>' grants
// key to the registry with that client id, and wakes its waiter with the
// token. A grant that finds no waiter (it gave up, or the mark outlived an
// earlier acquisition) is given back, so that the key goes on to the next
// waiter instead of blocking everyone until its lease ends. So is a grant
// that finds the key held here: the holder's own attempt found the key
// granted and took it with a newer token, which the give-back spares; or
// the key went through another registry since the holder took it (its
// lease ran out, or Redis lost the key), and keeping the grant would hide
// that from the holder's renewals and unlock.
func (r *Registry) deliver(note string) {
	var key, tokenText string
	var token int64
	switch {
	case strings.HasPrefix(note, "w"):
		key = note[1:]
	case strings.HasPrefix(note, "g"):
		var rest string
		tokenText, rest, _ = strings.Cut(note[1:], ":")
		grantee, grantedKey, _ := strings.Cut(rest, ":")
		if grantee != r.clientID {
			return
		}
		var err error
		if token, err = strconv.ParseInt(tokenText, 10, 64); err != nil || token <= 0 {
			r.cfg.logger.Warn("lockreg: malformed grant ignored; the key expires after a short lease", "note", note)
			return
		}
		key = grantedKey
	default:
		return // another version's notification: its waiters fall back to polling
	}
	if token == 0 {
		if local, ok := r.locals.m.Load(key); ok {
			local.wakeUp()
		}
		return
	}
	// Pending before the look for a waiter, so that an acquisition of this
	// registry that comes after the look waits for the give-back before its
	// first attempt (see giveBack).
	finish := r.startPending(key)
	if local, ok := r.locals.m.Load(key); ok && local.hold.Load() == nil {
		finish()
		local.grantedToken.Store(token)
		local.wakeUp()
		return
	}
	if !r.goBackground(func(ctx context.Context) {
		defer finish()
		r.giveBack(ctx, key, tokenText)
	}) {
		finish()
	}
}

// giveBack releases a key granted to this registry that nobody here waited
// for, unless an acquisition of this registry has taken the key since and
// keeps it. An acquisition that begins once the grant came waits for the
// give-back before its first attempt (deliver makes it pending), so that a
// plain SET NX, which leaves the grant's token the key's last, cannot take
// the key once the grant expired and then lose it to the give-back. For
// one under way, or a holder, release.lua checks that the key's last token
// is still the grant's (an attempt that found the key its own drew a newer
// one) and that its time to live is within the grant's lease (a plain SET
// NX sets a full lease; with a lease as short as the grant's, that check
// cannot tell the two apart).
func (r *Registry) giveBack(ctx context.Context, key, token string) {
	l := &Lock{r: r, key: key, keys: redisKeys(r.registryKey, key)}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.expireAfter)
	defer cancel()
	grant := token + ":" + strconv.FormatInt(r.grantLease.Milliseconds(), 10)
	if _, err := l.releaseRedis(ctx, 0, false, grant); err != nil {
		r.cfg.logger.Debug("lockreg: could not give a granted key back; it expires after its grant lease", "key", key, "error", err)
	}
}
