package lockreg

import (
	"slices"
	"time"
)

// The arm queue: the holds a tracker is to read on its tracking
// connection (tracking.go has the design), which armLoop (tracker.go)
// takes in turns.

// armRequest is a hold to arm, or to verify after an invalidation or a
// lost connection: cause is what a key found gone says happened. due, if
// set, is when to arm it at the earliest (see armDelay); invalidated, that
// it counts in its key's unchecked changes (locallock.go).
type armRequest struct {
	h           *Hold
	cause       LossCause
	due         time.Time
	invalidated bool
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

// enqueue queues req for armLoop, which it wakes unless its timer will.
func (t *tracker) enqueue(req armRequest) {
	t.mu.Lock()
	t.queue = append(t.queue, req)
	// A set timer falls due before this arming (holds are taken in time
	// order): waking armLoop for it would cost a goroutine switch per
	// acquisition.
	wake := req.due.IsZero() || !t.timerSet
	t.mu.Unlock()
	if wake {
		t.wake()
	}
}

// dueNow takes from the queue the requests due at now, and returns them
// with when armLoop's timer is to fire next (zero if nothing waits), which
// sets timerSet. An arming whose tenure has ended is dropped, due or not,
// and one whose hold has ended while a hold handed off from it keeps the
// key arms that hold instead. So is an arming of a tenure that a request
// reads at once (a verify after the connection came up, an invalidation):
// that read arms the key, and a second one could come after a forced
// unlock's DEL but before its note, which the target reads first, and
// name the loss deleted. t.mu is held.
func (t *tracker) dueNow(now time.Time) (due []armRequest, next time.Time) {
	var readAtOnce map[*tenure]bool
	if i := slices.IndexFunc(t.queue, func(req armRequest) bool { return !req.due.IsZero() }); i >= 0 {
		// An arming waits: the tenures read at once, if any (most turns
		// have only armings, or only reads, and need no map).
		for _, req := range t.queue {
			if req.due.IsZero() {
				if readAtOnce == nil {
					readAtOnce = make(map[*tenure]bool)
				}
				readAtOnce[req.h.tenure] = true
			}
		}
	}
	waiting := t.queue[:0]
	dropped := false
	for _, req := range t.queue {
		if !req.due.IsZero() {
			current := req.h.local.hold.Load()
			if current == nil || current.tenure != req.h.tenure || readAtOnce[current.tenure] {
				dropped = true
				continue
			}
			req.h = current
		}
		switch {
		case req.due.IsZero():
			due = append(due, req)
		case req.due.After(now):
			waiting = append(waiting, req)
			if next.IsZero() || req.due.Before(next) {
				next = req.due
			}
		default:
			due = append(due, req)
		}
	}
	// Most holds end before their arming. With none left waiting, the
	// timer is still set, for a sweep an arming delay on, while armings
	// come: else each acquisition, finding it unset, would wake armLoop,
	// which would find that hold ended already and leave it unset again.
	if next.IsZero() && dropped {
		next = now.Add(armDelay)
	}
	clear(t.queue[len(waiting):])
	t.queue, t.timerSet = waiting, !next.IsZero()
	return due, next
}
