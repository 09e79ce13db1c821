//go:build linux

package main

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"sort"
	"time"
)

// maxListed bounds the violations a result spells out; all are counted.
const maxListed = 20

// result is what the checker concludes from one history (or, merged, from
// all of a run's). The docs/RELIABILITY.md section "Definitions" says what
// each count means. Its fields stay exported: -json writes them, as do
// those of faultResult, tally and recovery.
type result struct {
	Keys           int            `json:"keys,omitempty"`
	Seconds        float64        `json:"seconds"`
	Workers        int            `json:"workers_started"`
	Acquisitions   int            `json:"acquisitions"`
	Fresh          int            `json:"fresh"`
	Handoffs       int            `json:"handoffs"`
	MaxWaitMs      float64        `json:"max_wait_ms"`
	Faults         map[string]int `json:"faults"`
	VictimsHolding int            `json:"victims_holding"`
	Live           int            `json:"live_holds"`
	NeverLive      int            `json:"never_live"`
	Outlived       int            `json:"outlived_lease"`
	OutlivedUntold int            `json:"outlived_lease_untold"` // of those, never told (outlived.go)
	KilledInside   int            `json:"killed_inside"`
	LostSignals    int            `json:"lost_signals"`
	LostUnlocks    int            `json:"lost_unlocks"`
	NoTokens       int            `json:"no_token"`
	LateCredits    int            `json:"late_credits"`
	Overlaps       int            `json:"overlaps"`
	// The overlaps by what the earlier hold learnt (see overlaps), and
	// those that no failover or key fault explains (each a violation).
	OverlapsReported        int `json:"overlaps_reported"`
	OverlapsSilent          int `json:"overlaps_silent"`
	OverlapsOutsideFailover int `json:"overlaps_outside_failover"`
	// OverlapsAfterKeyFault counts the reported overlaps that a key fault
	// explains, and KeyOverlap how long they overlapped: from the later
	// hold's entry to the end of the earlier one's live interval, its
	// Lost or its exit (see blindtime.go for the rest).
	OverlapsAfterKeyFault int       `json:"overlaps_after_key_fault"`
	KeyOverlap            blindTime `json:"key_fault_overlap"`
	// SilentTenureTold counts the silent overlaps after a key fault whose
	// silent hold's tenure was told within a lease all the same, in a
	// later hold: the silent hold ran, and a local hand-off ended it,
	// while the registry was blind.
	SilentTenureTold int `json:"silent_overlaps_tenure_told"`
	// KeyFaults is, by key fault kind, what it struck and the blind time
	// of the holders; Untold counts the holders not told within a lease
	// (each a violation); TakenAfterTold the struck tenures whose key
	// another worker took after the holder was told, while it was still
	// inside (no overlap: its live interval had ended).
	KeyFaults      map[string]keyFaultResult `json:"key_faults,omitempty"`
	Untold         int                       `json:"not_told_within_lease"`
	TakenAfterTold int                       `json:"taken_after_told"`
	// EvictionRefused says whether a registry without WithEvictionAllowed
	// refused the evicting lock Redis (nil: not checked); EvictionRefusal
	// is what it said.
	EvictionRefused *bool  `json:"eviction_refused,omitempty"`
	EvictionRefusal string `json:"eviction_refusal,omitempty"`
	// Switches counts the promotions the watcher saw, Spontaneous those no
	// injected failover caused; AtFailover the holds live at one, and
	// LostAtFailover those of them lost (see atFailovers).
	Switches       int   `json:"failovers_seen"`
	Spontaneous    int   `json:"failovers_spontaneous"`
	AtFailover     int   `json:"holds_at_failover"`
	LostAtFailover int   `json:"holds_lost_at_failover"`
	Acknowledged   bool  `json:"acknowledged_holds"`
	TokenOrder     int   `json:"token_order_violations"`
	DuplicateToken int   `json:"duplicate_tokens"`
	StaleReads     tally `json:"stale_reads"`
	StaleWrites    tally `json:"stale_writes"`
	RaceRejected   int   `json:"rejected_in_race"`
	StoreRejected  int64 `json:"rejected_by_store"`
	LateOps        tally `json:"ops_after_lease"`
	StoreFailed    int   `json:"store_calls_failed"`
	Increments     int64 `json:"increments_accepted"`
	IncrementsSeen int64 `json:"increments_reported"`
	FinalValue     int64 `json:"final_value"`
	LostIncrements int64 `json:"lost_increments"`
	Timeouts       int   `json:"timeouts"`
	// LongWaits counts the acquisitions that waited half of -wait or more
	// (those that gave up at -wait included), and LongWaitUse sums how
	// their key was used meanwhile (busy.go).
	LongWaits     int                 `json:"long_waits"`
	LongWaitUse   longWaitUse         `json:"long_wait_use"`
	NeverAcquired int                 `json:"never_acquired"`
	Unrecovered   int                 `json:"unrecovered_faults"`
	Recovery      map[string]recovery `json:"recovery"`
	RecoveryAll   recovery            `json:"recovery_all"`
	Takeover      recovery            `json:"takeover"`
	// Promotion: from each failover's kill to the promotion, by variant;
	// Failovers lists each with its recovery.
	Promotion map[string]recovery `json:"promotion"`
	Failovers []faultResult       `json:"failovers,omitempty"`
	// ViolationCount counts every violation; Violations spells out the
	// first maxListed.
	ViolationCount int      `json:"violation_count"`
	Violations     []string `json:"violations"`
	// Notes are the first maxListed oddities that are no violation (a
	// loss with another cause than the key fault's own).
	Notes []string `json:"notes,omitempty"`
}

