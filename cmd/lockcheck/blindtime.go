//go:build linux

package main

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"sort"
	"time"
)

// keyFaultResult is what the checker found after one kind of key fault
// (del, overwrite, flush, evict): how many it injected, how many struck a
// tenure (a hold, and the local hand-offs after it, that rest on one
// obtain or grant), and how long each struck holder stayed blind.
type keyFaultResult struct {
	Injections int `json:"injections"`
	Hit        int `json:"hit_held_key"` // injections that struck at least one tenure
	Struck     int `json:"tenures_struck"`
	// Told: by Lost, or by an unlock that returned ErrLockLost (the
	// release began before Lost could fire); Untold: not within a lease
	// of the change (a violation); CutShort: neither, but its worker was
	// killed or its unlock failed with a Redis error.
	ToldByLost   int            `json:"told_by_lost"`
	ToldByUnlock int            `json:"told_by_unlock"`
	Untold       int            `json:"not_told_within_lease"`
	CutShort     int            `json:"cut_short"`
	Blind        blindTime      `json:"blind_time"`
	Causes       map[string]int `json:"causes"` // the causes Lost named
	// OtherCause counts the holders told by Lost with another cause than
	// the fault's own (deleted, overwritten, flushed, evicted).
	OtherCause int `json:"other_cause"`
}

// expectedCause is the LossCause each key fault should make Lost name.
var expectedCause = map[string]string{
	faultDel: "deleted", faultOverwrite: "overwritten", faultFlush: "flushed", faultEvict: "evicted",
}

// causeRelease tallies the holders told by their unlock's ErrLockLost.
const causeRelease = "(unlock)"

// blindTime summarizes durations: how many, and their p50, p99 and max.
type blindTime struct {
	N       int     `json:"n"`
	P50Ms   float64 `json:"p50_ms"`
	P99Ms   float64 `json:"p99_ms"`
	MaxMs   float64 `json:"max_ms"`
	samples []time.Duration
}

func newBlindTime(samples []time.Duration) blindTime {
	b := blindTime{N: len(samples), samples: samples}
	if len(samples) > 0 {
		s := slices.Sorted(slices.Values(samples))
		b.P50Ms, b.P99Ms, b.MaxMs = ms(percentile(s, 50)), ms(percentile(s, 99)), ms(s[len(s)-1])
	}
	return b
}

// percentile is the nearest-rank p-th percentile of s, sorted and not
// empty: the least value with at least p% of s at or below it.
func percentile(s []time.Duration, p int) time.Duration {
	return s[max((len(s)*p+99)/100, 1)-1]
}

// tenure is a run of one worker's holds of a key that rest on one obtain
// or grant (its root): a hold and the local hand-offs after it. Redis
// sees one owner throughout, so a change of the key strikes the tenure.
type tenure struct {
	worker int
	key    string
	root   int64
}

// tenures indexes the holds by tenure, each tenure's in enter order.
func (a *analysis) tenures() map[tenure][]int {
	out := make(map[tenure][]int)
	for _, idx := range a.byKey {
		for _, i := range idx {
			hd := &a.h.holds[i]
			if hd.root != 0 {
				t := tenure{hd.worker, hd.key, hd.root}
				out[t] = append(out[t], i)
			}
		}
	}
	return out
}

// notice is when the holder of holds, a tenure's from one hold on, was
// first told that it may have lost the key: Lost fired, or an unlock
// returned ErrLockLost; and whether by Lost, and the cause Lost named.
// A tenure whose last hold was handed off to a hold that got no token, as
// it was lost, was told when that hold's Token returned ErrLockLost.
func (a *analysis) notice(holds []int) (at int64, byLost bool, cause string) {
	for _, i := range holds {
		hd := &a.h.holds[i]
		if hd.lost > 0 {
			return hd.lost, true, hd.cause
		}
		if hd.unlock == unlockLost {
			return hd.unlocked, false, causeRelease
		}
	}
	if last := &a.h.holds[holds[len(holds)-1]]; last.unlock == unlockOK {
		if t, ok := a.handedOffTokenless(last); ok {
			return t.told, true, t.cause
		}
	}
	return 0, false, ""
}

// nextOf tells what followed hd in its worker: its next hold of the key.
func (a *analysis) nextOf(hd *hold) string {
	idx := a.byKey[hd.key]
	n := sort.Search(len(idx), func(n int) bool { return a.h.holds[idx[n]].enter > hd.exit })
	for ; n < len(idx); n++ {
		if h := &a.h.holds[idx[n]]; h.worker == hd.worker {
			how := "fresh"
			if !h.fresh {
				how = "a hand-off"
			}
			return fmt.Sprintf("its worker's next hold of the key, %s resting on a call sent at %s: %s", how, a.at(h.root), a.describe(idx[n]))
		}
	}
	return "its worker held the key no more"
}

