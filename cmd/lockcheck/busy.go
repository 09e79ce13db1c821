//go:build linux

package main

import (
	"fmt"
	"slices"
	"time"
)

// A long wait is fair when the key was held by others all along: a FIFO
// lock under more demand than one holder can serve makes some waits long,
// and the more so as the critical sections grow (-long). A wait during
// which the key often sat free is what a lock that loses its waiters
// shows. Each long wait the report names says which it was.

// busyStretch is how a key was used over a window of a wait.
type busyStretch struct {
	held        time.Duration // the union of the holds' intervals in the window
	holds       int           // holds that entered within the window
	longestFree time.Duration // the longest stretch nobody held the key
	freeAt      int64         // where that stretch began
}

// busy measures key over [from, to]. A hold counts from its entry to its
// exit; a hold whose worker died inside counts until a lease after the
// death, as the key stays taken in Redis until its lease runs out.
func (a *analysis) busy(key string, from, to int64) busyStretch {
	type span struct{ s, e int64 }
	var spans []span
	var b busyStretch
	for _, i := range a.byKey[key] {
		hd := a.h.holds[i]
		end := hd.exit
		if end == 0 {
			end = a.death[hd.worker] + a.lease
		}
		if end <= from || hd.enter >= to {
			continue
		}
		if hd.enter >= from {
			b.holds++
		}
		spans = append(spans, span{max(hd.enter, from), min(end, to)})
	}
	slices.SortFunc(spans, func(x, y span) int { return int(x.s - y.s) })
	covered := from // the end of the union so far
	for _, sp := range spans {
		if sp.s > covered {
			b.noteFree(covered, sp.s)
		}
		if sp.e > covered {
			b.held += time.Duration(sp.e - max(sp.s, covered))
			covered = sp.e
		}
	}
	if to > covered {
		b.noteFree(covered, to)
	}
	return b
}

func (b *busyStretch) noteFree(from, to int64) {
	if d := time.Duration(to - from); d > b.longestFree {
		b.longestFree, b.freeAt = d, from
	}
}

// describeUse says how the key was used during a wait of the window's length.
func (a *analysis) describeUse(b busyStretch, window time.Duration) string {
	if window <= 0 {
		return "no time"
	}
	s := fmt.Sprintf("held %.0f%% of it by others, who entered %d times", 100*float64(b.held)/float64(window), b.holds)
	if b.longestFree > 0 {
		s += fmt.Sprintf(", longest free stretch %v from %s", b.longestFree.Round(time.Millisecond), a.at(b.freeAt))
	}
	return s
}
