package lockreg

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/redis/go-redis/v9"
)

// subscribe opens the registry's one subscription, to the release
// notifications of its registryKey, unless it is open; it returns once
// Redis confirmed it. Every key the registry waits for shares it: a
// notification names its key, and route wakes that key's waiter.
func (r *Registry) subscribe(ctx context.Context) error {
	r.subscribeMu.Lock()
	defer r.subscribeMu.Unlock()
	if r.subscribed.Load() {
		return nil
	}
	sub := r.client.Subscribe(ctx, r.channel)
	if _, err := sub.Receive(ctx); err != nil {
		_ = sub.Close()
		return fmt.Errorf("%w: subscribe to %q: %w", ErrRedis, r.channel, err)
	}
	if !r.goBackground(func(stop context.Context) { r.route(stop, sub) }) {
		_ = sub.Close()
		return ErrClosed
	}
	r.sub = sub
	r.subscribed.Store(true)
	return nil
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
// PING checks that its connection still works.
const subscriptionCheck = 15 * time.Second

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
		if msg, ok := received.(*redis.Message); ok {
			r.stats.notes.Add(1)
			if local, ok := r.locals.m.Load(msg.Payload); ok {
				select {
				case local.wake <- struct{}{}:
				default: // already woken
				}
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
			r.cfg.logger.Debug("lockreg: subscription interrupted; resubscribing", "error", err)
			select {
			case <-stop.Done():
				return
			case <-time.After(r.cfg.retryInterval):
			}
		}
	}
}
