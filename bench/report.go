package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"image/color"
	"io"
	"io/fs"
	"maps"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// report writes results/<date>.json, RESULTS.md and the charts, and prints
// the table.
func report(out string, quick bool, results []Result, redisVersion string) error {
	now, machine := time.Now().UTC(), machineLine(redisVersion)
	if err := writeJSON(out, "", struct {
		Date    time.Time
		Machine string
		Quick   bool
		Results []Result
	}{now, machine, quick, results}, now, quick); err != nil {
		return err
	}
	md := markdown(now, machine, quick, results)
	fmt.Print(md)
	if quick {
		return nil // a smoke run leaves RESULTS.md and the charts alone
	}
	if err := os.WriteFile(filepath.Join(out, "RESULTS.md"), []byte(md), 0o644); err != nil {
		return err
	}
	return charts(filepath.Join(out, "charts"), results)
}

// reportRepeats writes results/<date>-repeat.json with every run's
// results and prints how often each target was met, run by run.
// RESULTS.md and the charts stay those of a single run.
func reportRepeats(out string, quick bool, runs [][]Result, redisVersion string) error {
	now, machine := time.Now().UTC(), machineLine(redisVersion)
	if err := writeJSON(out, "-repeat", struct {
		Date    time.Time
		Machine string
		Quick   bool
		Runs    [][]Result
	}{now, machine, quick, runs}, now, quick); err != nil {
		return err
	}
	printTally(os.Stdout, runs, fmt.Sprintf("%s, %s", now.Format(time.DateOnly), machine))
	return nil
}

// printTally prints how often each target was met over runs, and S1 across
// them, to w; about says where the runs come from.
func printTally(w io.Writer, runs [][]Result, about string) {
	checked := make([][]target, len(runs))
	for i, results := range runs {
		checked[i] = targets(results)
	}
	fmt.Fprintf(w, "# Targets over %d runs\n\n%s.\n\n%s%s", len(runs), about, tally(checked), s1AcrossRuns(runs))
}

// tallyFiles prints printTally's report over the runs that results files
// hold, a single run's or -repeat's, so that runs made apart can be
// pooled, to w. A smoke run's file is refused: its figures do not compare.
func tallyFiles(w io.Writer, paths []string) error {
	if len(paths) == 0 {
		return errors.New("-tally: name one or more results/*.json files")
	}
	var runs [][]Result
	for _, path := range paths {
		raw, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("-tally: %w", err)
		}
		var file struct {
			Quick   bool
			Results []Result
			Runs    [][]Result
		}
		if err := json.Unmarshal(raw, &file); err != nil {
			return fmt.Errorf("-tally: %s is not a results file that make bench or -repeat wrote: %w", path, err)
		}
		switch {
		case file.Quick:
			return fmt.Errorf("-tally: %s is a smoke run's (BENCH_QUICK): its figures do not compare; leave it out", path)
		case file.Results != nil:
			runs = append(runs, file.Results)
		case file.Runs != nil:
			runs = append(runs, file.Runs...)
		default:
			return fmt.Errorf("-tally: %s holds no Results or Runs: give files that make bench or -repeat wrote", path)
		}
	}
	printTally(w, runs, strings.Join(paths, ", "))
	return nil
}

// s1AcrossRuns says how lockreg's S1 cycle compares with each peer's over
// all the runs, each run's session one measurement: the geometric mean of
// lockreg's time over the peer's, and a 95% t interval of it over the
// runs. A session's own interval leaves out the machine's state between
// sessions; this one has it in, so a peer that makes the same calls
// (lockreg-spin, the A/A check) shows how wide a tie is. Peers with fewer
// than two runs get no interval. Then, likewise, each contender's time
// over the floor of a correct lock (VsLockFloor).
func s1AcrossRuns(runs [][]Result) string {
	var peers, floored []string
	logs, floors := map[string][]float64{}, map[string][]float64{}
	for _, results := range runs {
		for _, r := range results {
			if r.Scenario != "S1" || r.NA != "" || r.Err != "" {
				continue
			}
			if r.VsLockReg > 0 {
				if _, seen := logs[r.Contender]; !seen {
					peers = append(peers, r.Contender)
				}
				logs[r.Contender] = append(logs[r.Contender], -math.Log(r.VsLockReg))
			}
			if r.VsLockFloor > 0 {
				if _, seen := floors[r.Contender]; !seen {
					floored = append(floored, r.Contender)
				}
				floors[r.Contender] = append(floors[r.Contender], math.Log(r.VsLockFloor))
			}
		}
	}
	var b strings.Builder
	if len(peers) > 0 {
		fmt.Fprintf(&b, "\n# S1 across runs\n\nlockreg's time per cycle over the peer's, the geometric mean over the runs' sessions, with a 95%% interval over the runs:\n\n")
		for _, peer := range peers {
			b.WriteString(pooledLine("vs "+peer, logs[peer]))
		}
	}
	if len(floored) > 0 {
		fmt.Fprintf(&b, "\n# S1 against the floor of a correct lock, across runs\n\nEach contender's time per cycle over the lock floor's (lockreg's: over all sessions of a run), the geometric mean over the runs, with a 95%% interval over the runs:\n\n")
		for _, c := range floored {
			b.WriteString(pooledLine(c+" ÷ floor", floors[c]))
		}
	}
	return b.String()
}

