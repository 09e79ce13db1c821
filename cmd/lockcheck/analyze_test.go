//go:build linux

package main

import (
	"math"
	"strings"
	"testing"
	"time"
)

// Hand-built histories: times are milliseconds into the run, the lease is
// one second.

const t0 = int64(1_700_000_000) * int64(time.Second)

func ms2ns(ms int64) int64 { return t0 + ms*int64(time.Millisecond) }

// freshHold is a fresh hold entered at enter ms and exited at exit ms (0:
// never), whose obtain was sent 1ms before it entered, with an accepted
// read and write of value.
func freshHold(w int, key string, token, enter, exit, value int64) hold {
	h := hold{
		worker: w, key: key, token: token, fresh: true,
		acq: ms2ns(enter - 2), root: ms2ns(enter - 1), enter: ms2ns(enter),
	}
	if exit > 0 {
		h.exit = ms2ns(exit)
		h.read = storeCall{Sent: h.enter, Done: h.enter + 1000, Outcome: storeAccepted}
		h.write = storeCall{Sent: h.exit - 2000, Done: h.exit - 1000, Outcome: storeAccepted}
		h.writeValue = value
	}
	return h
}

func historyOf(holds ...hold) *history {
	h := &history{
		keys: 1, lease: time.Second, wait: 10 * time.Second, start: t0, end: ms2ns(20_000),
		workers: []workerRun{{id: 0, start: t0, done: true}, {id: 1, start: t0, done: true}},
		holds:   holds,
		records: map[string]recordState{"k": {}},
	}
	for _, hd := range holds {
		if hd.write.Outcome == storeAccepted {
			rec := h.records[hd.key]
			rec.Accepted++
			rec.Value = max(rec.Value, hd.writeValue)
			h.records[hd.key] = rec
		}
	}
	return h
}

func wantClean(t *testing.T, r *result) {
	t.Helper()
	if r.ViolationCount != 0 {
		t.Fatalf("%d violations in a clean history: %s", r.ViolationCount, strings.Join(r.Violations, "\n"))
	}
}

func wantViolation(t *testing.T, r *result, count int, what string) {
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
	h := historyOf(
		freshHold(0, "k", 100, 0, 10, 1),
		freshHold(1, "k", 200, 10, 20, 2),
		freshHold(0, "k", 300, 20, 30, 3),
	)
	h.goroutines = []goroutineRun{{worker: 0, First: ms2ns(0), Acquisitions: 2}, {worker: 1, First: ms2ns(0), Acquisitions: 1}}
	r := analyze(h)
	wantClean(t, r)
	if r.Acquisitions != 3 || r.Live != 3 || r.Increments != 3 || r.FinalValue != 3 {
		t.Errorf("got %+v", r)
	}
}

func TestOverlappingLiveHoldsAreFound(t *testing.T) {
	r := analyze(historyOf(
		freshHold(0, "k", 100, 0, 500, 1),
		freshHold(1, "k", 200, 200, 300, 2),
	))
	wantViolation(t, r, r.Overlaps, "overlap on key k")
}

