package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockreg/lockreg/bench/contenders"
	"github.com/lockreg/lockreg/internal/faultproxy"
)

// TestS4NamesTheHandoffFloor: RESULTS.md gives the floor's hand-off in
// PING round trips of its own pass, once, says why it failed if it did,
// and says nothing of a floor a run did not measure.
func TestS4NamesTheHandoffFloor(t *testing.T) {
	s4 := func(floorPing float64) []Result {
		return []Result{
			{Scenario: "S4", Contender: "lockreg", HandoffP50: 250e3, PingP50: 90e3, ReleaseP50: 180e3, FloorHandoffP50: 150e3, FloorPingP50: floorPing},
			{Scenario: "S4", Contender: "bsm/redislock-exp", HandoffP50: 220e3, PingP50: 88e3, ReleaseP50: 160e3, FloorHandoffP50: 150e3, FloorPingP50: floorPing},
		}
	}
	md := markdown(time.Now(), "test machine", false, s4(75e3))
	if n := strings.Count(md, "- the floor,"); n != 1 {
		t.Fatalf("the floor is named %d times, want once:\n%s", n, md)
	}
	if !strings.Contains(md, "hand-off p50 150 µs (2.0 PING round trips of 75 µs)") {
		t.Errorf("the floor's figures are not in its own PINGs:\n%s", md)
	}
	if md := markdown(time.Now(), "test machine", false, s4(0)); strings.Contains(md, "the floor,") {
		t.Errorf("a floor that was not measured is named:\n%s", md)
	}
	failed := s4(0)
	for i := range failed {
		failed[i].FloorErr = "worker 2: exit status 1"
	}
	if md := markdown(time.Now(), "test machine", false, failed); !strings.Contains(md, "no script: error: worker 2: exit status 1\n") {
		t.Errorf("a floor that failed does not say why:\n%s", md)
	}
}

// TestTablesShowMaxWaitAndHeapWhereMeasured: S4's table shows the longest
// wait, S5's the heap a contender uses and keeps, and S7's how processes
// took turns, in the units the headers name; a scenario without those
// figures has no such columns, and its n/a rows have as many cells as its
// header.
func TestTablesShowMaxWaitAndHeapWhereMeasured(t *testing.T) {
	results := []Result{
		{Scenario: "S2", Contender: "lockreg", NsPerOp: 1600, AcqPerSec: 3e6},
		{Scenario: "S2", Contender: "bsm/redislock-linear", NA: "not reentrant"},
		{Scenario: "S4", Contender: "lockreg", NsPerOp: 96000, AcqPerSec: 10400, WaitP50: 6.2e6, WaitP99: 10e6, MaxWait: 13.78e6, HandoffP50: 223e3, HandoffP99: 445e3},
		{Scenario: "S5", Contender: "lockreg", NsPerOp: 11600, AcqPerSec: 85700, WaitP50: 342e3, WaitP99: 1225e3, MaxWait: 5.1e6, AllocsPerOp: 36.3, HeapPeak: 3 << 20, HeapKept: 2 << 20},
		{Scenario: "S7", Contender: "lockreg", NsPerOp: 52e6, AcqPerSec: 19, MaxWait: 160e6, OvertakenP99: 3, OvertakenMax: 5, FewestHolds: 47, MostHolds: 52},
		{Scenario: "S7", Contender: "redsync", NsPerOp: 60e6, AcqPerSec: 16, MaxWait: 900e6, OvertakenP99: 9, OvertakenMax: 14, FewestHolds: 20, MostHolds: 61},
	}
	md := markdown(time.Now(), "test machine", false, results)
	table := func(id string) []string {
		_, rest, ok := strings.Cut(md, "\n## "+id+":")
		if !ok {
			t.Fatalf("no %s section in\n%s", id, md)
		}
		var rows []string
		for _, line := range strings.Split(rest, "\n")[1:] {
			if strings.HasPrefix(line, "## ") {
				break
			}
			if strings.HasPrefix(line, "|") {
				rows = append(rows, line)
			}
		}
		return rows
	}
	s4, s5, s2, s7 := table("S4"), table("S5"), table("S2"), table("S7")
	if !strings.Contains(s4[0], "| max wait (ms) |") || !strings.Contains(s4[2], "| 13.8 |") {
		t.Errorf("S4 lacks the max wait:\n%s", strings.Join(s4, "\n"))
	}
	if !strings.Contains(s5[0], "| "+heapColumn+" |") || !strings.Contains(s5[2], "| 3072 / 2048 |") {
		t.Errorf("S5 lacks the heap's peak and what stays:\n%s", strings.Join(s5, "\n"))
	}
	if !strings.Contains(s7[0], "| overtaken p99 / max | holds per process, fewest / most |") ||
		!strings.Contains(s7[2], "| 3 / 5 | 47 / 52 |") || !strings.Contains(s7[3], "| 9 / 14 | 20 / 61 |") {
		t.Errorf("S7 lacks how processes took turns:\n%s", strings.Join(s7, "\n"))
	}
	if strings.Contains(s4[0], "overtaken") || strings.Contains(s4[0], heapColumn) || strings.Contains(s2[0], "max wait") || strings.Contains(s2[0], heapColumn) {
		t.Errorf("a column without figures:\nS4: %s\nS2: %s", s4[0], s2[0])
	}
	for _, rows := range [][]string{s2, s4, s5, s7} {
		for _, row := range rows[1:] {
			if strings.Count(row, "|") != strings.Count(rows[0], "|") {
				t.Errorf("row %q has not the header's %d cells", row, strings.Count(rows[0], "|")-1)
			}
		}
	}
}