// pooledLine is one line of s1AcrossRuns: the geometric mean of the
// ratios whose logs are l, its 95% t interval over them (with two or
// more) and their range.
func pooledLine(label string, l []float64) string {
	mean, sd := meanSD(l)
	line := fmt.Sprintf("- %s: %.4fx over %d runs", label, math.Exp(mean), len(l))
	if len(l) > 1 {
		half := studentT975(len(l)-1) * sd / math.Sqrt(float64(len(l)))
		line += fmt.Sprintf(", 95%% interval %.4fx-%.4fx", math.Exp(mean-half), math.Exp(mean+half))
	}
	lo, hi := slices.Min(l), slices.Max(l)
	return line + fmt.Sprintf(" (runs %.3fx-%.3fx)\n", math.Exp(lo), math.Exp(hi))
}

func meanSD(xs []float64) (mean, sd float64) {
	for _, x := range xs {
		mean += x
	}
	mean /= float64(len(xs))
	if len(xs) < 2 {
		return mean, 0
	}
	for _, x := range xs {
		sd += (x - mean) * (x - mean)
	}
	return mean, math.Sqrt(sd / float64(len(xs)-1))
}

// studentT975 is the 97.5th percentile of Student's t with df degrees of
// freedom (df ≥ 1); beyond 30 it stays at 30's, a little wide.
func studentT975(df int) float64 {
	table := [...]float64{12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
		2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
		2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042}
	return table[min(df, len(table))-1]
}

func machineLine(redisVersion string) string {
	return fmt.Sprintf("%s/%s, %d cores, %s, Redis %s", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version(), redisVersion)
}

