//go:build linux

package main

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
	"time"
)

// note records an oddity that is no violation.
func (a *analysis) note(format string, args ...any) {
	if len(a.res.Notes) < maxListed {
		a.res.Notes = append(a.res.Notes, fmt.Sprintf(format, args...))
	}
}

// refusal files what a registry without WithEvictionAllowed did on the
// evicting lock Redis: it must have refused it.
func (a *analysis) refusal() {
	if rf := a.h.refusal; rf != nil {
		a.res.EvictionRefused, a.res.EvictionRefusal = &rf.refused, rf.said
		if !rf.refused {
			a.res.violation("a registry without WithEvictionAllowed did not refuse the evicting lock Redis: %s", rf.said)
		}
	}
}

// analysis holds the indexes analyze builds over a history.
type analysis struct {
	h        *history
	res      *result
	lease    int64
	restarts []fault          // sorted by start
	renewals map[wk][]renewal // in sending order
	death    map[int]int64    // when a worker stopped acting: its kill, or the end
	live     []int64          // per hold, the end of its live interval
	byKey    map[string][]int // hold indexes, in enter order
	// longestWait is the hold whose acquisition waited longest, or -1.
	longestWait int
	// lostAtFailover: the holds another overlapped across a failover.
	lostAtFailover map[int]bool
	// keyOverlaps: how long each reported overlap after a key fault lasted.
	keyOverlaps []time.Duration
	// For the key faults (blindtime.go): the holds by tenure, each hold's
	// tenure, the lost holds that got no token by worker and key in enter
	// order, and by key fault (its index) the holds overlaps found
	// holding its key from before it while another held it after.
	byTenure  map[tenure][]int
	tenureOf  map[int]tenure
	tokenless map[wk][]tokenless
	stale     map[int][]staleHold
}

type wk struct {
	worker int
	key    string
}

// analyze checks a history and reports what it found.
func analyze(h *history) *result {
	a := &analysis{
		h:              h,
		res:            &result{Keys: h.keys, Faults: make(map[string]int), Recovery: make(map[string]recovery), Promotion: make(map[string]recovery), Acknowledged: h.acknowledged},
		lostAtFailover: make(map[int]bool),
		lease:          int64(h.lease),
		renewals:       make(map[wk][]renewal),
		death:          make(map[int]int64),
		byKey:          make(map[string][]int),
		longestWait:    -1,
	}
	for _, e := range h.errors {
		a.res.violation("%s", e)
	}
	a.index()
	a.indexKeyFaults()
	a.counts()
	a.overlaps()
	a.outlivedUntold()
	a.keyFaults()
	a.refusal()
	a.tokens()
	a.fencing()
	a.increments()
	a.waiters()
	a.recovery()
	return a.res
}

func (a *analysis) index() {
	h := a.h
	for _, f := range h.faults {
		if f.kind == faultRestart {
			a.restarts = append(a.restarts, f)
		}
	}
	slices.SortFunc(a.restarts, func(x, y fault) int { return cmp.Compare(x.start, y.start) })
	for _, r := range h.renewals {
		k := wk{r.worker, r.key}
		a.renewals[k] = append(a.renewals[k], r)
	}
	for _, s := range a.renewals {
		slices.SortFunc(s, func(x, y renewal) int { return cmp.Compare(x.sent, y.sent) })
	}
	for _, w := range h.workers {
		a.death[w.id] = h.end
		if w.killed > 0 {
			a.death[w.id] = w.killed
		}
	}
	for i, hd := range h.holds {
		a.byKey[hd.key] = append(a.byKey[hd.key], i)
	}
	for _, idx := range a.byKey {
		slices.SortFunc(idx, func(x, y int) int { return cmp.Compare(h.holds[x].enter, h.holds[y].enter) })
	}
	a.live = make([]int64, len(h.holds))
	for i := range h.holds {
		a.live[i] = a.liveEnd(&h.holds[i])
	}
}

// cover is how far a successful obtain or renewal sent at sent carries a
// lease: from the sending (never past the key's TTL in Redis, which starts
// when the call runs, later), and not past the crash of a Redis that
// restarted after it was sent, which lost the key.
func (a *analysis) cover(sent, lease int64) int64 {
	end := sent + lease
	// The first restart that was not over when the call was sent: a call
	// sent while Redis restarted may have reached the old server.
	i := sort.Search(len(a.restarts), func(i int) bool { return a.restarts[i].end > sent })
	if i < len(a.restarts) {
		end = min(end, a.restarts[i].start)
	}
	return end
}

// liveEnd is when hd's live interval [enter, liveEnd) ends: at its exit,
// when Lost fired, or when the lease its obtain and renewals carried ran
// out, whichever came first. A hold is live nowhere if liveEnd <= enter.
func (a *analysis) liveEnd(hd *hold) int64 {
	if hd.root == 0 {
		return hd.enter // no observed obtain explains it: an error was filed
	}
	last := hd.exit
	if last == 0 {
		last = a.death[hd.worker]
	}
	end := a.leaseUntil(hd, last, last)
	if hd.exit > 0 {
		end = min(end, hd.exit)
	}
	if hd.lost > 0 {
		end = min(end, hd.lost)
	}
	return end
}

