//go:build linux

package main

import (
	"fmt"
	"slices"
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