// writeJSON writes v to results/<date><suffix>.json, or
// <date>-quick<suffix>.json for a smoke run. A later run of the same day
// goes to <date><suffix>-2.json, -3 and so on: published results are
// never overwritten.
func writeJSON(out, suffix string, v any, now time.Time, quick bool) error {
	if err := os.MkdirAll(filepath.Join(out, "results"), 0o755); err != nil {
		return err
	}
	raw, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	name := now.Format("2006-01-02")
	if quick {
		name += "-quick"
	}
	name += suffix
	for n := 1; ; n++ {
		path := filepath.Join(out, "results", name+".json")
		if n > 1 {
			path = filepath.Join(out, "results", fmt.Sprintf("%s-%d.json", name, n))
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if err != nil {
			return err
		}
		_, err = f.Write(raw)
		return errors.Join(err, f.Close())
	}
}

// tally says, for each target, in how many runs it was met, then each
// run's verdict and figure, targets in the order the runs checked them.
func tally(runs [][]target) string {
	var names []string
	byName := map[string][]string{}
	met := map[string]int{}
	for i, checked := range runs {
		for _, t := range checked {
			if _, seen := byName[t.Name]; !seen {
				names = append(names, t.Name)
			}
			byName[t.Name] = append(byName[t.Name], fmt.Sprintf("run %d: %s (%s)", i+1, t.verdict(), t.Figure))
			if t.Met {
				met[t.Name]++
			}
		}
	}
	var b strings.Builder
	for _, name := range names {
		fmt.Fprintf(&b, "- %s: met in %d of %d runs", name, met[name], len(byName[name]))
		if unchecked := len(runs) - len(byName[name]); unchecked > 0 {
			fmt.Fprintf(&b, " (%d more could not check it: its scenario or a contender was left out, or failed)", unchecked)
		}
		b.WriteString("\n")
		for _, line := range byName[name] {
			b.WriteString("  - " + line + "\n")
		}
	}
	return b.String()
}

// relative is r's cost relative to lockreg's (base): in S1, as measured in
// their shared session; elsewhere by ns/op.
func relative(r, base Result) float64 {
	if r.VsLockReg > 0 {
		return r.VsLockReg
	}
	return r.NsPerOp / base.NsPerOp
}

func find(results []Result, scenario, contender string) (Result, bool) {
	i := slices.IndexFunc(results, func(r Result) bool { return r.Scenario == scenario && r.Contender == contender })
	if i < 0 || results[i].NA != "" || results[i].Err != "" {
		return Result{}, false
	}
	return results[i], true
}

func markdown(date time.Time, machine string, quick bool, results []Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Side-by-side results\n\n%s, %s", date.Format(time.DateOnly), machine)
	if quick {
		b.WriteString(" (quick smoke run: figures are not comparable)")
	}
	b.WriteString(".\nProduced by `make bench` (bench/main.go): all contenders in one run against one redis-server.\n" +
		"Round trips are commands on the wire, counted by a proxy in a separate pass; server commands are INFO commandstats deltas (script bodies included).\n" +
		"Contenders take turns, so that noise falls on all alike: S2, S3, S5 and S6 in six rounds of a slice each; S4's and S7's processes one contender after another; S1 cycle by cycle in an order shuffled every cycle, one session per peer beside lockreg, the floor of a correct lock and two PINGs.\n" +
		"Each contender's timing pass lasts 3s (S3 and S7: 10s; S1: a 6s session per peer); a smoke run's, 300ms.\n" +
		"Ratios are to lockreg in the same scenario. " +
		"\"" + heapColumn + "\" weighs the live heap in a pass of its own, the contender connected straight to Redis and no other open, the harness recording nothing, over the live heap before the contender was made: the peak under load, weighed every 50ms by a full collection with each goroutine that holds its key parked until the weighing is done (connections, holds, waiters, pooled buffers, per-key state), and what stays once the workload is over, the contender still open (what it keeps per key once no goroutine uses the key).\n\n")
	b.WriteString("## Targets\n\n")
	for _, t := range targets(results) {
		fmt.Fprintf(&b, "- %s: %s (%s)\n", t.Name, t.verdict(), t.Figure)
	}
	for _, sc := range scenarios {
		if sc.scale != nil {
			b.WriteString(scaleMarkdown(sc, results))
			continue
		}
		fmt.Fprintf(&b, "\n## %s: %s\n\n", sc.id, sc.title)
		base, hasBase := find(results, sc.id, "lockreg")
		var rows []Result
		for _, r := range results {
			if r.Scenario == sc.id {
				rows = append(rows, r)
			}
		}
		cols := tableColumns(rows)
		b.WriteString("| contender |")
		for _, c := range cols {
			b.WriteString(" " + c.name + " |")
		}
		b.WriteString("\n| --- |" + strings.Repeat(" ---: |", len(cols)) + "\n")
		for _, r := range rows {
			switch {
			case r.NA != "":
				fmt.Fprintf(&b, "| %s | n/a (%s) |%s\n", r.Contender, r.NA, strings.Repeat(" |", len(cols)-1))
				continue
			case r.Err != "":
				fmt.Fprintf(&b, "| %s | error: %s |%s\n", r.Contender, strings.ReplaceAll(r.Err, "|", "/"), strings.Repeat(" |", len(cols)-1))
				continue
			}
			b.WriteString("| " + r.Contender + " |")
			for _, c := range cols {
				b.WriteString(" " + c.cell(r, base, hasBase) + " |")
			}
			b.WriteString("\n")
		}
		if sc.id == "S4" {
			b.WriteString("\nHand-offs between processes, split where the releaser's call returned (medians of each part, which need not add up to the hand-off's):\n\n")
			if i := slices.IndexFunc(results, func(r Result) bool { return r.Scenario == "S4" && (r.FloorPingP50 > 0 || r.FloorErr != "") }); i >= 0 {
				r := results[i]
				b.WriteString("- the floor, measured in a pass of its own: not a lock, one PUBLISH from the releasing process to the next one's subscription, no script: ")
				if r.FloorErr != "" {
					b.WriteString("error: " + r.FloorErr + "\n")
				} else {
					fmt.Fprintf(&b, "hand-off p50 %.0f µs (%.1f PING round trips of %.0f µs)\n", r.FloorHandoffP50/1e3, r.FloorHandoffP50/r.FloorPingP50, r.FloorPingP50/1e3)
				}
			}
			for _, r := range results {
				if r.Scenario == "S4" && r.ReleaseP50 > 0 && r.PingP50 > 0 {
					fmt.Fprintf(&b, "- %s: release call %.0f µs (%.1f PING round trips); the next process held the key %+.0f µs after it returned, and before it returned in %.0f%% of hand-offs\n",
						r.Contender, r.ReleaseP50/1e3, r.ReleaseP50/r.PingP50, r.AfterReleaseP50/1e3, 100*r.BeforeRelease)
				}
			}
		}
		if sc.id == "S4" {
			if base, ok := find(results, "S4", "lockreg"); ok {
				b.WriteString(splitMarkdown(base.Split))
			}
		}
		if sc.id == "S7" {
			fmt.Fprintf(&b, "\nEach process's one goroutine takes the key, holds it %v, releases it and asks again at once, so that every process waits for the others, longer than lockreg's retry interval (100ms). "+
				"\"overtaken\" counts, for each hold, the holds other processes took while its goroutine asked for it: when turns go first come, first served, at most %d, one for each other process; its 99th percentile and the most in the run. "+
				"\"holds per process\" is the fewest and the most one process got.\n", sc.workers.hold, sc.workers.processes-1)
		}
		if sc.id == "S1" {
			b.WriteString("\nOne session per peer: lockreg, the peer, the floor of a correct lock (below) and two PINGs (the old floor) took turns cycle by cycle, in an order shuffled every cycle so that each follows each other equally often, no other client alive; \"vs lockreg\" is measured within the peer's session, lockreg's figures sum all sessions. " +
				"The 95% intervals resample the session's blocks of " + strconv.Itoa(blockCycles) + " cycles: they show the noise within a session, not between sessions, which moves S1 more: `-repeat N` and `-tally` pool the sessions of many runs. " +
				"lockreg-spin makes the same Redis calls as lockreg when uncontended (its options differ only for waiting), so its session is an A/A check: how far two identical contenders can differ in one session.\n\n")
			for _, r := range results {
				if r.Scenario == "S1" && r.FloorNsPerOp > 0 {
					fmt.Fprintf(&b, "- %s: %.2fx of two PINGs (%.0f ns)", r.Contender, r.NsPerOp/r.FloorNsPerOp, r.FloorNsPerOp)
					if r.VsLockRegLo > 0 {
						fmt.Fprintf(&b, "; vs lockreg %.3fx, 95%% interval within the session %.3fx-%.3fx", r.VsLockReg, r.VsLockRegLo, r.VsLockRegHi)
					}
					b.WriteString("\n")
				}
			}
			b.WriteString(lockFloorMarkdown(results))
		}
	}
	return b.String()
}

// lockFloorMarkdown is S1 against the floor of a correct lock: in each
// peer's session, lockreg's time and the peer's over the floor's, beside
// each other, with their intervals within the session; and lockreg's
// over all sessions. It says nothing if the floor was not timed.
func lockFloorMarkdown(results []Result) string {
	var rows []Result
	var base *Result
	for _, r := range results {
		if r.Scenario != "S1" || r.VsLockFloor <= 0 || r.NA != "" || r.Err != "" {
			continue
		}
		if r.Contender == "lockreg" {
			base = &r
			continue
		}
		rows = append(rows, r)
	}
	if base == nil && len(rows) == 0 {
		return ""
	}
	ratio := func(x, lo, hi float64) string {
		if x <= 0 {
			return ""
		}
		if lo > 0 {
			return fmt.Sprintf("%.3fx (%.3fx-%.3fx)", x, lo, hi)
		}
		return fmt.Sprintf("%.3fx", x)
	}
	var b strings.Builder
	b.WriteString("\nAgainst the floor of a correct lock, a figure that travels between machines where two PINGs do not: `SET <key> <owner> NX PX 30000`, then `if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0` by EVALSHA, on one go-redis client, nothing else (`contenders/lockfloor.go`), timed in turn with the others in every session. " +
		"Each row is one session, lockreg and the peer over the floor beside each other, with 95% intervals within the session:\n\n" +
		"| session | lockreg ÷ floor | peer ÷ floor | floor (ns per cycle) |\n| --- | ---: | ---: | ---: |\n")
	if base != nil {
		fmt.Fprintf(&b, "| all sessions | %s | | %.0f |\n", ratio(base.VsLockFloor, base.VsLockFloorLo, base.VsLockFloorHi), base.LockFloorNsPerOp)
	}
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %.0f |\n", r.Contender, ratio(r.LockRegVsLockFloor, r.LockRegVsLockFloorLo, r.LockRegVsLockFloorHi),
			ratio(r.VsLockFloor, r.VsLockFloorLo, r.VsLockFloorHi), r.LockFloorNsPerOp)
	}
	return b.String()
}