// keeper is a contender that never touches Redis. It keeps perKey bytes
// for every key it was ever asked for, and perHold bytes while a key is
// held.
type keeper struct {
	perKey, perHold int
	mu              sync.Mutex
	kept            map[string][]byte
}

func (k *keeper) Acquire(_ context.Context, key string) (func(context.Context) error, error) {
	k.mu.Lock()
	if _, ok := k.kept[key]; !ok && k.perKey > 0 {
		k.kept[key] = make([]byte, k.perKey)
	}
	k.mu.Unlock()
	if k.perHold == 0 {
		return func(context.Context) error { return nil }, nil
	}
	held := make([]byte, k.perHold)
	return func(context.Context) error {
		runtime.KeepAlive(held)
		return nil
	}, nil
}

func (k *keeper) Reentrant() bool { return true }
func (k *keeper) Close() error    { return nil }

// pooled stands for the sync.Pools of contenders weighed before.
var pooled sync.Pool

// TestWeighingPassWeighsUseAndWhatStays: the weighing pass connects the
// contender straight to Redis, not through the proxy. A contender that
// keeps 4 KiB for each of 1,000 keys is found to keep about 4,000 KiB,
// though a pool held 4 MiB of garbage when its weighing began. One that
// holds 1 MiB per hold, in 4 goroutines, uses some MiB at its peak (its
// holders are weighed holding) and keeps nearly nothing. One that keeps
// nothing weighs under 256 KiB at its peak: the pass records no waits (8
// bytes for each of its hundreds of thousands of acquisitions), and
// weighs with the workload parked (without the pause, the collection
// counted the keys allocated while it ran: 541 KiB).
func TestWeighingPassWeighsUseAndWhatStays(t *testing.T) {
	env := &benchEnv{addr: "redis.invalid:6379", d: 900 * time.Millisecond} // a 300ms pass
	sc := scenario{id: "T", title: "4 goroutines, 1,000 keys", work: manyKeys(4, 1000)}
	const nothing = 256 << 10 // bytes: what keeping nothing may weigh
	weigh := func(k *keeper) load {
		t.Helper()
		f := contenders.Factory{Name: "keeper", New: func(addr string) (contenders.Contender, error) {
			if addr != env.addr {
				t.Errorf("the contender was connected to %s, want %s (straight to Redis)", addr, env.addr)
			}
			k.kept = map[string][]byte{}
			return k, nil
		}}
		l, err := env.weighingPass(context.Background(), sc, f)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	garbage := make([]byte, 4<<20)
	pooled.Put(&garbage)
	if l := weigh(&keeper{perKey: 4 << 10}); l.heapKept < 3900<<10 || l.heapKept > 5000<<10 {
		t.Errorf("keeping 4 KiB for each of 1,000 keys: weighed %d KiB kept, want about 4,000", l.heapKept>>10)
	}
	if l := weigh(&keeper{perHold: 1 << 20}); l.heapPeak < 2<<20 || l.heapKept > nothing {
		t.Errorf("holding 1 MiB in each of 4 goroutines: weighed a peak of %d KiB and %d KiB kept, want at least 2,048 at the peak and under %d kept",
			l.heapPeak>>10, l.heapKept>>10, nothing>>10)
	}
	l := weigh(&keeper{})
	if l.heapPeak > nothing {
		t.Errorf("keeping nothing: weighed a peak of %d KiB over %d acquisitions (%d KiB of waits, had they been recorded), want under %d",
			l.heapPeak>>10, l.acquisitions, l.acquisitions*8>>10, nothing>>10)
	}
	if l.acquisitions*8 < 2*nothing {
		t.Fatalf("only %d acquisitions: their waits (%d KiB) are too few to tell whether the pass records them", l.acquisitions, l.acquisitions*8>>10)
	}
}

// TestTallyCountsEachTargetOverRuns: each target is counted over the runs
// that checked it, with each run's verdict and figure, and says how many
// did not (here, a target only the last run checks).
func TestTallyCountsEachTargetOverRuns(t *testing.T) {
	s1 := func(vsLockReg float64) []Result {
		return []Result{
			{Scenario: "S1", Contender: "lockreg", NsPerOp: 100, FloorNsPerOp: 90},
			{Scenario: "S1", Contender: "bsm/redislock-linear", NsPerOp: 100, VsLockReg: vsLockReg},
		}
	}
	withS4 := append(s1(1.01), Result{Scenario: "S4", Contender: "lockreg", HandoffP50: 310, PingP50: 100})
	got := tally([][]target{targets(s1(1.02)), targets(s1(0.99)), targets(withS4)})
	for _, want := range []string{
		"- S1 lockreg within 1.25x of two PINGs: met in 3 of 3 runs\n",
		"- S1 no slower than bsm/redislock: met in 2 of 3 runs\n  - run 1: met (0.980x",
		"  - run 2: **missed** (1.010x",
		"- S4 hand-off p50 within 3 round trips: met in 0 of 1 runs (2 more could not check it: its scenario or a contender was left out, or failed)\n  - run 3: **missed** (3.1 PING round trips",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("tally lacks %q:\n%s", want, got)
		}
	}
}