// handedOffTokenless returns the hold without a token that hd's unlock
// handed off to: a hand-off of its worker and key, the first hold of them
// after hd's exit.
func (a *analysis) handedOffTokenless(hd *hold) (tokenless, bool) {
	next := int64(math.MaxInt64) // the worker's next hold of the key with a token
	idx := a.byKey[hd.key]
	n := sort.Search(len(idx), func(n int) bool { return a.h.holds[idx[n]].enter > hd.exit })
	for ; n < len(idx); n++ {
		if h := &a.h.holds[idx[n]]; h.worker == hd.worker {
			next = h.enter
			break
		}
	}
	own := a.tokenless[wk{hd.worker, hd.key}]
	n = sort.Search(len(own), func(n int) bool { return own[n].enter >= hd.exit })
	if n < len(own) && own[n].handoff && own[n].enter < next {
		return own[n], true
	}
	return tokenless{}, false
}

// tenureEnd is when the last hold of a tenure exited, or, if its worker
// died inside, when it died.
func (a *analysis) tenureEnd(holds []int) int64 {
	hd := &a.h.holds[holds[len(holds)-1]]
	if hd.exit > 0 {
		return hd.exit
	}
	return a.death[hd.worker]
}

// indexKeyFaults builds the indexes the key faults' analysis needs, if
// the history has key faults: the tenures, and the lost holds without a
// token.
func (a *analysis) indexKeyFaults() {
	h := a.h
	if !slices.ContainsFunc(h.faults, func(f fault) bool { return isKeyFault(f.kind) }) {
		return
	}
	a.byTenure = a.tenures()
	a.tenureOf = make(map[int]tenure, len(h.holds))
	for t, idx := range a.byTenure {
		for _, i := range idx {
			a.tenureOf[i] = t
		}
	}
	a.tokenless = make(map[wk][]tokenless)
	for _, t := range h.tokenless {
		a.tokenless[wk{t.worker, t.key}] = append(a.tokenless[wk{t.worker, t.key}], t)
	}
	for _, s := range a.tokenless {
		slices.SortFunc(s, func(x, y tokenless) int { return cmp.Compare(x.enter, y.enter) })
	}
	a.stale = make(map[int][]staleHold)
}

// staleHold is a hold that overlapped another after a key fault's change
// c, holding the key from before it.
type staleHold struct {
	hold int
	c    keyChange
}

// keyFaults finds, for each change a key fault made, the tenures it
// struck: a hold of the key had entered by the change's lo, its live
// interval reached past lo, and the tenure went on until the change's hi
// at least (a hold that left between lo and hi may have let go of the key
// before the change: it is left out); and those that overlaps found
// holding the key from before the change while another held it after,
// whose change struck them whenever they entered. For each, it measures
// the blind time, from hi to the first notice (Lost, or an unlock's
// ErrLockLost), and whether another worker took the key after that notice
// while the holder was still inside: legitimate, it had been told.
func (a *analysis) keyFaults() {
	h, r := a.h, a.res
	if a.byTenure == nil {
		return
	}
	acc := make(map[string]*keyFaultResult)
	samples := make(map[string][]time.Duration)
	// No hold lasts this long: a change looks that far back for holds.
	window := max(10*a.lease, int64(h.wait))
	for fi, f := range h.faults {
		if !isKeyFault(f.kind) {
			continue
		}
		kr := acc[f.kind]
		if kr == nil {
			kr = &keyFaultResult{Causes: make(map[string]int)}
			acc[f.kind] = kr
		}
		kr.Injections++
		struck := make(map[tenure]bool)
		file := func(c keyChange, i int) {
			t := a.tenureOf[i]
			holds := a.byTenure[t]
			struck[t] = true
			a.struck(f, c, kr, holds[slices.Index(holds, i):], func(d time.Duration) { samples[f.kind] = append(samples[f.kind], d) })
		}
		for _, c := range f.changes {
			idx := a.byKey[c.key]
			n := sort.Search(len(idx), func(n int) bool { return h.holds[idx[n]].enter > c.lo })
			for n--; n >= 0 && h.holds[idx[n]].enter >= c.lo-window; n-- {
				i := idx[n]
				t, ok := a.tenureOf[i]
				if !ok || struck[t] || a.live[i] <= c.lo || a.tenureEnd(a.byTenure[t]) < c.hi {
					continue
				}
				file(c, i)
			}
		}
		for _, s := range a.stale[fi] {
			t := a.tenureOf[s.hold]
			if struck[t] {
				continue
			}
			// From its first hold still inside when the change began.
			holds := a.byTenure[t]
			from := slices.IndexFunc(holds, func(i int) bool { e := a.h.holds[i].exit; return e == 0 || e >= s.c.lo })
			file(s.c, holds[max(from, 0)])
		}
		kr.Struck += len(struck)
		if len(struck) > 0 {
			kr.Hit++
		}
	}
	r.KeyFaults = make(map[string]keyFaultResult, len(acc))
	for kind, kr := range acc {
		kr.Blind = newBlindTime(samples[kind])
		r.KeyFaults[kind] = *kr
	}
}

