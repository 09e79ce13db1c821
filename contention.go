package lockreg

import (
	"context"
	"time"

	"github.com/puzpuzpuz/xsync/v3"
)

// contention is what a registry remembers of the contention on its keys,
// by key, for as long as it matters.
type contention struct {
	// contended holds until when each key counts as contended: a lease
	// after this registry found it taken by another registry, or released
	// it while another waited. An attempt on a contended key goes straight
	// to obtain.lua, as a plain SET would likely fail and cost a round
	// trip, and its release sends release.lua all its arguments. A release
	// nobody waited for does not end that: under intermittent contention,
	// an extra round trip costs far more than the few microseconds the
	// plain path saves.
	contended *xsync.MapOf[string, time.Time]
	forLease  time.Duration
	// yields holds until when this registry's next acquisition of a key
	// waits, after a release that another registry waited for: it lets
	// that registry take the key first, or the releasing process, which
	// needs no notification, would nearly always win. yieldFor is how
	// long: a round trip or two, time for the waiter to hear of the
	// release by pub/sub; a retry interval without pub/sub.
	yields   *xsync.MapOf[string, time.Time]
	yieldFor time.Duration
}

func newContention(cfg *config) contention {
	c := contention{
		contended: xsync.NewMapOf[string, time.Time](), forLease: cfg.expireAfter,
		yields: xsync.NewMapOf[string, time.Time](), yieldFor: cfg.retryInterval,
	}
	if cfg.pubSub {
		c.yieldFor = min(pubSubYield, cfg.retryInterval)
	}
	return c
}

// looksContended reports whether key counts as contended.
func (c *contention) looksContended(key string) bool {
	until, ok := c.contended.Load(key)
	return ok && time.Now().Before(until)
}

// saw records contention on key.
func (c *contention) saw(key string) {
	c.contended.Store(key, time.Now().Add(c.forLease))
}

// yieldAfter records a release of key that another registry waited for.
func (c *contention) yieldAfter(key string) {
	c.yields.Store(key, time.Now().Add(c.yieldFor))
}

// yield waits, before an acquisition's first attempt on key, while a
// release of it asks to (see yields), or until ctx ends (its error) or the
// registry closes (ErrClosed). An acquisition that cannot wait (TryLock,
// which makes one attempt without waiting) gets errBusy instead, at once,
// as the key is promised to the registry the yield is for; the yield is
// left for the next acquisition.
func (c *contention) yield(ctx context.Context, closed <-chan struct{}, key string, wait bool) error {
	if !wait {
		if until, ok := c.yields.Load(key); ok && time.Now().Before(until) {
			return errBusy
		}
		return nil
	}
	until, ok := c.yields.LoadAndDelete(key)
	if !ok || !time.Now().Before(until) {
		return nil
	}
	t := time.NewTimer(time.Until(until))
	defer t.Stop()
	return waitFor(ctx, closed, t.C)
}

// forgetLapsed drops the deadlines that passed: yields nobody came for,
// contention long over.
func (c *contention) forgetLapsed() {
	for _, m := range []*xsync.MapOf[string, time.Time]{c.contended, c.yields} {
		m.Range(func(key string, _ time.Time) bool {
			m.Compute(key, func(until time.Time, loaded bool) (time.Time, bool) {
				return until, !loaded || time.Now().After(until)
			})
			return true
		})
	}
}

// waitFor waits until done delivers or closes (nil), ctx ends (ctx.Err())
// or the registry closes (ErrClosed).
func waitFor[T any](ctx context.Context, closed <-chan struct{}, done <-chan T) error {
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-closed:
		return ErrClosed
	}
}
