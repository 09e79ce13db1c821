//go:build linux

package main

import (
	"slices"
	"sort"
	"time"
)

// recovery measures, for each fault, the time from its end to the next
// fresh acquisition that shows the fault is over: the victim's own, for a
// network fault (its connections work again); of a key the victim held,
// for stop and kill-9; of a key the killed primary served, after a
// failover (from the promotion); of the moved key, after a migration; of
// any key otherwise. A fault nothing recovered from by the end is a
// violation. It also measures takeovers: from the start of a stop, kill-9
// or stall to another worker's fresh acquisition of the victim's key,
// which the victim's lease bounds; and from a failover's kill to the
// promotion.
func (a *analysis) recovery() {
	h, r := a.h, a.res
	byKey := make(map[string][]int64)
	byWorker := make(map[int][]int64)
	var all []int64
	takers := make(map[string][]int) // fresh holds by key, in enter order
	for _, hd := range h.holds {
		if hd.fresh {
			byKey[hd.key] = append(byKey[hd.key], hd.enter)
			byWorker[hd.worker] = append(byWorker[hd.worker], hd.enter)
			all = append(all, hd.enter)
		}
	}
	for key, idx := range a.byKey {
		for _, i := range idx {
			if h.holds[i].fresh {
				takers[key] = append(takers[key], i)
			}
		}
	}
	for _, s := range byKey {
		slices.Sort(s)
	}
	for _, s := range byWorker {
		slices.Sort(s)
	}
	slices.Sort(all)
	byKind := make(map[string][]time.Duration)
	var samples, takeovers []time.Duration
	promotions := make(map[string][]time.Duration)
	for _, f := range h.faults {
		var first int64
		found := false
		switch {
		case f.kind == faultNetStall || f.kind == faultNetDelay || f.kind == faultNetReset:
			first, found = next(byWorker[f.worker], f.end)
		case len(f.keys) == 0:
			first, found = next(all, f.end)
		default:
			for _, k := range f.keys {
				if t, ok := next(byKey[k], f.end); ok && (!found || t < first) {
					first, found = t, true
				}
			}
		}
		fr := faultResult{Kind: f.kind, Variant: f.variant, Note: f.note, RecoveryMs: -1}
		if isFailover(f.kind) {
			d := time.Duration(f.end - f.start)
			promotions[f.variant] = append(promotions[f.variant], d)
			fr.TakeoverMs = ms(d)
		}
		if !found {
			r.Unrecovered++
			r.violation("no fresh acquisition after the %s fault that ended at %s", f.kind, a.at(f.end))
		} else {
			d := time.Duration(first - f.end)
			byKind[f.kind] = append(byKind[f.kind], d)
			samples = append(samples, d)
			fr.RecoveryMs = ms(d)
		}
		if isFailover(f.kind) {
			r.Failovers = append(r.Failovers, fr)
		}
		if f.kind == faultStop || f.kind == faultKill || f.kind == faultNetStall {
			if taken, ok := a.takeover(f, takers); ok {
				takeovers = append(takeovers, time.Duration(taken-f.start))
			}
		}
	}
	r.Recovery = recoveries(byKind)
	r.RecoveryAll = newRecovery(samples)
	r.Takeover = newRecovery(takeovers)
	r.Promotion = recoveries(promotions)
}

// next returns the first time in s, sorted, at or after t.
func next(s []int64, t int64) (int64, bool) {
	i, _ := slices.BinarySearch(s, t)
	if i == len(s) {
		return 0, false
	}
	return s[i], true
}

// takeover returns when another worker first took a key the victim of f
// held, fresh, after f began.
func (a *analysis) takeover(f fault, takers map[string][]int) (int64, bool) {
	first, found := int64(0), false
	for _, k := range f.keys {
		idx := takers[k]
		n := sort.Search(len(idx), func(n int) bool { return a.h.holds[idx[n]].enter >= f.start })
		for _, i := range idx[n:] {
			if hd := &a.h.holds[i]; hd.worker != f.worker {
				if !found || hd.enter < first {
					first, found = hd.enter, true
				}
				break
			}
		}
	}
	return first, found
}