// struck files a tenure that change c of fault f struck, from the hold
// inside at c on (holds).
func (a *analysis) struck(f fault, c keyChange, kr *keyFaultResult, holds []int, sample func(time.Duration)) {
	r := a.res
	first := &a.h.holds[holds[0]]
	at, byLost, cause := a.notice(holds)
	last := &a.h.holds[holds[len(holds)-1]]
	if at == 0 || at > c.hi+a.lease {
		switch {
		case at == 0 && (last.exit == 0 || last.unlock == unlockFailed):
			kr.CutShort++
			return
		case at == 0:
			kr.Untold++
			r.Untold++
			r.violation("the %s fault at %s changed key %s under %s, who was never told (its tenure of %d holds ended at %s, its unlock %s; %s)",
				f.kind, a.at(c.hi), c.key, a.describe(holds[0]), len(holds), a.at(a.tenureEnd(holds)), unlockName(last.unlock), a.nextOf(last))
			return
		default:
			kr.Untold++
			r.Untold++
			r.violation("the %s fault at %s changed key %s under %s, who was told only %v later",
				f.kind, a.at(c.hi), c.key, a.describe(holds[0]), time.Duration(at-c.hi).Round(time.Microsecond))
		}
	}
	sample(time.Duration(max(at-c.hi, 0)))
	if byLost {
		kr.ToldByLost++
		if cause == "" {
			cause = "(unnamed)"
		}
		if cause != expectedCause[f.kind] {
			kr.OtherCause++
			a.note("the %s fault at %s changed key %s under %s: Lost named %s", f.kind, a.at(c.hi), c.key, a.describe(holds[0]), cause)
		}
	} else {
		kr.ToldByUnlock++
	}
	kr.Causes[cause]++
	// Another worker's hold that entered after the notice, while the
	// holder was still inside.
	idx := a.byKey[c.key]
	end := a.tenureEnd(holds)
	n := sort.Search(len(idx), func(n int) bool { return a.h.holds[idx[n]].enter >= at })
	for ; n < len(idx) && a.h.holds[idx[n]].enter < end; n++ {
		if hd := &a.h.holds[idx[n]]; hd.worker != first.worker || hd.root != first.root {
			r.TakenAfterTold++
			break
		}
	}
}

// acrossKeyChange returns a key fault's change of key made after the call
// older rests on was sent and before newer entered (the fault's index in
// the history, and the change): the change may have freed the key for
// newer while older held it from before.
func (a *analysis) acrossKeyChange(key string, older, newer *hold) (int, keyChange, bool) {
	for fi, f := range a.h.faults {
		for _, c := range f.changes {
			if c.key == key && older.root < c.hi && newer.enter > c.lo {
				return fi, c, true
			}
		}
	}
	return 0, keyChange{}, false
}

func unlockName(u unlocked) string {
	switch u {
	case unlockOK:
		return "returned nil"
	case unlockLost:
		return "returned ErrLockLost"
	case unlockFailed:
		return "failed"
	}
	return "never returned"
}

// mergeKeyFaults sums parts' key fault results.
func mergeKeyFaults(parts []*result) map[string]keyFaultResult {
	out := make(map[string]keyFaultResult)
	samples := make(map[string][]time.Duration)
	for _, p := range parts {
		for kind, kr := range p.KeyFaults {
			t := out[kind]
			if t.Causes == nil {
				t.Causes = make(map[string]int)
			}
			t.Injections += kr.Injections
			t.Hit += kr.Hit
			t.Struck += kr.Struck
			t.ToldByLost += kr.ToldByLost
			t.ToldByUnlock += kr.ToldByUnlock
			t.Untold += kr.Untold
			t.CutShort += kr.CutShort
			t.OtherCause += kr.OtherCause
			for c, n := range kr.Causes {
				t.Causes[c] += n
			}
			samples[kind] = append(samples[kind], kr.Blind.samples...)
			out[kind] = t
		}
	}
	for kind, t := range out {
		t.Blind = newBlindTime(samples[kind])
		out[kind] = t
	}
	return out
}

// holdName names hold i briefly.
func (a *analysis) holdName(i int) string {
	hd := &a.h.holds[i]
	return fmt.Sprintf("worker %d goroutine %d token %d", hd.worker, hd.g, hd.token)
}

// fromOn returns the holds of hold i's tenure from i on.
func (a *analysis) fromOn(i int) []int {
	holds := a.byTenure[a.tenureOf[i]]
	return holds[slices.Index(holds, i):]
}

// tenureNotice tells when hold i's tenure, from i on, was told that it
// may have lost its key, counted from the change c.
func (a *analysis) tenureNotice(i int, c keyChange) string {
	holds := a.fromOn(i)
	at, byLost, cause := a.notice(holds)
	if at == 0 {
		return fmt.Sprintf("nor was its tenure, %d holds from it on", len(holds))
	}
	how := "an unlock's ErrLockLost"
	if byLost {
		how = "Lost, " + cause
	}
	return fmt.Sprintf("its tenure was told %v after the change, by %s", time.Duration(at-c.hi).Round(time.Microsecond), how)
}
