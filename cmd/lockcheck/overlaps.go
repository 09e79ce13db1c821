//go:build linux

package main

import "slices"

// overlaps finds live intervals of one key that intersect, one overlap per
// hold that entered while an earlier one was live. Holds in one registry
// are serialized by its local mutex, so this covers them too.
//
// Every overlap is classified by what the earlier hold learnt: reported
// if it saw Lost() close or its unlock returned ErrLockLost, at any time,
// silent otherwise. An overlap across a failover (the earlier hold rests
// on a call sent before a replica of its key's primary took over, the
// later one entered after) is what asynchronous replication allows: it
// must be reported. Any other overlap is a violation.
func (a *analysis) overlaps() {
	for key, idx := range a.byKey {
		reach := -1 // the live hold whose interval reaches furthest so far
		for _, i := range idx {
			if !a.isLive(i) {
				continue
			}
			if reach >= 0 && a.h.Holds[i].Enter < a.live[reach] {
				a.overlap(key, reach, i)
			}
			if reach < 0 || a.live[i] > a.live[reach] {
				reach = i
			}
		}
	}
	a.atFailovers()
}

// overlap files the overlap of hold later with the live hold earlier.
func (a *analysis) overlap(key string, earlier, later int) {
	r, e := a.res, &a.h.Holds[earlier]
	reported := e.Lost > 0 || e.Unlock == UnlockLost
	r.Overlaps++
	if reported {
		r.OverlapsReported++
	} else {
		r.OverlapsSilent++
	}
	s, across := a.acrossFailover(key, e, &a.h.Holds[later])
	switch {
	case !across:
		r.OverlapsOutsideFailover++
		r.violation("overlap on key %s: %s entered while %s was live", key, a.describe(later), a.describe(earlier))
	case !reported:
		r.violation("silent overlap on key %s across the failover to %s at %s: %s entered while %s was live, which saw neither Lost nor ErrLockLost",
			key, s.Server, a.at(s.At), a.describe(later), a.describe(earlier))
	}
	if across {
		a.lostAtFailover[earlier] = true
	}
}

// acrossFailover returns a failover of key's primary after the call
// earlier rests on was sent (while the replaced primary may have taken
// writes it never passed on) and before later entered.
func (a *analysis) acrossFailover(key string, earlier, later *Hold) (Switch, bool) {
	for _, s := range a.h.Switches {
		if slices.Contains(s.Keys, key) && earlier.Root < max(s.At, s.Until) && later.Enter > s.Since {
			return s, true
		}
	}
	return Switch{}, false
}

// atFailovers counts the holds whose lease was live when a replica of
// their key's primary took over (at the watcher's last look before it saw
// the promotion), and of those the ones lost: they were told so (Lost,
// ErrLockLost), or another hold overlapped them across the failover. With
// -wait-replicas, each such hold had been acknowledged by a replica.
func (a *analysis) atFailovers() {
	r := a.res
	for _, s := range a.h.Switches {
		r.Switches++
		if !a.injected(s) {
			r.Spontaneous++
		}
	}
	for i := range a.h.Holds {
		hd := &a.h.Holds[i]
		if !a.isLive(i) {
			continue
		}
		for _, s := range a.h.Switches {
			if slices.Contains(s.Keys, hd.Key) && hd.Enter <= s.Since && a.live[i] > s.Since {
				r.AtFailover++
				if a.lostAtFailover[i] || hd.Lost > 0 || hd.Unlock == UnlockLost {
					r.LostAtFailover++
				}
				break
			}
		}
	}
}

// injected reports whether s is the promotion an injected failover caused:
// seen between its kill and a lease after the injector saw it.
func (a *analysis) injected(s Switch) bool {
	for _, f := range a.h.Faults {
		if isFailover(f.Kind) && s.At >= f.Start && s.Since <= f.End+a.lease {
			return true
		}
	}
	return false
}