// leaseUntil is when hd's lease ran out, as its obtain (or grant) and the
// renewals its worker sent for the key by sentBy, and that were answered
// by answeredBy, carried it. A renewal only succeeds while the key still
// holds the registry's client id, and the hold's registry cannot have
// taken it back in between (the hold keeps its local mutex), so a
// successful renewal answered during the hold proves the key was the
// hold's all along and carries the lease on. One answered after the hold
// ended may have run after the registry's next hold of the key took it
// back, so it proves nothing for this one. For a hold that rests on a
// grant, whose root is the call that marked its registry, only renewals
// sent after that call's reply count (failedAttempt.answered).
func (a *analysis) leaseUntil(hd *hold, sentBy, answeredBy int64) int64 {
	lease := a.lease
	if hd.rootLease > 0 {
		lease = int64(hd.rootLease)
	}
	end := a.cover(hd.root, lease)
	renewals := a.renewals[wk{hd.worker, hd.key}]
	from, _ := slices.BinarySearchFunc(renewals, max(hd.root, hd.renewedFrom), func(r renewal, root int64) int { return cmp.Compare(r.sent, root) })
	for _, r := range renewals[from:] {
		if r.sent > sentBy {
			break
		}
		if r.done <= answeredBy {
			end = max(end, a.cover(r.sent, a.lease))
		}
	}
	return end
}

func (a *analysis) isLive(i int) bool { return a.live[i] > a.h.holds[i].enter }

func (a *analysis) describe(i int) string {
	hd := &a.h.holds[i]
	out := "still inside when killed"
	if hd.exit > 0 {
		out = "exit " + a.at(hd.exit)
	}
	return fmt.Sprintf("worker %d goroutine %d token %d (enter %s, live until %s, %s)",
		hd.worker, hd.g, hd.token, a.at(hd.enter), a.at(a.live[i]), out)
}

// at renders a time as seconds into the run.
func (a *analysis) at(t int64) string {
	return fmt.Sprintf("+%.6fs", float64(t-a.h.start)/1e9)
}

func (a *analysis) counts() {
	h, r := a.h, a.res
	r.Seconds = float64(h.end-h.start) / 1e9
	r.Workers = len(h.workers)
	r.Acquisitions = len(h.holds)
	r.LostUnlocks = h.lostUnlocks
	r.NoTokens = h.noTokens
	r.LateCredits = h.lateCredits
	var maxWait int64
	for i, hd := range h.holds {
		if hd.fresh {
			r.Fresh++
		} else {
			r.Handoffs++
		}
		if hd.enter-hd.acq > maxWait {
			maxWait, a.longestWait = hd.enter-hd.acq, i
		}
		switch {
		case !a.isLive(i):
			r.NeverLive++
		case hd.exit == 0:
			r.KilledInside++
		case a.live[i] < hd.exit:
			r.Outlived++
		}
		if a.isLive(i) {
			r.Live++
		}
		if hd.lost > 0 && (hd.exit == 0 || hd.lost <= hd.exit) {
			r.LostSignals++
		}
		for _, op := range []storeCall{hd.read, hd.write} {
			if op.Outcome == storeFailed {
				r.StoreFailed++
			}
			if op.Outcome == storeNotTried || op.Sent < a.live[i] {
				continue
			}
			switch op.Outcome {
			case storeAccepted:
				r.LateOps.Accepted++
			case storeRejected:
				r.LateOps.Rejected++
			}
		}
	}
	r.MaxWaitMs = ms(time.Duration(maxWait))
	for _, f := range h.faults {
		r.Faults[f.kind]++
	}
	r.VictimsHolding = a.victimsHolding()
}

// victimsHolding counts the faults that strike one worker whose victim was
// inside a critical section when the fault began.
func (a *analysis) victimsHolding() int {
	starts := make(map[int][]int64) // by victim, sorted
	for _, f := range a.h.faults {
		if victimFault(f.kind) {
			starts[f.worker] = append(starts[f.worker], f.start)
		}
	}
	for _, s := range starts {
		slices.Sort(s)
	}
	hit := make(map[[2]int64]bool)
	for _, hd := range a.h.holds {
		s := starts[hd.worker]
		i, _ := slices.BinarySearch(s, hd.enter)
		for ; i < len(s) && (hd.exit == 0 || s[i] < hd.exit); i++ {
			hit[[2]int64{int64(hd.worker), s[i]}] = true
		}
	}
	return len(hit)
}

// waiters: an acquisition must not wait the full -wait, and a goroutine
// that had that long must have got the lock at least once. Goroutines of a
// killed worker, or of one started less than -wait before the end, had no
// fair chance and are left out.
func (a *analysis) waiters() {
	h, r := a.h, a.res
	for _, t := range h.timeouts {
		r.Timeouts++
		u := a.use(t.key, t.acq, t.at)
		r.LongWaits++
		r.LongWaitUse.add(u)
		r.violation("worker %d goroutine %d waited for key %s from %s to %s without getting it: the key was %s",
			t.worker, t.g, t.key, a.at(t.acq), a.at(t.at), a.describeUse(u, time.Duration(t.at-t.acq)))
	}
	for _, hd := range h.holds {
		if hd.enter-hd.acq >= int64(h.wait)/2 {
			r.LongWaits++
			r.LongWaitUse.add(a.use(hd.key, hd.acq, hd.enter))
		}
	}
	// The longest wait is worth a note once it is long (see busy.go).
	if i := a.longestWait; i >= 0 && h.holds[i].enter-h.holds[i].acq >= int64(h.wait)/2 {
		hd := h.holds[i]
		a.note("the longest wait, %v for key %s (worker %d goroutine %d, from %s): the key was %s",
			time.Duration(hd.enter-hd.acq).Round(time.Millisecond), hd.key, hd.worker, hd.g, a.at(hd.acq),
			a.describeUse(a.use(hd.key, hd.acq, hd.enter), time.Duration(hd.enter-hd.acq)))
	}
	for _, g := range h.goroutines {
		if g.Acquisitions == 0 && g.First > 0 && h.end-g.First >= int64(h.wait) {
			r.NeverAcquired++
			r.violation("worker %d goroutine %d tried from %s on and never got a lock", g.worker, g.G, a.at(g.First))
		}
	}
}