// scaleMarkdown is S8's section, if the run measured it.
func scaleMarkdown(sc scenario, results []Result) string {
	var rows []Result
	for _, r := range results {
		if r.Scenario == sc.id {
			rows = append(rows, r)
		}
	}
	if len(rows) == 0 {
		return ""
	}
	rounds := sc.scale.rounds // a smoke run's rows say theirs
	for _, r := range rows {
		if r.Scale != nil && r.Scale.Rounds > 0 {
			rounds = r.Scale.Rounds
		}
	}
	priority := ""
	if rows[0].Scale != nil && rows[0].Scale.Realtime {
		priority = " The redis-server and the unrelated client ran at real-time priority (-realtime: SCHED_FIFO, ahead of the registry's process and every other ordinary one), so that the PINGs time Redis's own stalls rather than the sharing of the machine's cores."
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n## %s: %s\n\n", sc.id, sc.title)
	fmt.Fprintf(&b, "On a redis-server of its own, flushed before each row: %d goroutines take the keys (one registry; bsm/redislock one client), then they are held for %d renewal intervals (a third of the lease each) while an unrelated client, in a process and on a connection of its own, PINGs about every ms (and for %v at rest before any key is taken), then released. "+
		"Redis bytes per lock are INFO memory's used_memory delta over the keys, and in brackets the same less the clients' buffers (MEMORY STATS clients.normal), which move with what the connections did lately; Go heap bytes and objects per lock, runtime.MemStats' HeapAlloc and HeapObjects after two collections, over a baseline taken after a warm-up at the same parallelism (the least of three readings a third of a renewal interval apart, so that a renewal round's garbage is not counted as held); \"kept\" is what stays once all are released. "+
		"Server CPU is INFO cpu's sys+user over the window, in %% of one core; \"renew.lua in Redis\" is EVALSHA's commandstats usec over the window, in %% (the commands the scripts ran included). bsm/redislock holds without renewal: its memory only.%s\n\n", sc.scale.goroutines, rounds, sc.scale.rest, priority)
	b.WriteString("| contender | lease | keys | taking them (acq/s) | Redis bytes / lock (less client buffers) | Go heap bytes / objects per lock | heap kept per key (bytes) | renew calls/s | server cmds/s | server CPU % (at rest) | renew.lua in Redis % | PING p99 / max at rest (µs) | PING p99 / max while held (µs) | release all (ms) | lost |\n")
	b.WriteString("| --- |" + strings.Repeat(" ---: |", 14) + "\n")
	ping := func(f *PingFigures) string {
		if f == nil {
			return ""
		}
		return fmt.Sprintf("%.0f / %.0f", f.P99/1e3, f.Max/1e3)
	}
	var byName []string
	for _, r := range rows {
		s := r.Scale
		switch {
		case r.Err != "" && s == nil:
			fmt.Fprintf(&b, "| %s | error: %s |%s\n", r.Contender, strings.ReplaceAll(r.Err, "|", "/"), strings.Repeat(" |", 13))
			continue
		case s.MemoryOnly:
			fmt.Fprintf(&b, "| %s | none (memory only) | %d | | %.0f (%.0f) | %.0f / %.1f | %.0f |%s\n", r.Contender, s.Keys, s.RedisBytesPerLock, s.RedisBytesLessClients, s.HeapBytesPerLock, s.HeapObjectsPerLock, s.HeapKeptPerKey, strings.Repeat(" |", 8))
			continue
		}
		fmt.Fprintf(&b, "| %s | %v | %d | %.0f | %.0f (%.0f) | %.0f / %.1f | %.0f | %.0f | %.0f | %.1f (%.1f) | %.1f | %s | %s | %.0f | %d |\n",
			r.Contender, time.Duration(s.Lease), s.Keys, s.AcqPerSec, s.RedisBytesPerLock, s.RedisBytesLessClients, s.HeapBytesPerLock, s.HeapObjectsPerLock, s.HeapKeptPerKey,
			s.RenewCallsPerSec, s.ServerCmdsPerSec, s.ServerCPU, s.ServerCPURest, s.ScriptBusy, ping(s.PingRest), ping(s.PingHold), s.ReleaseAll/1e6, s.Lost)
		if r.Err != "" {
			byName = append(byName, fmt.Sprintf("- %s, lease %v: error: %s", r.Contender, time.Duration(s.Lease), r.Err))
		}
		if s.RoundsTaking != nil || s.RoundsHeld != nil {
			rf := func(f *RoundFigures) string {
				if f == nil {
					return "none"
				}
				return fmt.Sprintf("%d, median %.0f ms, longest %.0f ms", f.N, f.P50/1e6, f.Max/1e6)
			}
			// Tracked keys renew on the registry's tracking connections,
			// which no hook on its client sees: "none" while held is those.
			byName = append(byName, fmt.Sprintf("- %s, lease %v: renewal rounds on the registry's client (one pipeline each; tracked keys renew on its tracking connections, untimed) while the keys were taken: %s; while they were held: %s",
				r.Contender, time.Duration(s.Lease), rf(s.RoundsTaking), rf(s.RoundsHeld)))
		}
		if s.Lost > 0 {
			var causes []string
			for _, cause := range slices.Sorted(maps.Keys(s.LostBy)) {
				causes = append(causes, fmt.Sprintf("%s %d", cause, s.LostBy[cause]))
			}
			byName = append(byName, fmt.Sprintf("- %s, lease %v: %d of %d holds were lost before their release (causes signalled: %s): this row's figures are not those of as many held locks",
				r.Contender, time.Duration(s.Lease), s.Lost, s.Keys, strings.Join(causes, ", ")))
		}
		if len(s.ServerCmdsByName) > 0 {
			names := slices.Collect(maps.Keys(s.ServerCmdsByName))
			slices.SortFunc(names, func(a, c string) int { return cmpFloat(s.ServerCmdsByName[c], s.ServerCmdsByName[a]) })
			var parts []string
			for _, name := range names {
				parts = append(parts, fmt.Sprintf("%s %.0f (%.0f µs)", name, s.ServerCmdsByName[name], s.ServerUsecByName[name]))
			}
			byName = append(byName, fmt.Sprintf("- %s, lease %v, while held: server commands/s by name (and their µs in Redis per s; a script's include the commands it ran): %s; the registry's tracking reads: %.0f/s", r.Contender, time.Duration(s.Lease), strings.Join(parts, ", "), s.TrackCallsPerSec))
		}
	}
	if len(byName) > 0 {
		b.WriteString("\n" + strings.Join(byName, "\n") + "\n")
	}
	return b.String()
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// column is one figure of a scenario's table.
type column struct {
	name string
	cell func(r, base Result, hasBase bool) string
	// optional columns appear only in scenarios where some contender has
	// the figure.
	has func(Result) bool
}

const heapColumn = "live heap peak / kept (KiB)"

var columns = []column{
	{name: "ns/op", cell: func(r, _ Result, _ bool) string { return fmt.Sprintf("%.0f", r.NsPerOp) }},
	{name: "vs lockreg", cell: func(r, base Result, hasBase bool) string {
		if !hasBase || base.NsPerOp <= 0 {
			return ""
		}
		return fmt.Sprintf("%.2fx", relative(r, base))
	}},
	{name: "acq/s", cell: func(r, _ Result, _ bool) string { return fmt.Sprintf("%.0f", r.AcqPerSec) }},
	{name: "round trips/op", cell: func(r, _ Result, _ bool) string { return fmt.Sprintf("%.2f", r.RoundTrips) }},
	{name: "server cmds/op", cell: func(r, _ Result, _ bool) string { return fmt.Sprintf("%.2f", r.ServerCmds) }},
	{name: "wait p50 / p99 (µs)", cell: func(r, _ Result, _ bool) string {
		return ifSet(r.WaitP50 > 0, "%.0f / %.0f", r.WaitP50/1e3, r.WaitP99/1e3)
	}, has: func(r Result) bool { return r.WaitP50 > 0 }},
	{name: "max wait (ms)", cell: func(r, _ Result, _ bool) string {
		return ifSet(r.MaxWait > 0, "%.1f", r.MaxWait/1e6)
	}, has: func(r Result) bool { return r.MaxWait > 0 }},
	{name: "hand-off p50 / p99 (µs)", cell: func(r, _ Result, _ bool) string {
		return ifSet(r.HandoffP50 > 0, "%.0f / %.0f", r.HandoffP50/1e3, r.HandoffP99/1e3)
	}, has: func(r Result) bool { return r.HandoffP50 > 0 }},
	{name: "overtaken p99 / max", cell: func(r, _ Result, _ bool) string {
		return ifSet(r.MostHolds > 0, "%d / %d", r.OvertakenP99, r.OvertakenMax)
	}, has: func(r Result) bool { return r.MostHolds > 0 }},
	{name: "holds per process, fewest / most", cell: func(r, _ Result, _ bool) string {
		return ifSet(r.MostHolds > 0, "%d / %d", r.FewestHolds, r.MostHolds)
	}, has: func(r Result) bool { return r.MostHolds > 0 }},
	{name: "allocs/op", cell: func(r, _ Result, _ bool) string {
		return ifSet(r.AllocsPerOp > 0, "%.1f", r.AllocsPerOp)
	}, has: func(r Result) bool { return r.AllocsPerOp > 0 }},
	{name: heapColumn, cell: func(r, _ Result, _ bool) string {
		return ifSet(r.HeapPeak > 0, "%.0f / %.0f", float64(r.HeapPeak)/1024, float64(r.HeapKept)/1024)
	}, has: func(r Result) bool { return r.HeapPeak > 0 }},
}

// tableColumns picks the columns of a scenario's table.
func tableColumns(rows []Result) []column {
	var out []column
	for _, c := range columns {
		if c.has == nil || slices.ContainsFunc(rows, c.has) {
			out = append(out, c)
		}
	}
	return out
}

func ifSet(set bool, format string, args ...any) string {
	if !set {
		return ""
	}
	return fmt.Sprintf(format, args...)
}

// target is one of the targets, checked against one run.
type target struct {
	Name   string
	Met    bool
	Figure string // what the run measured
}

// verdict says plainly whether the target was missed.
func (t target) verdict() string {
	if t.Met {
		return "met"
	}
	return "**missed**"
}

// targets checks the targets against one run's results.
func targets(results []Result) []target {
	var out []target
	check := func(name string, ok bool, figure string) {
		out = append(out, target{Name: name, Met: ok, Figure: figure})
	}
	lr := func(s string) (Result, bool) { return find(results, s, "lockreg") }
	if r, ok := lr("S1"); ok && r.FloorNsPerOp > 0 {
		check("S1 lockreg within 1.25x of two PINGs", r.NsPerOp <= 1.25*r.FloorNsPerOp, fmt.Sprintf("%.2fx", r.NsPerOp/r.FloorNsPerOp))
		if b, ok := find(results, "S1", "bsm/redislock-linear"); ok {
			figure := fmt.Sprintf("%.3fx of bsm/redislock, cycle by cycle in one session", 1/relative(b, r))
			if b.VsLockRegLo > 0 {
				figure += fmt.Sprintf("; 95%% interval within the session %.3fx-%.3fx", 1/b.VsLockRegHi, 1/b.VsLockRegLo)
			}
			check("S1 no slower than bsm/redislock", relative(b, r) >= 1, figure)
		}
	}
	if r, ok := lr("S2"); ok {
		if red, ok := find(results, "S2", "redisson-style"); ok && r.RoundTrips > 0 {
			check("S2 at least 5x fewer round trips than Redisson-style", red.RoundTrips >= 5*r.RoundTrips,
				fmt.Sprintf("%.2f vs %.2f per outer cycle", r.RoundTrips, red.RoundTrips))
		} else if ok {
			check("S2 at least 5x fewer round trips than Redisson-style", red.RoundTrips > 0, fmt.Sprintf("0 vs %.2f per outer cycle", red.RoundTrips))
		}
		if red, ok := find(results, "S2", "redisson-style"); ok {
			check("S2 at least 10x faster than Redisson-style", red.NsPerOp >= 10*r.NsPerOp, fmt.Sprintf("%.0f vs %.0f ns per outer cycle", r.NsPerOp, red.NsPerOp))
		}
	}
	if r, ok := find(results, "S3", "lockreg-spin"); ok {
		check("S3 round trips per acquisition at most 2.05 without hand-off (lockreg-spin)", r.RoundTrips <= 2.05, fmt.Sprintf("%.2f", r.RoundTrips))
	}
	if r, ok := lr("S3"); ok {
		for _, peer := range []string{"bsm/redislock-linear", "redsync"} {
			if p, ok := find(results, "S3", peer); ok {
				check("S3 acquisitions/s at least 5x "+peer, r.AcqPerSec >= 5*p.AcqPerSec, fmt.Sprintf("%.0f vs %.0f", r.AcqPerSec, p.AcqPerSec))
			}
		}
	}
	if r, ok := lr("S4"); ok {
		if red, ok := find(results, "S4", "redisson-style"); ok {
			check("S4 acquisitions/s at least Redisson-style's", r.AcqPerSec >= red.AcqPerSec, fmt.Sprintf("%.0f vs %.0f", r.AcqPerSec, red.AcqPerSec))
		}
		if r.PingP50 > 0 {
			check("S4 hand-off p50 within 3 round trips", r.HandoffP50 <= 3*r.PingP50,
				fmt.Sprintf("%.1f PING round trips of %.0f µs, measured under the same load", r.HandoffP50/r.PingP50, r.PingP50/1e3))
		}
	}
	if r, ok := lr("S6"); ok {
		for _, peer := range []string{"rueidislock", "bsm/redislock-linear"} {
			if p, ok := find(results, "S6", peer); ok {
				check("S6 ns/op below "+peer, r.NsPerOp < p.NsPerOp, fmt.Sprintf("%.0f vs %.0f", r.NsPerOp, p.NsPerOp))
			}
		}
	}
	return out
}

// charts draws the round trips, server commands and throughput by
// scenario and contender, how S7's processes took turns, and the S4
// hand-off latencies.
func charts(dir string, results []Result) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var names []string
	for _, r := range results {
		if !slices.Contains(names, r.Contender) {
			names = append(names, r.Contender)
		}
	}
	bars := func(file, title, unit string, ids []string, value func(Result) float64) error {
		p := plot.New()
		p.Title.Text = title
		p.Y.Label.Text = unit
		w := vg.Points(60 / float64(len(names)))
		for i, name := range names {
			vals := make(plotter.Values, len(ids))
			for j, id := range ids {
				if r, ok := find(results, id, name); ok {
					vals[j] = value(r)
				}
			}
			bar, err := plotter.NewBarChart(vals, w)
			if err != nil {
				return err
			}
			bar.Color = plotutil.Color(i)
			bar.LineStyle.Width = 0
			bar.Offset = w * vg.Length(float64(i)-float64(len(names)-1)/2)
			p.Add(bar)
			p.Legend.Add(name, bar)
		}
		p.Legend.Top = true
		p.NominalX(ids...)
		return p.Save(9*vg.Inch, 5*vg.Inch, filepath.Join(dir, file))
	}
	var all []string
	for _, sc := range scenarios {
		if sc.scale == nil { // S8 has a table of its own
			all = append(all, sc.id)
		}
	}
	if err := bars("roundtrips.png", "Round trips per acquisition (commands sent)", "commands", all, func(r Result) float64 { return r.RoundTrips }); err != nil {
		return err
	}
	if err := bars("servercmds.png", "Server commands per acquisition (INFO commandstats)", "commands", all, func(r Result) float64 { return r.ServerCmds }); err != nil {
		return err
	}
	if err := bars("throughput.png", "Throughput on one hot key", "acquisitions/s", []string{"S3", "S4"}, func(r Result) float64 { return r.AcqPerSec }); err != nil {
		return err
	}
	if err := turnsChart(filepath.Join(dir, "s7-turns.png"), results); err != nil {
		return err
	}
	p := plot.New()
	p.Title.Text = "S4 hand-off latency, release to the next process's acquisition"
	p.Y.Label.Text = "µs (log scale)"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{}
	var labels []string
	for i, name := range names {
		r, ok := find(results, "S4", name)
		if !ok || len(r.Handoffs) == 0 {
			continue
		}
		vals := make(plotter.Values, len(r.Handoffs))
		for j, h := range r.Handoffs {
			vals[j] = max(h/1e3, 1)
		}
		box, err := plotter.NewBoxPlot(vg.Points(20), float64(len(labels)), vals)
		if err != nil {
			return err
		}
		box.FillColor = color.Transparent
		box.BoxStyle.Color = plotutil.Color(i)
		p.Add(box)
		labels = append(labels, name)
	}
	if len(labels) == 0 {
		return nil
	}
	p.NominalX(labels...)
	return p.Save(9*vg.Inch, 5*vg.Inch, filepath.Join(dir, "s4-handoff.png"))
}

// turnsChart draws, for each contender that ran S7, the most and the
// fewest holds one of its processes got; with none, it draws nothing.
func turnsChart(file string, results []Result) error {
	var names []string
	var most, fewest plotter.Values
	for _, r := range results {
		if r.Scenario == "S7" && r.MostHolds > 0 {
			names = append(names, r.Contender)
			most, fewest = append(most, float64(r.MostHolds)), append(fewest, float64(r.FewestHolds))
		}
	}
	if len(names) == 0 {
		return nil
	}
	s7 := scenarios[slices.IndexFunc(scenarios, func(sc scenario) bool { return sc.id == "S7" })]
	p := plot.New()
	p.Title.Text = fmt.Sprintf("S7: holds per process, %d processes taking one key in turn for %v", s7.workers.processes, s7.timing)
	p.Y.Label.Text = "holds"
	w := vg.Points(18)
	for i, bars := range []struct {
		label string
		vals  plotter.Values
	}{{"the process with the most", most}, {"the process with the fewest", fewest}} {
		bar, err := plotter.NewBarChart(bars.vals, w)
		if err != nil {
			return err
		}
		bar.Color = plotutil.Color(i)
		bar.LineStyle.Width = 0
		bar.Offset = w * vg.Length(float64(i)-0.5)
		p.Add(bar)
		p.Legend.Add(bars.label, bar)
	}
	p.Legend.Top, p.Legend.Left = true, true // the even contenders come first, their bars low
	p.NominalX(names...)
	return p.Save(9*vg.Inch, 5*vg.Inch, file)
}
