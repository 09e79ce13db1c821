//go:build linux

package main

import (
	"testing"
	"time"
)

// Worker 0 holds k from 200ms to 500ms; worker 1 takes k at 300ms and
// leaves at 310ms: an overlap. What excuses it is a failover of k's
// primary between the call the earlier hold rests on (199ms) and the
// later hold's entry, and only if the earlier hold was told.
func TestOverlapClassification(t *testing.T) {
	failover := primarySwitch{server: "b", since: ms2ns(240), at: ms2ns(250), until: ms2ns(250), keys: []string{"k"}}
	for _, tc := range []struct {
		name      string
		edit      func(earlier *hold, s *primarySwitch)
		switched  bool
		reported  bool
		violation string // "" for none
	}{
		{"reported by Lost, after the overlap began", func(e *hold, s *primarySwitch) { e.lost = ms2ns(400) }, true, true, ""},
		{"reported by the unlock", func(e *hold, s *primarySwitch) { e.unlock = unlockLost }, true, true, ""},
		{"silent", func(e *hold, s *primarySwitch) { e.unlock = unlockOK }, true, false, "silent overlap on key k across the failover to b"},
		{"an unlock that failed is no report", func(e *hold, s *primarySwitch) { e.unlock = unlockFailed }, true, false, "silent overlap"},
		{"no failover", func(e *hold, s *primarySwitch) { e.unlock = unlockLost }, false, true, "overlap on key k"},
		{"a failover of another key's primary", func(e *hold, s *primarySwitch) {
			e.unlock = unlockLost
			s.keys = []string{"other"}
		}, true, true, "overlap on key k"},
		{"a failover before the earlier hold's call", func(e *hold, s *primarySwitch) {
			e.unlock = unlockLost
			s.since, s.at, s.until = ms2ns(100), ms2ns(110), ms2ns(110)
		}, true, true, "overlap on key k"},
		{"a failover whose old primary took writes until after the call", func(e *hold, s *primarySwitch) {
			e.unlock = unlockLost
			s.since, s.at, s.until = ms2ns(100), ms2ns(110), ms2ns(250)
		}, true, true, ""},
		{"a failover after the later hold entered", func(e *hold, s *primarySwitch) {
			e.unlock = unlockLost
			s.since, s.at, s.until = ms2ns(305), ms2ns(320), ms2ns(320)
		}, true, true, "overlap on key k"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			earlier := freshHold(0, "k", 100, 200, 500, 1)
			earlier.write = storeCall{Sent: ms2ns(260), Done: ms2ns(261), Outcome: storeAccepted} // before the later hold's calls
			s := failover
			tc.edit(&earlier, &s)
			h := historyOf(earlier, freshHold(1, "k", 200, 300, 310, 2))
			if tc.switched {
				h.switches = []primarySwitch{s}
			}
			r := analyze(h)
			if r.Overlaps != 1 || (r.OverlapsReported == 1) != tc.reported || r.OverlapsReported+r.OverlapsSilent != 1 {
				t.Errorf("overlaps %d, reported %d, silent %d; want 1, reported %v", r.Overlaps, r.OverlapsReported, r.OverlapsSilent, tc.reported)
			}
			if tc.violation == "" {
				wantClean(t, r)
			} else {
				wantViolation(t, r, r.ViolationCount, tc.violation)
			}
		})
	}
}

// A hold live when a replica of its key's primary took over is at the
// failover; it is lost if it was told so or overlapped.
func TestHoldsAtFailover(t *testing.T) {
	s := primarySwitch{server: "b", since: ms2ns(240), at: ms2ns(250), until: ms2ns(250), keys: []string{"k", "j"}}
	told := freshHold(0, "k", 100, 200, 500, 1) // live at the switch, told
	told.lost = ms2ns(450)
	kept := freshHold(1, "j", 100, 200, 500, 1)  // live at the switch, untold, unrivalled
	after := freshHold(0, "k", 300, 600, 610, 2) // entered after the switch
	other := freshHold(1, "x", 100, 200, 500, 1) // another primary's key
	h := historyOf(told, kept, after, other)
	h.records = map[string]recordState{"k": {Value: 2, Accepted: 2}, "j": {Value: 1, Accepted: 1}, "x": {Value: 1, Accepted: 1}}
	h.switches = []primarySwitch{s}
	r := analyze(h)
	wantClean(t, r)
	if r.AtFailover != 2 || r.LostAtFailover != 1 {
		t.Errorf("at a failover %d, lost %d; want 2, 1", r.AtFailover, r.LostAtFailover)
	}
	if r.Switches != 1 || r.Spontaneous != 1 {
		t.Errorf("switches %d, spontaneous %d; want 1, 1 (no failover was injected)", r.Switches, r.Spontaneous)
	}
	h.faults = []fault{{kind: faultFailover, worker: -1, keys: []string{"k", "j"}, start: ms2ns(230), end: ms2ns(260)}}
	if r := analyze(h); r.Spontaneous != 0 || r.Failovers[0].TakeoverMs != 30 {
		t.Errorf("spontaneous %d, takeover %+v; want 0 and 30ms: the injected failover caused the switch", r.Spontaneous, r.Failovers)
	}
}

