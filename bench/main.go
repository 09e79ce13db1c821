// Command bench measures lockreg beside the Go lock libraries users pick
// today and a Go port of Redisson's RLock algorithm, all in one run against
// one real redis-server that it starts on a free loopback port.
//
// Every scenario runs twice per contender: a timing pass straight to Redis,
// read with INFO commandstats for the server's work (commands inside
// scripts count), and a counting pass through a TCP proxy that counts the
// commands the contender puts on the wire, so the proxy never distorts
// timings. Results go to results/<date>.json, RESULTS.md and charts/.
//
//	go run .          # full run, a few seconds per scenario and contender
//	BENCH_QUICK=1 go run .   # smoke run
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockreg/lockreg/bench/contenders"
	"github.com/lockreg/lockreg/internal/faultproxy"
	"github.com/lockreg/lockreg/internal/redistest"
)

// Result is one scenario's figures for one contender. Durations are ns.
type Result struct {
	Scenario, Contender string
	NA                  string `json:",omitempty"` // why it could not run
	Err                 string `json:",omitempty"`
	Acquisitions        int64
	NsPerOp             float64
	FloorNsPerOp        float64 `json:",omitempty"` // S1: two PINGs, timed in turn with the cycles
	VsLockReg           float64 `json:",omitempty"` // S1: ns/op over lockreg's in the same session
	VsLockRegLo         float64 `json:",omitempty"` // S1: VsLockReg's 95% interval over the session's blocks of cycles
	VsLockRegHi         float64 `json:",omitempty"`
	AcqPerSec           float64
	WaitP50, WaitP99    float64   `json:",omitempty"`
	MaxWait             float64   `json:",omitempty"`
	HandoffP50          float64   `json:",omitempty"`
	HandoffP99          float64   `json:",omitempty"`
	PingP50             float64   `json:",omitempty"` // S4: a PING round trip under the same load
	FloorHandoffP50     float64   `json:",omitempty"` // S4: the hand-off floor's hand-off p50, in a pass of its own (see contenders.NewHandoffFloor)
	FloorPingP50        float64   `json:",omitempty"` // S4: a PING round trip during the floor's pass
	FloorErr            string    `json:",omitempty"` // S4: why the floor could not be measured
	ReleaseP50          float64   `json:",omitempty"` // S4: a release call that passed the key to another process
	AfterReleaseP50     float64   `json:",omitempty"` // S4: the next process's hold, after that call returned (may be negative)
	BeforeRelease       float64   `json:",omitempty"` // S4: the share of those holds taken before the call returned
	Handoffs            []float64 `json:"-"`          // S4, for the chart
	OvertakenP99        int       `json:",omitempty"` // S7: holds of other processes while one process asked for the key (see takingTurns)
	OvertakenMax        int       `json:",omitempty"`
	FewestHolds         int       `json:",omitempty"` // S7: the fewest holds one process got
	MostHolds           int       `json:",omitempty"` // S7: the most
	RoundTrips          float64   // commands sent per acquisition (per op in S2)
	ServerCmds          float64   // commands the server ran per acquisition (per op in S2)
	AllocsPerOp         float64   `json:",omitempty"`
	HeapPeak            uint64    `json:",omitempty"` // in process: peak live heap bytes the contender uses under the workload (see weighingPass)
	HeapKept            uint64    `json:",omitempty"` // in process: live heap bytes the contender keeps after the workload

	// S1 against the floor of a correct lock (contenders.LockFloor), timed
	// in turn in the same session: its ns per cycle, this contender's time
	// over it (lockreg's row: over all sessions) with a 95% interval within
	// the session, and, in a peer's row, lockreg's time over it in the
	// peer's session.
	LockFloorNsPerOp                                               float64 `json:",omitempty"`
	VsLockFloor, VsLockFloorLo, VsLockFloorHi                      float64 `json:",omitempty"`
	LockRegVsLockFloor, LockRegVsLockFloorLo, LockRegVsLockFloorHi float64 `json:",omitempty"`
	// Split is S4's hand-off split into its parts, in lockreg's row
	// (split.go).
	Split *HandoffSplit `json:",omitempty"`
	// Scale is S8's figures (scale.go).
	Scale *ScaleResult `json:",omitempty"`
}

