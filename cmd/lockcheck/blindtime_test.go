//go:build linux

package main

import (
	"testing"
	"time"
)

func TestPercentileIsTheNearestRank(t *testing.T) {
	var hundred []time.Duration
	for i := 1; i <= 100; i++ {
		hundred = append(hundred, time.Duration(i)*time.Millisecond)
	}
	for _, tc := range []struct {
		samples       []time.Duration
		p50, p99, max float64
	}{
		{[]time.Duration{3 * time.Millisecond}, 3, 3, 3},
		{[]time.Duration{2 * time.Millisecond, time.Millisecond}, 1, 2, 2},
		{hundred, 50, 99, 100},
		{append(hundred, time.Second), 51, 100, 1000},
	} {
		b := newBlindTime(tc.samples)
		if b.N != len(tc.samples) || b.P50Ms != tc.p50 || b.P99Ms != tc.p99 || b.MaxMs != tc.max {
			t.Errorf("%d samples: %+v, want p50 %v, p99 %v, max %v", len(tc.samples), b, tc.p50, tc.p99, tc.max)
		}
	}
	if b := newBlindTime(nil); b.N != 0 || b.MaxMs != 0 {
		t.Errorf("no samples: %+v", b)
	}
}

// A del fault sent at 99.9ms, answered at 100ms, changes key k. Worker 0
// holds it from 95ms to 110ms unless the case says otherwise.
func TestBlindTimeOfAStruckHolder(t *testing.T) {
	del := fault{kind: faultDel, worker: -1, keys: []string{"k"}, start: ms2ns(100) - 100_000, end: ms2ns(100)}
	del.changes = []keyChange{{key: "k", lo: del.start, hi: del.end}}
	for _, tc := range []struct {
		name                   string
		edit                   func(h *history)
		hit, byLost, byUnlock  int
		untold, cutShort, odd  int
		blindMs                float64 // -1: no sample
		violation, wantedCause string
	}{
		{"told by Lost", func(h *history) {
			h.holds[0].lost, h.holds[0].cause = ms2ns(101), "deleted"
		}, 1, 1, 0, 0, 0, 0, 1, "", "deleted"},
		{"told by Lost before the DEL's reply came back", func(h *history) {
			h.holds[0].lost, h.holds[0].cause = ms2ns(100)-50_000, "deleted"
		}, 1, 1, 0, 0, 0, 0, 0, "", "deleted"},
		{"told by the unlock", func(h *history) {
			h.holds[0].exit = ms2ns(100) + 500_000
			h.holds[0].unlock, h.holds[0].unlocked = unlockLost, ms2ns(101)
		}, 1, 0, 1, 0, 0, 0, 1, "", causeRelease},
		{"told in the hold handed off to", func(h *history) {
			h.holds[0].exit, h.holds[0].unlock = ms2ns(100)+500_000, unlockOK
			h.holds[0].write = storeCall{Sent: ms2ns(99), Done: ms2ns(100), Outcome: storeAccepted}
			next := freshHold(0, "k", 101, 101, 105, 3)
			next.fresh, next.root = false, h.holds[0].root
			next.lost, next.cause = ms2ns(103), "deleted"
			h.holds = append(h.holds, next)
			h.records["k"] = recordState{Value: 3, Accepted: 3}
		}, 1, 1, 0, 0, 0, 0, 3, "", "deleted"},
		{"told in a hand-off that got no token", func(h *history) {
			h.holds[0].exit, h.holds[0].unlock = ms2ns(100)+500_000, unlockOK
			h.tokenless = []tokenless{{worker: 0, key: "k", enter: ms2ns(100) + 600_000, told: ms2ns(102), cause: "deleted", handoff: true}}
		}, 1, 1, 0, 0, 0, 0, 2, "", "deleted"},
		{"not told in a hold without a token that was no hand-off", func(h *history) {
			h.holds[0].exit, h.holds[0].unlock = ms2ns(100)+500_000, unlockOK
			h.tokenless = []tokenless{{worker: 0, key: "k", enter: ms2ns(100) + 600_000, told: ms2ns(102), cause: "deleted"}}
		}, 1, 0, 0, 1, 0, 0, -1, "who was never told", ""},
		{"with another cause", func(h *history) {
			h.holds[0].lost, h.holds[0].cause = ms2ns(101), "expired"
		}, 1, 1, 0, 0, 0, 1, 1, "", "expired"},
		{"never told", func(h *history) {
			h.holds[0].unlock = unlockOK
		}, 1, 0, 0, 1, 0, 0, -1, "who was never told", ""},
		{"told only after a lease", func(h *history) {
			h.holds[0].exit = ms2ns(2000)
			h.holds[0].lost, h.holds[0].cause = ms2ns(1500), "deleted"
		}, 1, 1, 0, 1, 0, 0, 1400, "told only 1.4s later", "deleted"},
		{"killed inside", func(h *history) {
			h.holds[0].exit, h.holds[0].read, h.holds[0].write = 0, storeCall{}, storeCall{}
			h.workers[0].killed = ms2ns(105)
			h.records["k"] = recordState{Value: 1, Accepted: 1}
		}, 1, 0, 0, 0, 1, 0, -1, "", ""},
		{"gone before the reply", func(h *history) {
			// It may have let go of the key before the DEL ran.
			h.holds[0].exit = ms2ns(100) - 50_000
			h.holds[0].unlock, h.holds[0].unlocked = unlockLost, ms2ns(101)
		}, 0, 0, 0, 0, 0, 0, -1, "", ""},
		{"entered after the DEL was sent", func(h *history) {
			h.holds[0] = freshHold(0, "k", 100, 100, 110, 1)
			h.holds[0].lost, h.holds[0].cause = ms2ns(101), "deleted"
		}, 0, 0, 0, 0, 0, 0, -1, "", ""},
		{"lost before the DEL", func(h *history) {
			h.holds[0].lost, h.holds[0].cause = ms2ns(99), "expired"
		}, 0, 0, 0, 0, 0, 0, -1, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Worker 1's hold, later, is the fault's recovery.
			h := historyOf(freshHold(0, "k", 100, 95, 110, 1), freshHold(1, "k", 200, 2500, 2510, 2))
			h.holds[0].unlock = unlockOK
			h.records["k"] = recordState{Value: 2, Accepted: 2}
			tc.edit(h)
			h.faults = []fault{del}
			r := analyze(h)
			kr := r.KeyFaults[faultDel]
			if kr.Injections != 1 || kr.Hit != tc.hit || kr.Struck != tc.hit || kr.ToldByLost != tc.byLost || kr.ToldByUnlock != tc.byUnlock ||
				kr.Untold != tc.untold || kr.CutShort != tc.cutShort || kr.OtherCause != tc.odd || r.Untold != tc.untold {
				t.Errorf("got %+v", kr)
			}
			if tc.wantedCause != "" && kr.Causes[tc.wantedCause] != 1 {
				t.Errorf("causes %v, want %s", kr.Causes, tc.wantedCause)
			}
			if tc.odd > 0 && len(r.Notes) != tc.odd {
				t.Errorf("notes %q, want %d", r.Notes, tc.odd)
			}
			switch {
			case tc.blindMs < 0 && kr.Blind.N != 0:
				t.Errorf("blind time %+v, want no sample", kr.Blind)
			case tc.blindMs >= 0 && (kr.Blind.N != 1 || kr.Blind.MaxMs != tc.blindMs):
				t.Errorf("blind time %+v, want one of %vms", kr.Blind, tc.blindMs)
			}
			wantOutcome(t, r, tc.violation)
		})
	}
}

