//go:build linux

package main

import (
	"slices"
	"time"
)

// overlaps finds live intervals of one key that intersect, one overlap per
// hold that entered while an earlier one was live. Holds in one registry
// are serialized by its local mutex, so this covers them too.
//
// Every overlap is classified by what the earlier hold learnt: reported
// if it saw Lost() close or its unlock returned ErrLockLost, at any time,
// silent otherwise. An overlap across a failover (the earlier hold rests
// on a call sent before a replica of its key's primary took over, the
// later one entered after) is what asynchronous replication allows: it
// must be reported. So is one after a key fault (a DEL, an overwrite, a
// flush or an eviction of the key after the call the hold with the lower
// token rests on was sent, and before the other entered), which freed the
// key for one of the two while the other, not told yet, held it from
// before, live by its own count. That one has the lower token (a fresh
// token after the fault is above every earlier one), and its report
// counts; it may be the later of the two, a local hand-off of the stale
// key. Any other overlap is a violation.
func (a *analysis) overlaps() {
	for key, idx := range a.byKey {
		reach := -1      // the live hold whose interval reaches furthest so far
		var active []int // the live holds whose interval may reach further on
		for _, i := range idx {
			if !a.isLive(i) {
				continue
			}
			enter := a.h.holds[i].enter
			active = slices.DeleteFunc(active, func(j int) bool { return a.live[j] <= enter })
			if len(active) > 0 {
				a.overlapWith(key, active, reach, i)
			}
			active = append(active, i)
			if reach < 0 || a.live[i] > a.live[reach] {
				reach = i
			}
		}
	}
	a.res.KeyOverlap = newBlindTime(a.keyOverlaps)
	a.atFailovers()
}

// overlapWith files the overlap of hold later, which entered while the
// holds active were live: with the first of them that nothing explains
// it with, if any (a hold that met several must be cleared against each:
// a stale holder told of a key fault explains no overlap between two
// holds that both entered after it), else with reach, the one whose
// interval reaches furthest.
func (a *analysis) overlapWith(key string, active []int, reach, later int) {
	with := reach
	for _, j := range active {
		v := a.judge(key, j, later)
		if v.across {
			a.lostAtFailover[j] = true
		}
		if v.violation() && !a.judge(key, with, later).violation() {
			with = j
		}
	}
	a.overlap(key, with, later)
}

// verdict is how an overlap of two holds is judged.
type verdict struct {
	s        primarySwitch
	across   bool // across a failover
	fi       int  // with changed, the key fault's index
	c        keyChange
	changed  bool // after a key fault's change
	told     int  // the hold whose report counts
	reported bool
}

// violation reports whether nothing explains the overlap.
func (v verdict) violation() bool { return !v.reported || !v.across && !v.changed }

// judge classifies the overlap of hold later with the live hold earlier.
func (a *analysis) judge(key string, earlier, later int) verdict {
	e, l := &a.h.holds[earlier], &a.h.holds[later]
	var v verdict
	v.s, v.across = a.acrossFailover(key, e, l)
	// After a key fault, the hold with the lower token held the key from
	// before: its report counts.
	older, newer := earlier, later
	if l.token < e.token {
		older, newer = later, earlier
	}
	v.fi, v.c, v.changed = a.acrossKeyChange(key, &a.h.holds[older], &a.h.holds[newer])
	v.told = earlier
	if v.changed && !v.across {
		v.told = older
	}
	t := &a.h.holds[v.told]
	v.reported = t.lost > 0 || t.unlock == unlockLost
	return v
}

// overlap files the overlap of hold later with the live hold earlier.
func (a *analysis) overlap(key string, earlier, later int) {
	r, l := a.res, &a.h.holds[later]
	v := a.judge(key, earlier, later)
	s, across, fi, c, changed, told, reported := v.s, v.across, v.fi, v.c, v.changed, v.told, v.reported
	t := &a.h.holds[told]
	r.Overlaps++
	if reported {
		r.OverlapsReported++
	} else {
		r.OverlapsSilent++
	}
	switch {
	case across && !reported:
		r.violation("silent overlap on key %s across the failover to %s at %s: %s entered while %s was live, which saw neither Lost nor ErrLockLost",
			key, s.server, a.at(s.at), a.describe(later), a.describe(earlier))
	case across:
	case changed:
		a.stale[fi] = append(a.stale[fi], staleHold{hold: told, c: c})
		if !reported {
			if at, _, _ := a.notice(a.fromOn(told)); at != 0 && at <= c.hi+a.lease {
				r.SilentTenureTold++
			}
			r.violation("silent overlap on key %s after the %s fault at %s: %s entered while %s was live; %s held the key from before the fault and saw neither Lost nor ErrLockLost, its unlock %s (%s)",
				key, a.h.faults[fi].kind, a.at(c.hi), a.describe(later), a.describe(earlier), a.holdName(told), unlockName(t.unlock), a.tenureNotice(told, c))
			break
		}
		r.OverlapsAfterKeyFault++
		a.keyOverlaps = append(a.keyOverlaps, time.Duration(min(a.live[earlier], a.live[later])-l.enter))
	default:
		r.OverlapsOutsideFailover++
		r.violation("overlap on key %s: %s entered while %s was live", key, a.describe(later), a.describe(earlier))
	}
	if across {
		a.lostAtFailover[earlier] = true
	}
}

// acrossFailover returns a failover of key's primary after the call
// earlier rests on was sent (while the replaced primary may have taken
// writes it never passed on) and before later entered.
func (a *analysis) acrossFailover(key string, earlier, later *hold) (primarySwitch, bool) {
	for _, s := range a.h.switches {
		if slices.Contains(s.keys, key) && earlier.root < max(s.at, s.until) && later.enter > s.since {
			return s, true
		}
	}
	return primarySwitch{}, false
}

// atFailovers counts the holds whose lease was live when a replica of
// their key's primary took over (at the watcher's last look before it saw
// the promotion), and of those the ones lost: they were told so (Lost,
// ErrLockLost), or another hold overlapped them across the failover. With
// -wait-replicas, each such hold had been acknowledged by a replica.
func (a *analysis) atFailovers() {
	r := a.res
	for _, s := range a.h.switches {
		r.Switches++
		if !a.injected(s) {
			r.Spontaneous++
		}
	}
	for i := range a.h.holds {
		hd := &a.h.holds[i]
		if !a.isLive(i) {
			continue
		}
		for _, s := range a.h.switches {
			if slices.Contains(s.keys, hd.key) && hd.enter <= s.since && a.live[i] > s.since {
				r.AtFailover++
				if a.lostAtFailover[i] || hd.lost > 0 || hd.unlock == unlockLost {
					r.LostAtFailover++
				}
				break
			}
		}
	}
}

// injected reports whether s is the promotion an injected failover caused:
// seen between its kill and a lease after the injector saw it.
func (a *analysis) injected(s primarySwitch) bool {
	for _, f := range a.h.faults {
		if isFailover(f.kind) && s.at >= f.start && s.since <= f.end+a.lease {
			return true
		}
	}
	return false
}
