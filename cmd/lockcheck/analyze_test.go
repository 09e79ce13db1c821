//go:build linux

package main

import (
	"strings"
	"testing"
	"time"
)

// Hand-built histories: times are milliseconds into the run, the lease is
// one second.

const t0 = int64(1_700_000_000) * int64(time.Second)

func ms2ns(ms int64) int64 { return t0 + ms*int64(time.Millisecond) }

// hold is a fresh hold entered at enter ms and exited at exit ms (0: never),
// whose obtain was sent 1ms before it entered, with an accepted read and
// write of value.
func hold(w int, key string, token, enter, exit, value int64) Hold {
	h := Hold{
		Worker: w, Key: key, Token: token, Fresh: true,
		Acq: ms2ns(enter - 2), Root: ms2ns(enter - 1), Enter: ms2ns(enter),
	}
	if exit > 0 {
		h.Exit = ms2ns(exit)
		h.Read = Op{Sent: h.Enter, Done: h.Enter + 1000, Outcome: Accepted}
		h.Write = Op{Sent: h.Exit - 2000, Done: h.Exit - 1000, Outcome: Accepted}
		h.WriteValue = value
	}
	return h
}

func history(holds ...Hold) *History {
	h := &History{
		Keys: 1, Lease: time.Second, Wait: 10 * time.Second, Start: t0, End: ms2ns(20_000),
		Workers: []WorkerRun{{ID: 0, Start: t0, Done: true}, {ID: 1, Start: t0, Done: true}},
		Holds:   holds,
		Records: map[string]Record{"k": {}},
	}
	for _, hd := range holds {
		if hd.Write.Outcome == Accepted {
			rec := h.Records[hd.Key]
			rec.Accepted++
			rec.Value = max(rec.Value, hd.WriteValue)
			h.Records[hd.Key] = rec
		}
	}
	return h
}

func wantClean(t *testing.T, r *Result) {
	t.Helper()
	if r.ViolationCount != 0 {
		t.Fatalf("%d violations in a clean history: %s", r.ViolationCount, strings.Join(r.Violations, "\n"))
	}
}

func wantViolation(t *testing.T, r *Result, count int, what string) {
	t.Helper()
	if count == 0 || r.ViolationCount == 0 {
		t.Fatalf("no %s found; violations: %q", what, r.Violations)
	}
	for _, v := range r.Violations {
		if strings.Contains(v, what) {
			return
		}
	}
	t.Fatalf("no violation mentions %q: %q", what, r.Violations)
}

func TestCleanHistoryHasNoViolations(t *testing.T) {
	h := history(
		hold(0, "k", 100, 0, 10, 1),
		hold(1, "k", 200, 10, 20, 2),
		hold(0, "k", 300, 20, 30, 3),
	)
	h.Goroutines = []GoroutineRun{{Worker: 0, First: ms2ns(0), Acquisitions: 2}, {Worker: 1, First: ms2ns(0), Acquisitions: 1}}
	r := Analyze(h)
	wantClean(t, r)
	if r.Acquisitions != 3 || r.Live != 3 || r.Increments != 3 || r.FinalValue != 3 {
		t.Errorf("got %+v", r)
	}
}

func TestOverlappingLiveHoldsAreFound(t *testing.T) {
	r := Analyze(history(
		hold(0, "k", 100, 0, 500, 1),
		hold(1, "k", 200, 200, 300, 2),
	))
	wantViolation(t, r, r.Overlaps, "overlap on key k")
}

