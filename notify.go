package lockreg

import (
	"context"
	"fmt"

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
	r.subscribed.Store(true)
	return nil
}

// route delivers notifications until Close. go-redis resubscribes after a
// lost connection on its own; what is published meanwhile is lost, which
// costs the waiters at most a retry interval.
func (r *Registry) route(stop context.Context, sub *redis.PubSub) {
	defer sub.Close()
	messages := sub.Channel()
	for {
		select {
		case <-stop.Done():
			return
		case msg, ok := <-messages:
			if !ok {
				return
			}
			r.stats.notes.Add(1)
			if local, ok := r.locals.m.Load(msg.Payload); ok {
				select {
				case local.wake <- struct{}{}:
				default: // already woken
				}
			}
		}
	}
}