// A flush strikes every key; an injection that strikes several holds is
// one hit.
func TestAFlushStrikesEveryHeldKey(t *testing.T) {
	a, b, idle := freshHold(0, "k", 100, 95, 110, 1), freshHold(1, "j", 100, 95, 110, 1), freshHold(1, "x", 100, 50, 60, 1)
	after := freshHold(1, "x", 200, 150, 160, 2)
	a.lost, a.cause = ms2ns(101), "flushed"
	b.lost, b.cause = ms2ns(102), "flushed"
	h := historyOf(a, b, idle, after)
	h.records = map[string]recordState{"k": {Value: 1, Accepted: 1}, "j": {Value: 1, Accepted: 1}, "x": {Value: 2, Accepted: 2}}
	f := fault{kind: faultFlush, worker: -1, keys: []string{"j", "k", "x"}, start: ms2ns(99), end: ms2ns(100)}
	for _, k := range f.keys {
		f.changes = append(f.changes, keyChange{key: k, lo: f.start, hi: f.end})
	}
	h.faults = []fault{f}
	r := analyze(h)
	wantClean(t, r)
	if kr := r.KeyFaults[faultFlush]; kr.Hit != 1 || kr.Struck != 2 || kr.ToldByLost != 2 || kr.Blind.N != 2 || kr.Blind.MaxMs != 2 || kr.Causes["flushed"] != 2 {
		t.Errorf("got %+v", kr)
	}
}

