//go:build linux

package main

import (
	"cmp"
	"maps"
	"slices"
	"sort"
)

// tokens checks that no two holds of a key share a token, and that a fresh
// acquisition's token is above that of every hold of the key that had
// entered before the acquisition began, whether that hold's lease was live
// or not: across Redis restarts too, where only the server clock keeps
// tokens rising.
func (a *analysis) tokens() {
	h := a.h
	for key, idx := range a.byKey {
		seen := make(map[int64]int, len(idx))
		for _, i := range idx {
			if j, dup := seen[h.holds[i].token]; dup {
				a.res.DuplicateToken++
				a.res.violation("duplicate token on key %s: %s and %s", key, a.describe(j), a.describe(i))
			}
			seen[h.holds[i].token] = i
		}
		// top[n] is the hold with the highest token among the first n+1
		// to enter.
		top := make([]int, len(idx))
		for n, i := range idx {
			top[n] = i
			if n > 0 && h.holds[top[n-1]].token > h.holds[i].token {
				top[n] = top[n-1]
			}
		}
		for _, i := range idx {
			hd := &h.holds[i]
			if !hd.fresh {
				continue
			}
			n := sort.Search(len(idx), func(n int) bool { return h.holds[idx[n]].enter >= hd.acq })
			if n > 0 && h.holds[top[n-1]].token >= hd.token {
				a.res.TokenOrder++
				a.res.violation("token order on key %s: %s, acquired from %s, got a token not above %s",
					key, a.describe(i), a.at(hd.acq), a.describe(top[n-1]))
			}
		}
	}
}

// storeOp is one answered fenced-store call.
type storeOp struct {
	storeCall
	token int64
	write bool
	hold  int
}

// fencing replays each record's answered store calls in the order the
// history proves: a call sent after another was answered came after it.
// A call is stale if an accepted call with a higher token was answered
// before it was sent; the store must reject every stale call.
func (a *analysis) fencing() {
	h := a.h
	ops := make(map[string][]storeOp)
	for i, hd := range h.holds {
		for n, op := range []storeCall{hd.read, hd.write} {
			if op.Outcome == storeAccepted || op.Outcome == storeRejected {
				ops[hd.key] = append(ops[hd.key], storeOp{storeCall: op, token: hd.token, write: n == 1, hold: i})
			}
		}
	}
	for key, list := range ops {
		var accepted []storeOp
		for _, op := range list {
			if op.Outcome == storeAccepted {
				accepted = append(accepted, op)
			}
		}
		slices.SortFunc(accepted, func(x, y storeOp) int { return cmp.Compare(x.Done, y.Done) })
		slices.SortFunc(list, func(x, y storeOp) int { return cmp.Compare(x.Sent, y.Sent) })
		var newest storeOp // the highest-token accepted call answered so far
		next := 0
		for _, op := range list {
			for ; next < len(accepted) && accepted[next].Done < op.Sent; next++ {
				if accepted[next].token > newest.token {
					newest = accepted[next]
				}
			}
			tally := &a.res.StaleReads
			kind := "read"
			if op.write {
				tally, kind = &a.res.StaleWrites, "write"
			}
			switch {
			case newest.token > op.token && op.Outcome == storeRejected:
				tally.Rejected++
			case newest.token > op.token:
				tally.Accepted++
				a.res.violation("stale %s accepted on key %s: %s sent it at %s, after token %d was accepted at %s",
					kind, key, a.describe(op.hold), a.at(op.Sent), newest.token, a.at(newest.Done))
			case op.Outcome == storeRejected:
				// The newer call overlapped this one in time, or its worker
				// died before it could report it.
				a.res.RaceRejected++
			}
		}
	}
}

// increments compares the store's own tally of accepted increments with
// its value: every accepted increment of a value another accepted increment
// also wrote is lost. The workers' reports must agree with the store's
// tallies (a killed worker may have left some calls unreported).
func (a *analysis) increments() {
	h, r := a.h, a.res
	seen := make(map[string]int64)
	writes := make(map[string]map[int64]int)
	rejected := make(map[string]int64)
	for i, hd := range h.holds {
		for _, op := range []storeCall{hd.read, hd.write} {
			if op.Outcome == storeRejected {
				rejected[hd.key]++
			}
		}
		if hd.write.Outcome != storeAccepted {
			continue
		}
		seen[hd.key]++
		if writes[hd.key] == nil {
			writes[hd.key] = make(map[int64]int)
		}
		if j, dup := writes[hd.key][hd.writeValue]; dup {
			r.violation("lost increment on key %s: %s and %s both wrote %d", hd.key, a.describe(j), a.describe(i), hd.writeValue)
		}
		writes[hd.key][hd.writeValue] = i
	}
	for _, key := range slices.Sorted(maps.Keys(h.records)) {
		rec := h.records[key]
		r.Increments += rec.Accepted
		r.StoreRejected += rec.RejectedReads + rec.RejectedWrites
		r.IncrementsSeen += seen[key]
		r.FinalValue += rec.Value
		if lost := rec.Accepted - rec.Value; lost != 0 {
			r.LostIncrements += lost
			r.violation("key %s: the store accepted %d increments but holds %d", key, rec.Accepted, rec.Value)
		}
		if seen[key] > rec.Accepted {
			r.violation("key %s: workers saw %d increments accepted, the store counted %d", key, seen[key], rec.Accepted)
		}
		if rejected[key] > rec.RejectedReads+rec.RejectedWrites {
			r.violation("key %s: workers saw %d calls rejected, the store counted %d", key, rejected[key], rec.RejectedReads+rec.RejectedWrites)
		}
	}
}