// TestS1AcrossRunsPoolsEachPeersSessions: each peer's sessions are pooled
// over the runs that measured it (a failed session is left out), with a
// t interval over the runs; one run gives no interval.
func TestS1AcrossRunsPoolsEachPeersSessions(t *testing.T) {
	run := func(lockregOverBSM, lockregOverSpin float64, spinErr string) []Result {
		return []Result{
			{Scenario: "S1", Contender: "lockreg", NsPerOp: 100},
			{Scenario: "S1", Contender: "lockreg-spin", VsLockReg: 1 / lockregOverSpin, Err: spinErr},
			{Scenario: "S1", Contender: "bsm/redislock-linear", VsLockReg: 1 / lockregOverBSM},
			{Scenario: "S3", Contender: "bsm/redislock-linear", VsLockReg: 2},
		}
	}
	got := s1AcrossRuns([][]Result{run(0.98, 0.99, ""), run(1.00, 1.00, ""), run(1.02, 1.01, "dial: refused")})
	for _, want := range []string{
		"- vs lockreg-spin: 0.9950x over 2 runs, 95% interval 0.9334x-1.0606x (runs 0.990x-1.000x)\n",
		"- vs bsm/redislock-linear: 0.9999x over 3 runs, 95% interval 0.9514x-1.0508x (runs 0.980x-1.020x)\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("S1 across runs lacks %q:\n%s", want, got)
		}
	}
	if one := s1AcrossRuns([][]Result{run(0.98, 0.99, "")}); !strings.Contains(one, "- vs bsm/redislock-linear: 0.9800x over 1 runs (runs 0.980x-0.980x)\n") {
		t.Errorf("one run: want the ratio without an interval, got:\n%s", one)
	}
	if none := s1AcrossRuns([][]Result{{{Scenario: "S3", Contender: "lockreg"}}}); none != "" {
		t.Errorf("runs without S1: want nothing, got:\n%s", none)
	}
}

