//go:build linux

package main

import (
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
)

// labelWidth fits the longest label of the table.
const labelWidth = 66

func writeTable(w io.Writer, cfg config, phases []*result, total *result) error {
	cols := phases
	head := []string{""}
	for _, p := range phases {
		head = append(head, fmt.Sprintf("keys=%d", p.Keys))
	}
	if len(phases) > 1 {
		cols = append(append([]*result(nil), phases...), total)
		head = append(head, "total")
	}
	fmt.Fprintf(w, "lockcheck: topology %s, %d workers x %d goroutines, lease %v, retry %v, %v per key count, faults every %v, seed %d, %d CPUs",
		cfg.topology, cfg.p, cfg.g, cfg.lease, cfg.retry, cfg.perKeyCount, cfg.every, cfg.seed, runtime.NumCPU())
	if cfg.waitReplica > 0 {
		fmt.Fprintf(w, ", waiting for %d replica(s)", cfg.waitReplica)
	}
	fmt.Fprint(w, "\n\n")
	// The topology's default kinds, and any other the run injected.
	var kinds []string
	for _, k := range topologyFaults[cfg.topology] {
		if slices.Contains(defaultFaults[cfg.topology], k) || slices.Contains(cfg.faults, k) {
			kinds = append(kinds, k)
		}
	}
	replicated := cfg.topology != topoSingle
	var keyKinds []string // the key faults the run injected
	for _, k := range kinds {
		if isKeyFault(k) {
			keyKinds = append(keyKinds, k)
		}
	}
	evicts := slices.Contains(cfg.faults, faultEvict)
	// Right-aligned numbers under left-aligned labels: tabwriter aligns
	// whole columns, so the labels come padded.
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	row := func(label string, cell func(r *result) string) {
		fmt.Fprintf(tw, "%-*s\t", labelWidth, label)
		for _, r := range cols {
			fmt.Fprintf(tw, "%s\t", cell(r))
		}
		fmt.Fprintln(tw)
	}
	num := func(f func(r *result) int) func(*result) string {
		return func(r *result) string { return fmt.Sprint(f(r)) }
	}
	section := func(title string) {
		fmt.Fprintf(tw, "%-*s\t", labelWidth, title)
		for range cols {
			fmt.Fprint(tw, "\t")
		}
		fmt.Fprintln(tw)
	}
	fmt.Fprintf(tw, "%-*s\t%s\t\n", labelWidth, "", strings.Join(head[1:], "\t"))
	row("seconds", func(r *result) string { return fmt.Sprintf("%.1f", r.Seconds) })
	row("acquisitions", num(func(r *result) int { return r.Acquisitions }))
	row("  fresh from Redis", num(func(r *result) int { return r.Fresh }))
	row("  local hand-offs", num(func(r *result) int { return r.Handoffs }))
	row("longest wait for a lock (ms)", func(r *result) string { return fmt.Sprintf("%.0f", r.MaxWaitMs) })
	row(fmt.Sprintf("  waits of %v or more, those that gave up included", cfg.wait/2), num(func(r *result) int { return r.LongWaits }))
	row("  ... the key meanwhile, %: held by others / down by faults / free", func(r *result) string {
		if r.LongWaits == 0 {
			return "-"
		}
		held, down, free := r.LongWaitUse.shares()
		return fmt.Sprintf("%.0f / %.0f / %.1f", held, down, free)
	})
	row("faults injected", num(func(r *result) int {
		n := 0
		for _, c := range r.Faults {
			n += c
		}
		return n
	}))
	for _, k := range kinds {
		row("  "+k+": "+faultTitles[k], num(func(r *result) int { return r.Faults[k] }))
	}
	row("  victims of stop, kill-9, net- inside a critical section", num(func(r *result) int { return r.VictimsHolding }))
	if replicated {
		row("failovers seen (a replica promoted)", num(func(r *result) int { return r.Switches }))
		row("  ... that no injected failover caused", num(func(r *result) int { return r.Spontaneous }))
		held := "holds whose lease was live at a failover"
		if cfg.waitReplica > 0 {
			held = "acknowledged holds whose lease was live at a failover"
		}
		row(held, num(func(r *result) int { return r.AtFailover }))
		row("  ... lost (told so, or overlapped)", num(func(r *result) int { return r.LostAtFailover }))
	}
	row("holds whose lease was live when they entered", num(func(r *result) int { return r.Live }))
	row("  ... that outlived it (exited after it ended)", num(func(r *result) int { return r.Outlived }))
	row("  ... cut short by kill -9", num(func(r *result) int { return r.KilledInside }))
	row("holds whose lease had run out before they entered", num(func(r *result) int { return r.NeverLive }))
	row("Lost() fired during a hold", num(func(r *result) int { return r.LostSignals }))
	row("unlocks returning ErrLockLost", num(func(r *result) int { return r.LostUnlocks }))
	row("holds that got no token (lost or Redis failing when drawn)", num(func(r *result) int { return r.NoTokens }))
	row("holds credited after them, as grants a late subscription gap hid", num(func(r *result) int { return r.LateCredits }))
	section("fencing")
	row("  stale reads rejected", num(func(r *result) int { return r.StaleReads.Rejected }))
	row("  stale writes rejected", num(func(r *result) int { return r.StaleWrites.Rejected }))
	row("  other rejections (racing a newer token)", num(func(r *result) int { return r.RaceRejected }))
	row("  rejections the store counted", func(r *result) string { return fmt.Sprint(r.StoreRejected) })
	row("  store calls after the lease ended: rejected", num(func(r *result) int { return r.LateOps.Rejected }))
	row("  ... accepted (no newer token yet)", num(func(r *result) int { return r.LateOps.Accepted }))
	row("  increments accepted by the store", func(r *result) string { return fmt.Sprint(r.Increments) })
	row("  final value", func(r *result) string { return fmt.Sprint(r.FinalValue) })
	row("  store calls that failed", num(func(r *result) int { return r.StoreFailed }))
	section("overlapping live holds, by what the earlier hold learnt")
	row("  reported (Lost or ErrLockLost)", num(func(r *result) int { return r.OverlapsReported }))
	row("  silent", num(func(r *result) int { return r.OverlapsSilent }))
	if len(keyKinds) > 0 {
		keyFaultRows(row, num, section, keyKinds, evicts)
	}
	section("violations (each must be 0)")
	row("  overlaps that no failover or key fault explains", num(func(r *result) int { return r.OverlapsOutsideFailover }))
	if replicated || len(keyKinds) > 0 {
		row("  silent overlaps", num(func(r *result) int { return r.OverlapsSilent }))
	}
	if len(keyKinds) > 0 {
		row("  holders of a changed key not told within a lease", num(func(r *result) int { return r.Untold }))
	}
	if evicts {
		row("  evicting server not refused without WithEvictionAllowed", func(r *result) string {
			if r.EvictionRefused == nil {
				return "-"
			}
			return fmt.Sprint(b2i(!*r.EvictionRefused))
		})
	}
	row("  holds that outlived their lease, never told", num(func(r *result) int { return r.OutlivedUntold }))
	row("  fresh tokens not above earlier holds'", num(func(r *result) int { return r.TokenOrder }))
	row("  duplicate tokens", num(func(r *result) int { return r.DuplicateToken }))
	row("  stale reads accepted", num(func(r *result) int { return r.StaleReads.Accepted }))
	row("  stale writes accepted", num(func(r *result) int { return r.StaleWrites.Accepted }))
	row("  lost increments", func(r *result) string { return fmt.Sprint(r.LostIncrements) })
	row(fmt.Sprintf("  acquisitions that waited %v", cfg.wait), num(func(r *result) int { return r.Timeouts }))
	row("  goroutines that never got a lock", num(func(r *result) int { return r.NeverAcquired }))
	row("  faults never recovered from", num(func(r *result) int { return r.Unrecovered }))
	row("  all violations", num(func(r *result) int { return r.ViolationCount }))
	section("recovery, ms: fault end to next fresh acquisition (median / max)")
	rec := func(x recovery) string {
		if x.N == 0 {
			return "-"
		}
		return fmt.Sprintf("%.0f / %.0f", x.MedianMs, x.MaxMs)
	}
	for _, k := range kinds {
		row("  "+k, func(r *result) string { return rec(r.Recovery[k]) })
	}
	row("  all faults", func(r *result) string { return rec(r.RecoveryAll) })
	section("takeover, ms (median / max)")
	row("  stop, kill-9, net-stall: to another worker taking the key", func(r *result) string { return rec(r.Takeover) })
	if replicated {
		for _, v := range []string{"forced", "detected"} {
			row("  failovers, "+v+": from the kill to the promotion", func(r *result) string { return rec(r.Promotion[v]) })
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(total.Notes) > 0 {
		fmt.Fprintln(w, "\nnotes (no violations):")
		for _, n := range total.Notes {
			fmt.Fprintln(w, "  "+n)
		}
	}
	if total.ViolationCount == 0 {
		_, err := fmt.Fprintln(w, "\nno violations")
		return err
	}
	fmt.Fprintf(w, "\n%d VIOLATIONS", total.ViolationCount)
	if len(total.Violations) < total.ViolationCount {
		fmt.Fprintf(w, " (the first %d)", len(total.Violations))
	}
	fmt.Fprintln(w, ":")
	for _, v := range total.Violations {
		fmt.Fprintln(w, "  "+v)
	}
	return nil
}

func writeJSON(w io.Writer, cfg config, phases []*result, total *result) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(struct {
		Config map[string]any `json:"config"`
		Phases []*result      `json:"phases"`
		Total  *result        `json:"total"`
		OK     bool           `json:"ok"`
	}{
		Config: map[string]any{
			"topology": cfg.topology, "wait_replicas": cfg.waitReplica,
			"seconds": cfg.d.Seconds(), "keys": cfg.keys, "workers": cfg.p, "goroutines": cfg.g,
			"lease_ms": cfg.lease.Milliseconds(), "retry_ms": cfg.retry.Milliseconds(),
			"work_ms": cfg.work.Seconds() * 1000, "long": cfg.long, "wait_ms": cfg.wait.Milliseconds(),
			"every_ms": cfg.every.Milliseconds(), "faults": cfg.faults, "seed": cfg.seed, "cpus": runtime.NumCPU(),
		},
		Phases: phases, Total: total, OK: total.ViolationCount == 0,
	})
}

// keyFaultRows are the report's rows on the key faults (blindtime.go):
// for each kind, what it struck and how long the holders stayed blind.
func keyFaultRows(row func(string, func(*result) string), num func(func(*result) int) func(*result) string, section func(string), kinds []string, evicts bool) {
	section("key faults: held keys changed behind their holders' backs")
	for _, k := range kinds {
		kr := func(r *result) keyFaultResult { return r.KeyFaults[k] }
		row("  "+k+": injections / hitting a held key / tenures struck", func(r *result) string {
			return fmt.Sprintf("%d / %d / %d", kr(r).Injections, kr(r).Hit, kr(r).Struck)
		})
		row("  "+k+": blind time, ms: p50 / p99 / max", func(r *result) string { return blind(kr(r).Blind) })
		row("  "+k+": told by Lost / by ErrLockLost / not within a lease", func(r *result) string {
			return fmt.Sprintf("%d / %d / %d", kr(r).ToldByLost, kr(r).ToldByUnlock, kr(r).Untold)
		})
		row("  "+k+": Lost named "+expectedCause[k]+" / another cause (notes)", func(r *result) string {
			return fmt.Sprintf("%d / %d", kr(r).ToldByLost-kr(r).OtherCause, kr(r).OtherCause)
		})
	}
	row("  overlaps after a key fault, reported (taken before Lost)", num(func(r *result) int { return r.OverlapsAfterKeyFault }))
	row("  ... how long they overlapped, ms: p50 / p99 / max", func(r *result) string { return blind(r.KeyOverlap) })
	row("  silent overlaps after a key fault, the tenure told later", num(func(r *result) int { return r.SilentTenureTold }))
	row("  keys taken after their holder was told, while it was inside", num(func(r *result) int { return r.TakenAfterTold }))
	if evicts {
		row("  a registry without WithEvictionAllowed refused the server", func(r *result) string {
			switch {
			case r.EvictionRefused == nil:
				return "-"
			case *r.EvictionRefused:
				return "yes"
			}
			return "NO"
		})
	}
}

// blind renders a blindTime's p50 / p99 / max.
func blind(b blindTime) string {
	if b.N == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f / %.2f / %.2f", b.P50Ms, b.P99Ms, b.MaxMs)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