// faultResult is one fault's takeover and recovery (-1: none).
type faultResult struct {
	Kind       string  `json:"kind"`
	Variant    string  `json:"variant"`
	Note       string  `json:"note"`
	TakeoverMs float64 `json:"takeover_ms"`
	RecoveryMs float64 `json:"recovery_ms"`
}

// tally splits fenced-store calls by the store's answer.
type tally struct {
	Rejected int `json:"rejected"`
	Accepted int `json:"accepted"`
}

// recovery summarizes times measured from faults: to the next fresh
// acquisition after each, or to another worker's takeover of a victim's key.
type recovery struct {
	N        int     `json:"n"`
	MedianMs float64 `json:"median_ms"`
	MaxMs    float64 `json:"max_ms"`
	samples  []time.Duration
}

// recoveries summarizes samples by kind.
func recoveries(samples map[string][]time.Duration) map[string]recovery {
	out := make(map[string]recovery, len(samples))
	for k, s := range samples {
		out[k] = newRecovery(s)
	}
	return out
}

func newRecovery(samples []time.Duration) recovery {
	r := recovery{N: len(samples), samples: samples}
	if len(samples) > 0 {
		s := slices.Sorted(slices.Values(samples))
		r.MedianMs, r.MaxMs = ms(s[len(s)/2]), ms(s[len(s)-1])
	}
	return r
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func (r *result) violation(format string, a ...any) {
	r.ViolationCount++
	if len(r.Violations) < maxListed {
		r.Violations = append(r.Violations, fmt.Sprintf(format, a...))
	}
}

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

// merge sums the results of a run's phases.
func merge(parts []*result) *result {
	t := &result{Faults: make(map[string]int), Recovery: make(map[string]recovery), Promotion: make(map[string]recovery)}
	byKind := make(map[string][]time.Duration)
	promotions := make(map[string][]time.Duration)
	var all, takeovers, keyOverlaps []time.Duration
	for _, p := range parts {
		t.Seconds += p.Seconds
		t.Workers += p.Workers
		t.Acquisitions += p.Acquisitions
		t.Fresh += p.Fresh
		t.Handoffs += p.Handoffs
		t.MaxWaitMs = max(t.MaxWaitMs, p.MaxWaitMs)
		for k, n := range p.Faults {
			t.Faults[k] += n
		}
		t.VictimsHolding += p.VictimsHolding
		t.Live += p.Live
		t.NeverLive += p.NeverLive
		t.Outlived += p.Outlived
		t.OutlivedUntold += p.OutlivedUntold
		t.KilledInside += p.KilledInside
		t.LostSignals += p.LostSignals
		t.LostUnlocks += p.LostUnlocks
		t.NoTokens += p.NoTokens
		t.LateCredits += p.LateCredits
		t.Overlaps += p.Overlaps
		t.OverlapsReported += p.OverlapsReported
		t.OverlapsSilent += p.OverlapsSilent
		t.OverlapsOutsideFailover += p.OverlapsOutsideFailover
		t.OverlapsAfterKeyFault += p.OverlapsAfterKeyFault
		t.SilentTenureTold += p.SilentTenureTold
		keyOverlaps = append(keyOverlaps, p.KeyOverlap.samples...)
		t.Untold += p.Untold
		t.TakenAfterTold += p.TakenAfterTold
		if p.EvictionRefused != nil {
			t.EvictionRefused, t.EvictionRefusal = p.EvictionRefused, p.EvictionRefusal
		}
		for _, n := range p.Notes {
			if len(t.Notes) < maxListed {
				t.Notes = append(t.Notes, fmt.Sprintf("keys=%d: %s", p.Keys, n))
			}
		}
		t.Switches += p.Switches
		t.Spontaneous += p.Spontaneous
		t.AtFailover += p.AtFailover
		t.LostAtFailover += p.LostAtFailover
		t.Acknowledged = p.Acknowledged
		t.Failovers = append(t.Failovers, p.Failovers...)
		t.TokenOrder += p.TokenOrder
		t.DuplicateToken += p.DuplicateToken
		t.StaleReads.Rejected += p.StaleReads.Rejected
		t.StaleReads.Accepted += p.StaleReads.Accepted
		t.StaleWrites.Rejected += p.StaleWrites.Rejected
		t.StaleWrites.Accepted += p.StaleWrites.Accepted
		t.RaceRejected += p.RaceRejected
		t.StoreRejected += p.StoreRejected
		t.LateOps.Rejected += p.LateOps.Rejected
		t.LateOps.Accepted += p.LateOps.Accepted
		t.StoreFailed += p.StoreFailed
		t.Increments += p.Increments
		t.IncrementsSeen += p.IncrementsSeen
		t.FinalValue += p.FinalValue
		t.LostIncrements += p.LostIncrements
		t.Timeouts += p.Timeouts
		t.LongWaits += p.LongWaits
		t.LongWaitUse.HeldS += p.LongWaitUse.HeldS
		t.LongWaitUse.DownS += p.LongWaitUse.DownS
		t.LongWaitUse.FreeS += p.LongWaitUse.FreeS
		t.NeverAcquired += p.NeverAcquired
		t.Unrecovered += p.Unrecovered
		for k, rec := range p.Recovery {
			byKind[k] = append(byKind[k], rec.samples...)
		}
		all = append(all, p.RecoveryAll.samples...)
		takeovers = append(takeovers, p.Takeover.samples...)
		for v, rec := range p.Promotion {
			promotions[v] = append(promotions[v], rec.samples...)
		}
		t.ViolationCount += p.ViolationCount
		for _, v := range p.Violations {
			if len(t.Violations) < maxListed {
				t.Violations = append(t.Violations, fmt.Sprintf("keys=%d: %s", p.Keys, v))
			}
		}
	}
	t.Recovery = recoveries(byKind)
	t.RecoveryAll = newRecovery(all)
	t.Takeover = newRecovery(takeovers)
	t.Promotion = recoveries(promotions)
	t.KeyOverlap = newBlindTime(keyOverlaps)
	t.KeyFaults = mergeKeyFaults(parts)
	return t
}
