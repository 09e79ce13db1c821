//go:build linux

package main

import (
	"cmp"
	"fmt"
	"slices"
	"time"
)

// A long wait has three possible reasons, and each long wait the report
// names says how much of it went to each: others held the key (a fair lock
// under more demand than one holder serves makes long waits, the more so
// as critical sections grow: -long), a fault kept the key from everyone
// (a failover, a migration, a stopped or killed holder whose lease had to
// run out), or the key sat free with nobody taking it, which is what a
// lock that loses its waiters shows.

// keyUse is how a key was used over a window of a wait.
type keyUse struct {
	held        time.Duration // some hold had entered and not exited
	down        time.Duration // not held, within a fault's reach (faultReach)
	free        time.Duration // neither
	entries     int           // holds that entered within the window
	longestFree time.Duration // the longest stretch of free time
	freeAt      int64         // where that stretch began
}

// longWaitUse sums the keyUse of many waits, in seconds.
type longWaitUse struct {
	HeldS float64 `json:"held_s"`
	DownS float64 `json:"down_s"`
	FreeS float64 `json:"free_s"`
}

func (l *longWaitUse) add(u keyUse) {
	l.HeldS += u.held.Seconds()
	l.DownS += u.down.Seconds()
	l.FreeS += u.free.Seconds()
}

// shares are the parts of the waits' time, in percent: held, down, free.
func (l longWaitUse) shares() (held, down, free float64) {
	total := l.HeldS + l.DownS + l.FreeS
	if total == 0 {
		return 0, 0, 0
	}
	return 100 * l.HeldS / total, 100 * l.DownS / total, 100 * l.FreeS / total
}

// use measures key over [from, to]. A hold counts from its entry to its
// exit; a hold whose worker died inside counts until a lease after the
// death, as the key stays taken in Redis until its lease runs out.
func (a *analysis) use(key string, from, to int64) keyUse {
	type span struct {
		s, e int64
		hold bool
	}
	var spans []span
	var u keyUse
	for _, i := range a.byKey[key] {
		hd := a.h.holds[i]
		end := hd.exit
		if end == 0 {
			end = a.death[hd.worker] + a.lease
		}
		if end > from && hd.enter < to {
			spans = append(spans, span{hd.enter, end, true})
			if hd.enter >= from {
				u.entries++
			}
		}
	}
	for _, f := range a.h.faults {
		if s, e, ok := a.faultReach(f, key); ok && e > from && s < to {
			spans = append(spans, span{s, e, false})
		}
	}
	// Sweep the window's elementary segments, between the spans' ends.
	cuts := []int64{from, to}
	for _, sp := range spans {
		cuts = append(cuts, min(max(sp.s, from), to), min(max(sp.e, from), to))
	}
	slices.Sort(cuts)
	cuts = slices.Compact(cuts)
	slices.SortFunc(spans, func(x, y span) int { return cmp.Compare(x.s, y.s) })
	freeSince := int64(-1)
	for i := 0; i+1 < len(cuts); i++ {
		s, e := cuts[i], cuts[i+1]
		held, down := false, false
		for _, sp := range spans {
			if sp.s > s {
				break
			}
			if sp.e >= e {
				held, down = held || sp.hold, down || !sp.hold
			}
		}
		d := time.Duration(e - s)
		switch {
		case held:
			u.held += d
		case down:
			u.down += d
		default:
			u.free += d
			if freeSince < 0 {
				freeSince = s
			}
			if run := time.Duration(e - freeSince); run > u.longestFree {
				u.longestFree, u.freeAt = run, freeSince
			}
			continue
		}
		freeSince = -1
	}
	return u
}

// faultReach is the stretch over which fault f kept key from every
// worker, if it did: a failover or migration that moved the key, from its
// start to its end (the promotion; the last key moved); a stop, kill or
// network stall of a worker that held the key, a lease from its start, as
// the key stays the victim's until its lease runs out; a fault of the
// whole lock Redis (a restart, a pause, a DEBUG SLEEP) from its start to
// its end. Other faults (a delay, a reset, the key faults) do not keep a
// key from the others.
func (a *analysis) faultReach(f fault, key string) (start, end int64, ok bool) {
	switch f.kind {
	case faultFailover, faultClusterFailover, faultMigrate:
		return f.start, f.end, slices.Contains(f.keys, key)
	case faultStop, faultKill, faultNetStall:
		return f.start, f.start + a.lease, slices.Contains(f.keys, key)
	case faultRestart, faultPause, faultSleep:
		return f.start, f.end, true
	}
	return 0, 0, false
}

// describeUse says how the key was used during a wait of the window's
// length.
func (a *analysis) describeUse(u keyUse, window time.Duration) string {
	if window <= 0 {
		return "never waited for"
	}
	pct := func(d time.Duration) float64 { return 100 * float64(d) / float64(window) }
	began := fmt.Sprintf("%d holds began in it", u.entries)
	if u.entries == 1 {
		began = "1 hold began in it"
	}
	s := fmt.Sprintf("held %.0f%% of it by others (%s); down %.0f%% by faults; free %.0f%%",
		pct(u.held), began, pct(u.down), pct(u.free))
	if u.longestFree > 0 {
		s += fmt.Sprintf(", at most %v at a stretch, from %s", u.longestFree.Round(time.Millisecond), a.at(u.freeAt))
	}
	return s
}