// Worker 0 holds k from 200ms to 500ms; a del fault changes k at 250ms;
// worker 1 takes k at 300ms and leaves at 310ms. Whether that is an
// overlap depends on when worker 0 was told; an overlap after the key
// fault must be reported, as one across a failover.
func TestOverlapAfterAKeyFault(t *testing.T) {
	for _, tc := range []struct {
		name            string
		edit            func(earlier *hold, f *fault)
		overlaps, after int
		takenAfterTold  int
		overlappedMs    float64 // how long, after the key fault
		violation       string
	}{
		{"told after the later hold entered", func(e *hold, f *fault) { e.lost, e.cause = ms2ns(400), "deleted" }, 1, 1, 0, 10, ""},
		{"told before the later hold entered", func(e *hold, f *fault) { e.lost, e.cause = ms2ns(260), "deleted" }, 0, 0, 1, 0, ""},
		{"told by the unlock", func(e *hold, f *fault) { e.unlock, e.unlocked = unlockLost, ms2ns(501) }, 1, 1, 0, 10, ""},
		{"never told", func(e *hold, f *fault) { e.unlock = unlockOK }, 1, 0, 0, 0, "silent overlap on key k after the del fault"},
		{"a del of another key", func(e *hold, f *fault) {
			e.lost = ms2ns(400)
			f.changes[0].key = "other"
		}, 1, 0, 0, 0, "overlap on key k:"},
		{"a del before the earlier hold's call", func(e *hold, f *fault) {
			e.lost = ms2ns(400)
			f.changes[0].lo, f.changes[0].hi = ms2ns(100), ms2ns(101)
		}, 1, 0, 0, 0, "overlap on key k:"},
		{"a del after the later hold entered", func(e *hold, f *fault) {
			e.lost = ms2ns(400)
			f.changes[0].lo, f.changes[0].hi = ms2ns(305), ms2ns(306)
		}, 1, 0, 0, 0, "overlap on key k:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			earlier := freshHold(0, "k", 100, 200, 500, 1)
			earlier.write = storeCall{Sent: ms2ns(240), Done: ms2ns(241), Outcome: storeAccepted} // before the later hold's calls
			f := fault{kind: faultDel, worker: -1, keys: []string{"k"}, start: ms2ns(249), end: ms2ns(250)}
			f.changes = []keyChange{{key: "k", lo: f.start, hi: f.end}}
			tc.edit(&earlier, &f)
			h := historyOf(earlier, freshHold(1, "k", 200, 300, 310, 2))
			h.faults = []fault{f}
			r := analyze(h)
			if r.Overlaps != tc.overlaps || r.OverlapsAfterKeyFault != tc.after || r.TakenAfterTold != tc.takenAfterTold {
				t.Errorf("overlaps %d, after the key fault %d, taken after told %d; want %d, %d, %d",
					r.Overlaps, r.OverlapsAfterKeyFault, r.TakenAfterTold, tc.overlaps, tc.after, tc.takenAfterTold)
			}
			if tc.after > 0 && (r.KeyOverlap.N != 1 || r.KeyOverlap.MaxMs != tc.overlappedMs) {
				t.Errorf("overlapped %+v, want once for %vms", r.KeyOverlap, tc.overlappedMs)
			}
			wantOutcome(t, r, tc.violation)
		})
	}
}

func TestAnEvictingServerMustBeRefused(t *testing.T) {
	h := historyOf(freshHold(0, "k", 100, 0, 10, 1))
	h.records["k"] = recordState{Value: 1, Accepted: 1}
	h.refusal = &refusal{refused: true, said: "lockreg: the server may evict lock keys"}
	r := analyze(h)
	wantClean(t, r)
	if r.EvictionRefused == nil || !*r.EvictionRefused {
		t.Errorf("eviction refused %v, want true", r.EvictionRefused)
	}
	h.refusal = &refusal{said: "it took the key"}
	r = analyze(h)
	wantViolation(t, r, r.ViolationCount, "did not refuse the evicting lock Redis")
	if m := merge([]*result{analyze(historyOf()), r}); m.EvictionRefused == nil || *m.EvictionRefused {
		t.Errorf("merged: eviction refused %v, want false", m.EvictionRefused)
	}
}