// A network fault's recovery is its victim's next fresh acquisition.
func TestNetworkFaultRecoveryIsTheVictims(t *testing.T) {
	h := historyOf(freshHold(0, "k", 100, 0, 10, 1), freshHold(0, "k", 200, 500, 510, 2), freshHold(1, "k", 300, 800, 810, 3))
	h.faults = []fault{{kind: faultNetReset, worker: 1, keys: []string{"k"}, start: ms2ns(100), end: ms2ns(100)}}
	r := analyze(h)
	wantClean(t, r)
	if rec := r.Recovery[faultNetReset]; rec.N != 1 || rec.MaxMs != float64(700*time.Millisecond/time.Millisecond) {
		t.Errorf("net-reset recovery %+v, want one of 700ms (worker 1's next acquisition, not worker 0's)", rec)
	}
}

// Worker 0 held k from before a DEL at 200ms, was told by its unlock, and
// its live interval reaches furthest (to its exit at 600ms). After the
// DEL, worker 1 took k fresh at 300ms, and worker 2 took it fresh at
// 350ms while worker 1 still held it: nothing explains that overlap of two
// holds that both entered after the DEL, however well the stale holder
// was told. A hold must be judged against every live hold it met, not
// only the one reaching furthest.
func TestOverlapBehindAReportedStaleHold(t *testing.T) {
	stale := freshHold(0, "k", 100, 90, 600, 0)
	stale.write.Outcome, stale.unlock, stale.unlocked = storeRejected, unlockLost, ms2ns(601)
	first := freshHold(1, "k", 300, 300, 400, 0)
	first.write.Outcome, first.unlock, first.unlocked = storeRejected, unlockOK, ms2ns(401)
	second := freshHold(2, "k", 400, 350, 360, 1)
	second.unlock, second.unlocked = unlockOK, ms2ns(361)
	h := historyOf(stale, first, second)
	h.workers = append(h.workers, workerRun{id: 2, start: t0, done: true})
	h.records = map[string]recordState{"k": {Value: 1, Accepted: 1, RejectedWrites: 2}}
	h.faults = []fault{{kind: faultDel, worker: -1, keys: []string{"k"}, start: ms2ns(200), end: ms2ns(200),
		changes: []keyChange{{key: "k", lo: ms2ns(200), hi: ms2ns(200)}}}}
	r := analyze(h)
	wantViolation(t, r, r.OverlapsOutsideFailover, "overlap on key k: worker 2")
}

// A hold whose lease ran out while it was inside must be told so: worker
// 0's obtain, sent at 99ms, carried its lease to 1099ms, and it exited at
// 1500ms; its unlock returned nil and Lost never fired. Nobody else held
// the key, so no overlap shows it; only the silence does. Told by Lost,
// by ErrLockLost, or renewed by a call answered before its unlock
// returned, it passes.
func TestAHoldThatOutlivedItsLeaseMustBeTold(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(h *history)
		want bool
	}{
		{"silent", func(h *history) {}, true},
		{"told by Lost", func(h *history) { h.holds[0].lost = ms2ns(1400) }, false},
		{"told by its unlock", func(h *history) { h.holds[0].unlock = unlockLost }, false},
		{"its unlock failed", func(h *history) { h.holds[0].unlock = unlockFailed }, false},
		{"renewed before its unlock returned", func(h *history) {
			h.renewals = []renewal{{worker: 0, key: "k", sent: ms2ns(1000), done: ms2ns(1500) + 500_000}}
		}, false},
		{"outlived by less than the margin", func(h *history) { h.holds[0].exit = ms2ns(1120) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hd := freshHold(0, "k", 100, 100, 1500, 1)
			hd.unlock, hd.unlocked = unlockOK, ms2ns(1501)
			h := historyOf(hd)
			tc.edit(h)
			h.holds[0].write.Sent = h.holds[0].exit - 2000
			r := analyze(h)
			if tc.want {
				wantViolation(t, r, r.OutlivedUntold, "outlived its lease")
			} else {
				wantClean(t, r)
			}
		})
	}
}