// A hold's live interval ends at the earliest of its exit, Lost, and the
// end of the lease its obtain and renewals carried, cut by Redis restarts.
// Another hold of the key may enter after that, not before.
func TestLiveIntervalEnds(t *testing.T) {
	stale := hold(0, "k", 100, 0, 1500, 1) // stopped from 10ms to 1500ms
	stale.Write = Op{}
	for _, tc := range []struct {
		name     string
		edit     func(h *History)
		overlaps bool
	}{
		{"the lease runs out", func(h *History) {}, false},
		{"a renewal carries the lease on", func(h *History) {
			h.Renewals = []Renewal{{Worker: 0, Key: "k", Sent: ms2ns(600), Done: ms2ns(601)}}
		}, true},
		{"a renewal sent after the hold ended carries nothing", func(h *History) {
			h.Holds[0].Exit = ms2ns(800)
			h.Renewals = []Renewal{{Worker: 0, Key: "k", Sent: ms2ns(900), Done: ms2ns(901)}}
		}, false},
		{"a renewal answered after the hold ended carries nothing", func(h *History) {
			// It may have run after the worker's next hold of the key took
			// it back.
			h.Renewals = []Renewal{{Worker: 0, Key: "k", Sent: ms2ns(600), Done: ms2ns(1600)}}
		}, false},
		{"a restart ends the lease", func(h *History) {
			h.Renewals = []Renewal{{Worker: 0, Key: "k", Sent: ms2ns(600), Done: ms2ns(601)}}
			h.Faults = []Fault{{Kind: faultRestart, Worker: -1, Start: ms2ns(700), End: ms2ns(800)}}
		}, false},
		{"a renewal sent during a restart carries nothing", func(h *History) {
			h.Renewals = []Renewal{{Worker: 0, Key: "k", Sent: ms2ns(750), Done: ms2ns(751)}}
			h.Faults = []Fault{{Kind: faultRestart, Worker: -1, Start: ms2ns(700), End: ms2ns(800)}}
		}, false},
		{"Lost ends the hold", func(h *History) {
			h.Renewals = []Renewal{{Worker: 0, Key: "k", Sent: ms2ns(600), Done: ms2ns(601)}}
			h.Holds[0].Lost = ms2ns(1100)
		}, false},
		{"a grant's lease is the grant lease", func(h *History) {
			h.Holds[0].RootLease = 200 * time.Millisecond
			h.Holds[1] = hold(1, "k", 200, 300, 310, 1)
		}, false},
		{"a grant's lease is live until the grant lease ends", func(h *History) {
			h.Holds[0].RootLease = 200 * time.Millisecond
			h.Holds[1] = hold(1, "k", 200, 150, 160, 1)
		}, true},
		{"a killed holder's key stays leased", func(h *History) {
			h.Holds[0].Exit, h.Holds[0].Read = 0, Op{}
			h.Workers[0].Killed = ms2ns(100)
			h.Holds[1].Enter = ms2ns(900)
		}, true},
		{"a killed worker sends no renewals", func(h *History) {
			h.Holds[0].Exit, h.Holds[0].Read = 0, Op{}
			h.Workers[0].Killed = ms2ns(100)
			h.Renewals = []Renewal{{Worker: 0, Key: "k", Sent: ms2ns(600), Done: ms2ns(601)}}
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := history(stale, hold(1, "k", 200, 1200, 1210, 1))
			tc.edit(h)
			r := Analyze(h)
			if tc.overlaps {
				wantViolation(t, r, r.Overlaps, "overlap on key k")
			} else {
				wantClean(t, r)
			}
		})
	}
}

func TestStaleStoreCalls(t *testing.T) {
	// Worker 0 (token 100) reads, stalls; worker 1 (token 200) takes over
	// and increments; then worker 0 writes.
	newer := hold(1, "k", 200, 1200, 1210, 2)
	for _, tc := range []struct {
		name    string
		write   Op
		stale   bool
		records Record
	}{
		{"rejected", Op{Sent: ms2ns(1500), Done: ms2ns(1501), Outcome: Rejected}, true, Record{Value: 2, Accepted: 2, RejectedWrites: 1}},
		{"accepted", Op{Sent: ms2ns(1500), Done: ms2ns(1501), Outcome: Accepted}, true, Record{Value: 2, Accepted: 3}},
		{"racing", Op{Sent: ms2ns(1200), Done: ms2ns(1220), Outcome: Rejected}, false, Record{Value: 2, Accepted: 2, RejectedWrites: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := hold(0, "k", 100, 0, 1502, 1)
			old.Write = tc.write
			h := history(old, newer)
			h.Records["k"] = tc.records
			r := Analyze(h)
			switch {
			case tc.write.Outcome == Accepted:
				wantViolation(t, r, r.StaleWrites.Accepted, "stale write accepted")
			case tc.stale:
				wantClean(t, r)
				if r.StaleWrites.Rejected != 1 || r.LateOps.Rejected != 1 {
					t.Errorf("stale writes rejected %d, after the lease %d; want 1, 1", r.StaleWrites.Rejected, r.LateOps.Rejected)
				}
			default:
				wantClean(t, r)
				if r.RaceRejected != 1 {
					t.Errorf("rejected in a race: %d, want 1", r.RaceRejected)
				}
			}
		})
	}
	t.Run("stale read accepted", func(t *testing.T) {
		old := hold(0, "k", 100, 0, 1502, 0)
		old.Read = Op{Sent: ms2ns(1500), Done: ms2ns(1501), Outcome: Accepted}
		old.Write = Op{}
		r := Analyze(history(old, newer))
		wantViolation(t, r, r.StaleReads.Accepted, "stale read accepted")
	})
}

