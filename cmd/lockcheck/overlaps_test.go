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
	failover := Switch{Server: "b", Since: ms2ns(240), At: ms2ns(250), Until: ms2ns(250), Keys: []string{"k"}}
	for _, tc := range []struct {
		name      string
		edit      func(earlier *Hold, s *Switch)
		switched  bool
		reported  bool
		violation string // "" for none
	}{
		{"reported by Lost, after the overlap began", func(e *Hold, s *Switch) { e.Lost = ms2ns(400) }, true, true, ""},
		{"reported by the unlock", func(e *Hold, s *Switch) { e.Unlock = UnlockLost }, true, true, ""},
		{"silent", func(e *Hold, s *Switch) { e.Unlock = UnlockOK }, true, false, "silent overlap on key k across the failover to b"},
		{"an unlock that failed is no report", func(e *Hold, s *Switch) { e.Unlock = UnlockFailed }, true, false, "silent overlap"},
		{"no failover", func(e *Hold, s *Switch) { e.Unlock = UnlockLost }, false, true, "overlap on key k"},
		{"a failover of another key's primary", func(e *Hold, s *Switch) {
			e.Unlock = UnlockLost
			s.Keys = []string{"other"}
		}, true, true, "overlap on key k"},
		{"a failover before the earlier hold's call", func(e *Hold, s *Switch) {
			e.Unlock = UnlockLost
			s.Since, s.At, s.Until = ms2ns(100), ms2ns(110), ms2ns(110)
		}, true, true, "overlap on key k"},
		{"a failover whose old primary took writes until after the call", func(e *Hold, s *Switch) {
			e.Unlock = UnlockLost
			s.Since, s.At, s.Until = ms2ns(100), ms2ns(110), ms2ns(250)
		}, true, true, ""},
		{"a failover after the later hold entered", func(e *Hold, s *Switch) {
			e.Unlock = UnlockLost
			s.Since, s.At, s.Until = ms2ns(305), ms2ns(320), ms2ns(320)
		}, true, true, "overlap on key k"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			earlier := hold(0, "k", 100, 200, 500, 1)
			earlier.Write = Op{Sent: ms2ns(260), Done: ms2ns(261), Outcome: Accepted} // before the later hold's calls
			s := failover
			tc.edit(&earlier, &s)
			h := history(earlier, hold(1, "k", 200, 300, 310, 2))
			if tc.switched {
				h.Switches = []Switch{s}
			}
			r := Analyze(h)
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
	s := Switch{Server: "b", Since: ms2ns(240), At: ms2ns(250), Until: ms2ns(250), Keys: []string{"k", "j"}}
	told := hold(0, "k", 100, 200, 500, 1) // live at the switch, told
	told.Lost = ms2ns(450)
	kept := hold(1, "j", 100, 200, 500, 1)  // live at the switch, untold, unrivalled
	after := hold(0, "k", 300, 600, 610, 2) // entered after the switch
	other := hold(1, "x", 100, 200, 500, 1) // another primary's key
	h := history(told, kept, after, other)
	h.Records = map[string]Record{"k": {Value: 2, Accepted: 2}, "j": {Value: 1, Accepted: 1}, "x": {Value: 1, Accepted: 1}}
	h.Switches = []Switch{s}
	r := Analyze(h)
	wantClean(t, r)
	if r.AtFailover != 2 || r.LostAtFailover != 1 {
		t.Errorf("at a failover %d, lost %d; want 2, 1", r.AtFailover, r.LostAtFailover)
	}
	if r.Switches != 1 || r.Spontaneous != 1 {
		t.Errorf("switches %d, spontaneous %d; want 1, 1 (no failover was injected)", r.Switches, r.Spontaneous)
	}
	h.Faults = []Fault{{Kind: faultFailover, Worker: -1, Keys: []string{"k", "j"}, Start: ms2ns(230), End: ms2ns(260)}}
	if r := Analyze(h); r.Spontaneous != 0 || r.Failovers[0].TakeoverMs != 30 {
		t.Errorf("spontaneous %d, takeover %+v; want 0 and 30ms: the injected failover caused the switch", r.Spontaneous, r.Failovers)
	}
}

// A network fault's recovery is its victim's next fresh acquisition.
func TestNetworkFaultRecoveryIsTheVictims(t *testing.T) {
	h := history(hold(0, "k", 100, 0, 10, 1), hold(0, "k", 200, 500, 510, 2), hold(1, "k", 300, 800, 810, 3))
	h.Faults = []Fault{{Kind: faultNetReset, Worker: 1, Keys: []string{"k"}, Start: ms2ns(100), End: ms2ns(100)}}
	r := Analyze(h)
	wantClean(t, r)
	if rec := r.Recovery[faultNetReset]; rec.N != 1 || rec.MaxMs != float64(700*time.Millisecond/time.Millisecond) {
		t.Errorf("net-reset recovery %+v, want one of 700ms (worker 1's next acquisition, not worker 0's)", rec)
	}
}
