package lockreg

import (
	"math"
	"time"
)

// lapseTimer is the watchdog's timer for the first live lease's end, so
// that a lease that runs out unrenewed (Redis paused, gone or failing),
// which frees the key in Redis then, is lost then, not at the next tick,
// up to lease/3 later, while the work under its hold goes on.
type lapseTimer struct {
	timer *time.Timer
	at    int64 // the instant it fires at, or math.MaxInt64 when stopped
}

func newLapseTimer() *lapseTimer {
	t := &lapseTimer{timer: time.NewTimer(time.Hour), at: math.MaxInt64}
	t.timer.Stop()
	return t
}

// set moves the timer to end, if that comes sooner.
func (t *lapseTimer) set(end int64) {
	if end < t.at {
		t.at = end
		t.timer.Reset(time.Until(instant(end).time()))
	}
}

// nextLapse sets t to the end of the first lease still live. Leases that
// renewals carry on move past it, and it finds none over.
func (r *Registry) nextLapse(t *lapseTimer) {
	t.timer.Stop()
	t.at = math.MaxInt64
	now := int64(nowInstant())
	r.forEachHold(func(h *Hold) {
		if end := h.tenure.leaseEnd.Load(); end > now && !h.isLost() {
			t.set(end)
		}
	})
}