func TestMergeSumsKeyFaults(t *testing.T) {
	parts := []*result{
		{Keys: 1, KeyFaults: map[string]keyFaultResult{faultDel: {Injections: 2, Hit: 1, Struck: 1, ToldByLost: 1, Causes: map[string]int{"deleted": 1}, Blind: newBlindTime([]time.Duration{time.Millisecond})}}},
		{Keys: 16, KeyFaults: map[string]keyFaultResult{
			faultDel:   {Injections: 3, Hit: 2, Struck: 2, ToldByLost: 1, ToldByUnlock: 1, Causes: map[string]int{"deleted": 1, causeRelease: 1}, Blind: newBlindTime([]time.Duration{3 * time.Millisecond, 2 * time.Millisecond})},
			faultFlush: {Injections: 1},
		}},
	}
	m := merge(parts)
	del := m.KeyFaults[faultDel]
	if del.Injections != 5 || del.Hit != 3 || del.Struck != 3 || del.ToldByLost != 2 || del.ToldByUnlock != 1 || del.Causes["deleted"] != 2 {
		t.Errorf("merged del: %+v", del)
	}
	if del.Blind.N != 3 || del.Blind.P50Ms != 2 || del.Blind.MaxMs != 3 {
		t.Errorf("merged del blind time: %+v, want 3 samples, p50 2ms, max 3ms", del.Blind)
	}
	if m.KeyFaults[faultFlush].Injections != 1 {
		t.Errorf("merged flush: %+v", m.KeyFaults[faultFlush])
	}
}

// A del fault at 250ms changes k under worker 0, whose hold leaves at
// 255ms; worker 1 takes k fresh at 258ms, and worker 0's registry hands
// its stale hold on locally at 262ms (its token + 1): the later hold of
// the overlap is the one that held the key from before, and must be told.
func TestAStaleHandOffAfterAKeyFaultMustBeTold(t *testing.T) {
	for _, tc := range []struct {
		name       string
		lost       int64
		tenureTold bool // by the hold its unlock hands off to, which gets no token
		violation  string
	}{
		{"told", ms2ns(264), false, ""},
		{"not told", 0, false, "worker 0 goroutine 1 token 101 held the key from before the fault and saw neither Lost nor ErrLockLost, its unlock never returned (nor was its tenure"},
		{"not told, its tenure told later", 0, true, "saw neither Lost nor ErrLockLost, its unlock returned nil (its tenure was told 41.5ms after the change, by Lost, deleted)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			first := freshHold(0, "k", 100, 200, 255, 1)
			first.unlock = unlockOK
			fresh := freshHold(1, "k", 200, 258, 300, 2)
			stale := freshHold(0, "k", 101, 262, 290, 3)
			stale.g, stale.fresh, stale.root = 1, false, first.root
			stale.read = storeCall{Sent: ms2ns(263), Done: ms2ns(264), Outcome: storeRejected}
			stale.write, stale.writeValue = storeCall{}, 0
			stale.lost, stale.cause = tc.lost, "deleted"
			h := historyOf(first, fresh, stale)
			h.records["k"] = recordState{Value: 2, Accepted: 2, RejectedReads: 1}
			if tc.tenureTold {
				h.holds[2].unlock = unlockOK
				h.tokenless = []tokenless{{worker: 0, g: 2, key: "k", enter: ms2ns(291), told: ms2ns(291) + 500_000, cause: "deleted", handoff: true}}
			}
			f := fault{kind: faultDel, worker: -1, keys: []string{"k"}, start: ms2ns(249), end: ms2ns(250)}
			f.changes = []keyChange{{key: "k", lo: f.start, hi: f.end}}
			h.faults = []fault{f}
			r := analyze(h)
			if r.Overlaps != 1 {
				t.Errorf("%d overlaps, want 1", r.Overlaps)
			}
			if kr := r.KeyFaults[faultDel]; kr.Struck != 1 {
				t.Errorf("del: %+v, want one tenure struck", kr)
			}
			if tc.violation == "" {
				wantClean(t, r)
				if r.OverlapsAfterKeyFault != 1 || r.KeyOverlap.MaxMs != 2 {
					t.Errorf("overlaps after the key fault %d, for %+v; want 1, 2ms (until Lost)", r.OverlapsAfterKeyFault, r.KeyOverlap)
				}
			} else {
				wantViolation(t, r, r.OverlapsSilent, tc.violation)
			}
			if told := b2i(tc.tenureTold); r.SilentTenureTold != told {
				t.Errorf("silent overlaps whose tenure was told later: %d, want %d", r.SilentTenureTold, told)
			}
		})
	}
}

// wantOutcome wants r clean if violation is "", else a violation that
// mentions it.
func wantOutcome(t *testing.T, r *result, violation string) {
	t.Helper()
	if violation == "" {
		wantClean(t, r)
	} else {
		wantViolation(t, r, r.ViolationCount, violation)
	}
}