// A hold's live interval ends at the earliest of its exit, Lost, and the
// end of the lease its obtain and renewals carried, cut by Redis restarts.
// Another hold of the key may enter after that, not before.
func TestLiveIntervalEnds(t *testing.T) {
	stale := freshHold(0, "k", 100, 0, 1500, 1) // stopped from 10ms to 1500ms
	stale.write = storeCall{}
	for _, tc := range []struct {
		name     string
		edit     func(h *history)
		overlaps bool
	}{
		{"the lease runs out", func(h *history) {}, false},
		{"a renewal carries the lease on", func(h *history) {
			h.renewals = []renewal{{worker: 0, key: "k", sent: ms2ns(600), done: ms2ns(601)}}
		}, true},
		{"a renewal sent after the hold ended carries nothing", func(h *history) {
			h.holds[0].exit = ms2ns(800)
			h.renewals = []renewal{{worker: 0, key: "k", sent: ms2ns(900), done: ms2ns(901)}}
		}, false},
		{"a renewal answered after the hold ended carries nothing", func(h *history) {
			// It may have run after the worker's next hold of the key took
			// it back.
			h.renewals = []renewal{{worker: 0, key: "k", sent: ms2ns(600), done: ms2ns(1600)}}
		}, false},
		{"a restart ends the lease", func(h *history) {
			h.renewals = []renewal{{worker: 0, key: "k", sent: ms2ns(600), done: ms2ns(601)}}
			h.faults = []fault{{kind: faultRestart, worker: -1, start: ms2ns(700), end: ms2ns(800)}}
		}, false},
		{"a renewal sent during a restart carries nothing", func(h *history) {
			h.renewals = []renewal{{worker: 0, key: "k", sent: ms2ns(750), done: ms2ns(751)}}
			h.faults = []fault{{kind: faultRestart, worker: -1, start: ms2ns(700), end: ms2ns(800)}}
		}, false},
		{"Lost ends the hold", func(h *history) {
			h.renewals = []renewal{{worker: 0, key: "k", sent: ms2ns(600), done: ms2ns(601)}}
			h.holds[0].lost = ms2ns(1100)
		}, false},
		{"a grant's lease is the grant lease", func(h *history) {
			h.holds[0].rootLease = 200 * time.Millisecond
			h.holds[1] = freshHold(1, "k", 200, 300, 310, 1)
		}, false},
		{"a grant's lease is live until the grant lease ends", func(h *history) {
			h.holds[0].rootLease = 200 * time.Millisecond
			h.holds[1] = freshHold(1, "k", 200, 150, 160, 1)
		}, true},
		{"a renewal sent before a grant's marking call was answered carries nothing for it", func(h *history) {
			// A renewal of the tenure that a release passing the key on
			// ended, run in Redis before that release.
			h.holds[0].rootLease, h.holds[0].renewedFrom = 200*time.Millisecond, ms2ns(50)
			h.renewals = []renewal{{worker: 0, key: "k", sent: ms2ns(30), done: ms2ns(31)}}
			h.holds[1] = freshHold(1, "k", 200, 300, 310, 1)
		}, false},
		{"a renewal sent after it carries a grant's lease on", func(h *history) {
			h.holds[0].rootLease, h.holds[0].renewedFrom = 200*time.Millisecond, ms2ns(50)
			h.renewals = []renewal{{worker: 0, key: "k", sent: ms2ns(60), done: ms2ns(61)}}
			h.holds[1] = freshHold(1, "k", 200, 300, 310, 1)
		}, true},
		{"a killed holder's key stays leased", func(h *history) {
			h.holds[0].exit, h.holds[0].read = 0, storeCall{}
			h.workers[0].killed = ms2ns(100)
			h.holds[1].enter = ms2ns(900)
		}, true},
		{"a killed worker sends no renewals", func(h *history) {
			h.holds[0].exit, h.holds[0].read = 0, storeCall{}
			h.workers[0].killed = ms2ns(100)
			h.renewals = []renewal{{worker: 0, key: "k", sent: ms2ns(600), done: ms2ns(601)}}
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := historyOf(stale, freshHold(1, "k", 200, 1200, 1210, 1))
			tc.edit(h)
			r := analyze(h)
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
	newer := freshHold(1, "k", 200, 1200, 1210, 2)
	for _, tc := range []struct {
		name    string
		write   storeCall
		stale   bool
		records recordState
	}{
		{"rejected", storeCall{Sent: ms2ns(1500), Done: ms2ns(1501), Outcome: storeRejected}, true, recordState{Value: 2, Accepted: 2, RejectedWrites: 1}},
		{"accepted", storeCall{Sent: ms2ns(1500), Done: ms2ns(1501), Outcome: storeAccepted}, true, recordState{Value: 2, Accepted: 3}},
		{"racing", storeCall{Sent: ms2ns(1200), Done: ms2ns(1220), Outcome: storeRejected}, false, recordState{Value: 2, Accepted: 2, RejectedWrites: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := freshHold(0, "k", 100, 0, 1502, 1)
			old.write = tc.write
			h := historyOf(old, newer)
			h.records["k"] = tc.records
			r := analyze(h)
			switch {
			case tc.write.Outcome == storeAccepted:
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
		old := freshHold(0, "k", 100, 0, 1502, 0)
		old.read = storeCall{Sent: ms2ns(1500), Done: ms2ns(1501), Outcome: storeAccepted}
		old.write = storeCall{}
		r := analyze(historyOf(old, newer))
		wantViolation(t, r, r.StaleReads.Accepted, "stale read accepted")
	})
}

func TestLostIncrements(t *testing.T) {
	a, b := freshHold(0, "k", 100, 0, 10, 1), freshHold(1, "k", 200, 20, 30, 1)
	h := historyOf(a, b) // both wrote 1: the store tallies 2 increments, holds 1
	r := analyze(h)
	wantViolation(t, r, int(r.LostIncrements), "lost increment on key k")
	wantViolation(t, r, int(r.LostIncrements), "the store accepted 2 increments but holds 1")
}

func TestTokens(t *testing.T) {
	t.Run("duplicate", func(t *testing.T) {
		r := analyze(historyOf(freshHold(0, "k", 100, 0, 10, 1), freshHold(1, "k", 100, 20, 30, 2)))
		wantViolation(t, r, r.DuplicateToken, "duplicate token")
	})
	t.Run("fresh token below an earlier hold's", func(t *testing.T) {
		r := analyze(historyOf(freshHold(0, "k", 300, 0, 10, 1), freshHold(1, "k", 200, 20, 30, 2)))
		wantViolation(t, r, r.TokenOrder, "token order")
	})
	t.Run("a lower token from a hand-off is no fresh acquisition", func(t *testing.T) {
		// After a restart, a registry that has not noticed the loss yet
		// may still hand its old hold on locally, with the old token + 1.
		// The store turns it away.
		late := freshHold(0, "k", 101, 20, 30, 0)
		late.fresh, late.root = false, ms2ns(-1)
		late.read.Outcome, late.write = storeRejected, storeCall{}
		h := historyOf(freshHold(0, "k", 100, 0, 10, 1), freshHold(1, "k", 5000, 15, 18, 2), late)
		h.records["k"] = recordState{Value: 2, Accepted: 2, RejectedReads: 1}
		wantClean(t, analyze(h))
	})
	t.Run("a fresh token need not beat a hold that entered after it began", func(t *testing.T) {
		h := historyOf(freshHold(0, "k", 300, 0, 10, 1), freshHold(1, "k", 200, 20, 30, 2))
		h.holds[1].acq = ms2ns(-1)
		r := analyze(h)
		if r.TokenOrder != 0 {
			t.Errorf("token order violations: %q", r.Violations)
		}
	})
}

func TestWaiters(t *testing.T) {
	h := historyOf(freshHold(0, "k", 100, 0, 10, 1))
	h.timeouts = []timeout{{worker: 1, g: 3, key: "k", acq: ms2ns(100), at: ms2ns(10_100)}}
	r := analyze(h)
	wantViolation(t, r, r.Timeouts, "waited for key k")

	h = historyOf(freshHold(0, "k", 100, 0, 10, 1))
	h.goroutines = []goroutineRun{
		{worker: 1, G: 2, First: ms2ns(100)},    // had the whole run
		{worker: 1, G: 3, First: ms2ns(15_000)}, // had 5s of a 10s wait: fair
	}
	r = analyze(h)
	wantViolation(t, r, r.NeverAcquired, "goroutine 2 tried")
	if r.NeverAcquired != 1 {
		t.Errorf("never acquired: %d, want 1: %q", r.NeverAcquired, r.Violations)
	}
}

func TestRecovery(t *testing.T) {
	h := historyOf(freshHold(0, "k", 100, 0, 10, 1), freshHold(1, "k", 200, 500, 510, 2))
	h.faults = []fault{
		{kind: faultPause, worker: -1, start: ms2ns(20), end: ms2ns(400)},
		{kind: faultSleep, worker: -1, start: ms2ns(600), end: ms2ns(700)},
	}
	r := analyze(h)
	if rec := r.Recovery[faultPause]; rec.N != 1 || rec.MaxMs != 100 {
		t.Errorf("pause recovery %+v, want one of 100ms", rec)
	}
	wantViolation(t, r, r.Unrecovered, "no fresh acquisition after the debug-sleep fault")

	// Worker 1 is stopped inside from 100ms to 300ms, takes the key again
	// at 400ms, and worker 0 takes it over at 900ms.
	h = historyOf(freshHold(1, "k", 100, 0, 350, 1), freshHold(1, "k", 150, 400, 410, 2), freshHold(0, "k", 200, 900, 910, 3))
	h.faults = []fault{{kind: faultStop, worker: 1, keys: []string{"k"}, start: ms2ns(100), end: ms2ns(300)}}
	r = analyze(h)
	wantClean(t, r)
	if r.Takeover.N != 1 || r.Takeover.MaxMs != 800 {
		t.Errorf("takeover %+v, want one of 800ms", r.Takeover)
	}
}

func TestWorkerErrorsAreViolations(t *testing.T) {
	h := historyOf(freshHold(0, "k", 100, 0, 10, 1))
	h.errors = []string{"worker 0: goroutine 1 holds k with token 7, which no obtain call the worker saw explains"}
	r := analyze(h)
	wantViolation(t, r, r.ViolationCount, "no obtain call")
}

// A long wait is told apart by how the key was used meanwhile: held by
// others, kept from everyone by a fault, or free with nobody taking it.
func TestALongWaitSaysHowTheKeyWasUsed(t *testing.T) {
	killed := freshHold(1, "k", 300, 7_000, 0, 0) // its worker dies at 7.5 s: the key stays taken a lease more
	killed.acq = ms2ns(2_000)
	h := historyOf(
		freshHold(0, "k", 100, 50, 3_000, 1),
		freshHold(0, "k", 200, 5_000, 6_000, 2),
		killed,
	)
	h.workers[1].killed = ms2ns(7_500)
	h.faults = []fault{
		{kind: faultClusterFailover, worker: -1, keys: []string{"k"}, start: ms2ns(3_500), end: ms2ns(4_500)},
		{kind: faultMigrate, worker: -1, keys: []string{"other"}, start: ms2ns(6_000), end: ms2ns(7_000)},
		{kind: faultStop, worker: 0, keys: []string{"k"}, start: ms2ns(9_000), end: ms2ns(10_500)},
	}
	h.timeouts = []timeout{{worker: 0, g: 3, key: "k", acq: ms2ns(100), at: ms2ns(10_100)}}
	a := &analysis{h: h, res: &result{}, lease: int64(h.lease), death: map[int]int64{}, byKey: map[string][]int{}}
	a.index()
	got := a.use("k", ms2ns(100), ms2ns(10_100))
	// Held 0.1-3, 5-6 and 7-8.5 s; down 3.5-4.5 s (the failover) and 9-10 s
	// (the stop, a lease); free 3-3.5, 4.5-5, 6-7 and 8.5-9 s, and 10-10.1.
	want := keyUse{held: 5400 * time.Millisecond, down: 2 * time.Second, free: 2600 * time.Millisecond, entries: 2, longestFree: time.Second, freeAt: ms2ns(6_000)}
	if got != want {
		t.Errorf("use = %+v, want %+v", got, want)
	}
	r := analyze(h)
	wantViolation(t, r, r.Timeouts, "held 54% of it by others (2 holds began in it); down 20% by faults; free 26%, at most 1s at a stretch, from +6.000000s")
	// The timeout and the killed hold's 5 s wait are long; in all, 15 s
	// of waiting: 7.4 s held, 3 s down, 4.6 s free.
	if use := r.LongWaitUse; r.LongWaits != 2 || math.Abs(use.HeldS-7.4) > 1e-9 || math.Abs(use.DownS-3) > 1e-9 || math.Abs(use.FreeS-4.6) > 1e-9 {
		t.Errorf("long waits %d, %+v: want 2, held 7.4 s, down 3 s, free 4.6 s", r.LongWaits, use)
	}
	if len(r.Notes) == 0 || !strings.Contains(r.Notes[len(r.Notes)-1], "the longest wait, 5s for key k (worker 1 goroutine 0, from +2.000000s): the key was held 40% of it by others (1 hold began in it); down 20% by faults; free 40%, at most 1s at a stretch, from +6.000000s") {
		t.Errorf("notes %q: want the longest wait", r.Notes)
	}
}