// TestTallyFilesPoolsSingleAndRepeatedRuns: -tally reads a single run's
// file and a -repeat file as the runs they hold, and refuses a smoke run's
// file and one that holds no runs, saying what to give instead.
func TestTallyFilesPoolsSingleAndRepeatedRuns(t *testing.T) {
	dir := t.TempDir()
	s1 := func(lockregOverBSM float64) []Result {
		return []Result{
			{Scenario: "S1", Contender: "lockreg", NsPerOp: 100, FloorNsPerOp: 90},
			{Scenario: "S1", Contender: "bsm/redislock-linear", NsPerOp: 100, VsLockReg: 1 / lockregOverBSM},
		}
	}
	file := func(name string, v any) string {
		raw, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, raw, 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	single := file("single.json", map[string]any{"Results": s1(0.98)})
	repeated := file("repeat.json", map[string]any{"Runs": [][]Result{s1(1.00), s1(1.02)}})
	var out strings.Builder
	if err := tallyFiles(&out, []string{single, repeated}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"# Targets over 3 runs\n",
		"- S1 no slower than bsm/redislock: met in 2 of 3 runs\n",
		"- vs bsm/redislock-linear: 0.9999x over 3 runs, 95% interval 0.9514x-1.0508x",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("-tally output lacks %q:\n%s", want, out.String())
		}
	}
	for path, want := range map[string]string{
		file("quick.json", map[string]any{"Quick": true, "Results": s1(0.98)}): "smoke run",
		file("other.json", map[string]any{"About": "an A/B trial"}):            "holds no Results or Runs",
	} {
		if err := tallyFiles(io.Discard, []string{single, path}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("-tally with %s: got %v, want an error saying %q", filepath.Base(path), err, want)
		}
	}
	if err := tallyFiles(io.Discard, nil); err == nil {
		t.Error("-tally without files: want an error")
	}
}

// TestScenarioTimingSetsThePassOutsideSmokeRuns: a scenario's own timing
// pass (S3's 10s) replaces the run's default in a full run, and a smoke
// run keeps the default for all.
func TestScenarioTimingSetsThePassOutsideSmokeRuns(t *testing.T) {
	addr, admin := launchRedis(t)
	counter, err := faultproxy.Start(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer counter.Close()
	sc := scenario{id: "T", title: "4 goroutines, 1,000 keys", timing: 1200 * time.Millisecond, work: manyKeys(4, 1000)}
	keeper := contenders.Factory{Name: "keeper", New: func(string) (contenders.Contender, error) {
		return &keeper{kept: map[string][]byte{}}, nil
	}}
	for _, quick := range []bool{false, true} {
		env := &benchEnv{addr: addr, proxy: counter, admin: admin, d: 120 * time.Millisecond, quick: quick}
		res := env.measureAll(sc, []contenders.Factory{keeper})[0]
		if res.Err != "" {
			t.Fatal(res.Err)
		}
		timed := time.Duration(float64(res.Acquisitions) / res.AcqPerSec * float64(time.Second))
		want := sc.timing
		if quick {
			want = env.d
		}
		if timed < want || timed > want+want/2 {
			t.Errorf("quick %v: timed for %v, want %v", quick, timed, want)
		}
	}
}

func TestALaterRunOfTheSameDayKeepsTheEarlierResults(t *testing.T) {
	out := t.TempDir()
	day := time.Date(2026, 11, 23, 9, 0, 0, 0, time.UTC)
	for run := 1; run <= 3; run++ {
		if err := writeJSON(out, "-repeat", map[string]int{"Run": run}, day, false); err != nil {
			t.Fatal(err)
		}
	}
	for name, run := range map[string]int{"2026-11-23-repeat.json": 1, "2026-11-23-repeat-2.json": 2, "2026-11-23-repeat-3.json": 3} {
		raw, err := os.ReadFile(filepath.Join(out, "results", name))
		if err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("{\n  \"Run\": %d\n}", run); string(raw) != want {
			t.Errorf("%s holds %s, want run %d's results", name, raw, run)
		}
	}
}

// TestChartsDrawHowS7TookTurns: a run with S7 results draws the turns
// chart; one without S7 draws none, and the other charts all the same.
func TestChartsDrawHowS7TookTurns(t *testing.T) {
	results := []Result{
		{Scenario: "S3", Contender: "lockreg", AcqPerSec: 90000, RoundTrips: 0.12, ServerCmds: 0.3},
		{Scenario: "S7", Contender: "lockreg", AcqPerSec: 20, FewestHolds: 50, MostHolds: 51},
		{Scenario: "S7", Contender: "redsync", AcqPerSec: 20, FewestHolds: 1, MostHolds: 198},
	}
	with, without := t.TempDir(), t.TempDir()
	if err := charts(with, results); err != nil {
		t.Fatal(err)
	}
	if err := charts(without, results[:1]); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(with, "s7-turns.png")); err != nil {
		t.Errorf("no turns chart with S7 results: %v", err)
	}
	if _, err := os.Stat(filepath.Join(without, "s7-turns.png")); err == nil {
		t.Error("a turns chart without S7 results")
	}
	if _, err := os.Stat(filepath.Join(without, "roundtrips.png")); err != nil {
		t.Errorf("no round-trip chart: %v", err)
	}
}