func main() {
	if spec := os.Getenv(workerEnv); spec != "" {
		os.Exit(runWorker(spec))
	}
	if spec := os.Getenv(pingerEnv); spec != "" {
		os.Exit(runPinger(spec))
	}
	quick := flag.Bool("quick", os.Getenv("BENCH_QUICK") != "", "smoke run: a fraction of a second per pass (also BENCH_QUICK=1)")
	out := flag.String("out", ".", "where results/, RESULTS.md and charts/ go")
	only := flag.String("contenders", "", "comma-separated contender names (default: all)")
	onlyScenarios := flag.String("scenarios", "", "comma-separated scenario ids, e.g. S1,S6 (default: all)")
	repeat := flag.Int("repeat", 1, "runs, one after another, each on a fresh redis-server; more than 1 tallies how often each target was met and writes only results/<date>-repeat.json")
	flag.BoolVar(&realtime, "realtime", false, "S8: run its redis-server and its unrelated client at real-time priority (SCHED_FIFO, by chrt), so that the PINGs time Redis's own stalls rather than the scheduling of a machine whose cores the registry shares")
	tallyOnly := flag.Bool("tally", false, "measure nothing: tally the targets over the runs in the results files named as arguments, as -repeat does")
	flag.Parse()
	var err error
	if *tallyOnly {
		err = tallyFiles(os.Stdout, flag.Args())
	} else {
		err = run(*quick, *out, *only, *onlyScenarios, *repeat)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(quick bool, out, only, onlyScenarios string, repeat int) error {
	if repeat < 1 {
		return fmt.Errorf("-repeat %d: give 1 or more runs", repeat)
	}
	var runs [][]Result
	var version string
	for i := range repeat {
		if repeat > 1 {
			fmt.Fprintf(os.Stderr, "run %d of %d\n", i+1, repeat)
		}
		results, v, err := measure(quick, only, onlyScenarios)
		if err != nil {
			return err
		}
		runs, version = append(runs, results), v
	}
	if repeat == 1 {
		return report(out, quick, runs[0], version)
	}
	return reportRepeats(out, quick, runs, version)
}

// measure runs the scenarios once against a fresh redis-server and
// returns the results and the server's version.
func measure(quick bool, only, onlyScenarios string) ([]Result, string, error) {
	srv, err := redistest.Launch()
	if err != nil {
		return nil, "", err
	}
	defer srv.Shutdown()
	counter, err := faultproxy.Start(srv.Addr())
	if err != nil {
		return nil, "", err
	}
	defer counter.Close()
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer admin.Close()

	d := 3 * time.Second
	if quick {
		d = 300 * time.Millisecond
	}
	var factories []contenders.Factory
	for _, f := range contenders.All {
		if only == "" || slices.Contains(strings.Split(only, ","), f.Name) {
			factories = append(factories, f)
		}
	}
	env := &benchEnv{addr: srv.Addr(), proxy: counter, admin: admin, d: d, quick: quick}
	var results []Result
	for _, sc := range scenarios {
		if onlyScenarios != "" && !slices.Contains(strings.Split(onlyScenarios, ","), sc.id) {
			continue
		}
		if sc.scale != nil && quick && onlyScenarios == "" {
			continue // S8 takes a minute and a half: a smoke run has it only if named
		}
		results = append(results, env.measureAll(sc, factories)...)
	}
	version, _ := admin.Info(context.Background(), "server").Result()
	return results, redisVersion(version), nil
}

func redisVersion(info string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			return v
		}
	}
	return "unknown"
}

func (r Result) line() string {
	switch {
	case r.NA != "":
		return fmt.Sprintf("%s %-22s n/a (%s)", r.Scenario, r.Contender, r.NA)
	case r.Err != "":
		return fmt.Sprintf("%s %-22s error: %s", r.Scenario, r.Contender, r.Err)
	case r.Scale != nil:
		return r.Scale.line(r.Scenario, r.Contender)
	}
	return fmt.Sprintf("%s %-22s %10.0f ns/op %9.0f acq/s %6.2f rt/acq %6.2f srv/acq", r.Scenario, r.Contender, r.NsPerOp, r.AcqPerSec, r.RoundTrips, r.ServerCmds)
}