func TestLostIncrements(t *testing.T) {
	a, b := hold(0, "k", 100, 0, 10, 1), hold(1, "k", 200, 20, 30, 1)
	h := history(a, b) // both wrote 1: the store tallies 2 increments, holds 1
	r := Analyze(h)
	wantViolation(t, r, int(r.LostIncrements), "lost increment on key k")
	wantViolation(t, r, int(r.LostIncrements), "the store accepted 2 increments but holds 1")
}

func TestTokens(t *testing.T) {
	t.Run("duplicate", func(t *testing.T) {
		r := Analyze(history(hold(0, "k", 100, 0, 10, 1), hold(1, "k", 100, 20, 30, 2)))
		wantViolation(t, r, r.DuplicateToken, "duplicate token")
	})
	t.Run("fresh token below an earlier hold's", func(t *testing.T) {
		r := Analyze(history(hold(0, "k", 300, 0, 10, 1), hold(1, "k", 200, 20, 30, 2)))
		wantViolation(t, r, r.TokenOrder, "token order")
	})
	t.Run("a lower token from a hand-off is no fresh acquisition", func(t *testing.T) {
		// After a restart, a registry that has not noticed the loss yet
		// may still hand its old hold on locally, with the old token + 1.
		// The store turns it away.
		late := hold(0, "k", 101, 20, 30, 0)
		late.Fresh, late.Root = false, ms2ns(-1)
		late.Read.Outcome, late.Write = Rejected, Op{}
		h := history(hold(0, "k", 100, 0, 10, 1), hold(1, "k", 5000, 15, 18, 2), late)
		h.Records["k"] = Record{Value: 2, Accepted: 2, RejectedReads: 1}
		wantClean(t, Analyze(h))
	})
	t.Run("a fresh token need not beat a hold that entered after it began", func(t *testing.T) {
		h := history(hold(0, "k", 300, 0, 10, 1), hold(1, "k", 200, 20, 30, 2))
		h.Holds[1].Acq = ms2ns(-1)
		r := Analyze(h)
		if r.TokenOrder != 0 {
			t.Errorf("token order violations: %q", r.Violations)
		}
	})
}

func TestWaiters(t *testing.T) {
	h := history(hold(0, "k", 100, 0, 10, 1))
	h.Timeouts = []Timeout{{Worker: 1, G: 3, Key: "k", Acq: ms2ns(100), At: ms2ns(10_100)}}
	r := Analyze(h)
	wantViolation(t, r, r.Timeouts, "waited for key k")

	h = history(hold(0, "k", 100, 0, 10, 1))
	h.Goroutines = []GoroutineRun{
		{Worker: 1, G: 2, First: ms2ns(100)},    // had the whole run
		{Worker: 1, G: 3, First: ms2ns(15_000)}, // had 5s of a 10s wait: fair
	}
	r = Analyze(h)
	wantViolation(t, r, r.NeverAcquired, "goroutine 2 tried")
	if r.NeverAcquired != 1 {
		t.Errorf("never acquired: %d, want 1: %q", r.NeverAcquired, r.Violations)
	}
}

func TestRecovery(t *testing.T) {
	h := history(hold(0, "k", 100, 0, 10, 1), hold(1, "k", 200, 500, 510, 2))
	h.Faults = []Fault{
		{Kind: faultPause, Worker: -1, Start: ms2ns(20), End: ms2ns(400)},
		{Kind: faultSleep, Worker: -1, Start: ms2ns(600), End: ms2ns(700)},
	}
	r := Analyze(h)
	if rec := r.Recovery[faultPause]; rec.N != 1 || rec.MaxMs != 100 {
		t.Errorf("pause recovery %+v, want one of 100ms", rec)
	}
	wantViolation(t, r, r.Unrecovered, "no fresh acquisition after the debug-sleep fault")

	// Worker 1 is stopped inside from 100ms to 300ms, takes the key again
	// at 400ms, and worker 0 takes it over at 900ms.
	h = history(hold(1, "k", 100, 0, 350, 1), hold(1, "k", 150, 400, 410, 2), hold(0, "k", 200, 900, 910, 3))
	h.Faults = []Fault{{Kind: faultStop, Worker: 1, Keys: []string{"k"}, Start: ms2ns(100), End: ms2ns(300)}}
	r = Analyze(h)
	wantClean(t, r)
	if r.Takeover.N != 1 || r.Takeover.MaxMs != 800 {
		t.Errorf("takeover %+v, want one of 800ms", r.Takeover)
	}
}

func TestWorkerErrorsAreViolations(t *testing.T) {
	h := history(hold(0, "k", 100, 0, 10, 1))
	h.Errors = []string{"worker 0: goroutine 1 holds k with token 7, which no obtain call the worker saw explains"}
	r := Analyze(h)
	wantViolation(t, r, r.ViolationCount, "no obtain call")
}
