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
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"runtime/metrics"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockreg/lockreg/bench/contenders"
	"github.com/lockreg/lockreg/internal/faultproxy"
	"github.com/lockreg/lockreg/internal/redisstat"
	"github.com/lockreg/lockreg/internal/redistest"
)

// workerEnv makes this binary a worker process of S4 or S7.
const workerEnv = "LOCKREG_BENCH_WORKER"

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
}

func main() {
	if spec := os.Getenv(workerEnv); spec != "" {
		os.Exit(runWorker(spec))
	}
	quick := flag.Bool("quick", os.Getenv("BENCH_QUICK") != "", "smoke run: a fraction of a second per pass (also BENCH_QUICK=1)")
	out := flag.String("out", ".", "where results/, RESULTS.md and charts/ go")
	only := flag.String("contenders", "", "comma-separated contender names (default: all)")
	onlyScenarios := flag.String("scenarios", "", "comma-separated scenario ids, e.g. S1,S6 (default: all)")
	repeat := flag.Int("repeat", 1, "runs, one after another, each on a fresh redis-server; more than 1 tallies how often each target was met and writes only results/<date>-repeat.json")
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
		results = append(results, env.measureAll(sc, factories)...)
	}
	version, _ := admin.Info(context.Background(), "server").Result()
	return results, redisVersion(version), nil
}

type benchEnv struct {
	addr  string
	proxy *faultproxy.Proxy
	admin *redis.Client
	d     time.Duration // a contender's timing pass, unless its scenario sets one
	quick bool          // a smoke run: every timing pass is d
}

// rounds is how many turns the in-process scenarios give each contender:
// a slice of the timing pass each, contender after contender, so that a
// burst of noise on this shared machine falls on all of them alike.
const rounds = 6

// contenderRun is one contender's measurement in one scenario.
type contenderRun struct {
	f          contenders.Factory
	res        Result
	c          contenders.Contender // in-process scenarios: the timed one
	timed      load
	serverCmds int64
}

// measureAll measures every contender in sc: the timing passes in turns
// (S4's and S7's worker processes, one contender after the other), then a counting
// pass each.
func (e *benchEnv) measureAll(sc scenario, fs []contenders.Factory) []Result {
	ctx := context.Background()
	var runs []*contenderRun
	for _, f := range fs {
		runs = append(runs, e.prepare(ctx, sc, f))
	}
	if sc.cycleByCycle {
		e.sessions(ctx, runs)
	} else {
		timing := e.d
		if sc.timing > 0 && !e.quick {
			timing = sc.timing
		}
		turns, slice := rounds, timing/rounds
		if sc.workers != nil {
			turns, slice = 1, timing
		}
		for range turns {
			for _, run := range runs {
				if run.ok() {
					if err := e.timeSlice(ctx, sc, run, slice); err != nil {
						run.res.Err = err.Error()
					}
				}
			}
		}
		if sc.workers != nil && sc.workers.handoffFloor {
			e.handoffFloor(ctx, sc, runs, slice)
		}
	}
	for _, run := range runs {
		if run.c != nil {
			_ = run.c.Close() // before any weighing pass
		}
	}
	var results []Result
	for _, run := range runs {
		if run.ok() {
			e.finish(ctx, sc, run)
		}
		fmt.Fprintln(os.Stderr, run.res.line())
		results = append(results, run.res)
	}
	return results
}

func (run *contenderRun) ok() bool { return run.res.NA == "" && run.res.Err == "" }

// sessions runs S1 as one session per peer: lockreg, the peer and two
// PINGs on another connection (the floor) take turns cycle by cycle, in
// an order shuffled every cycle (see turnOrder), for
// 2x the timing pass each. A cycle lasts a few hundred µs, shorter than the
// bursts of noise on this machine, so all three meet the same conditions;
// and only those two clients are alive, as another library's client in
// the process (rueidis's goroutines) was seen to slow every other
// contender's cycles by about 15%, but not PINGs. Each peer is compared
// with lockreg in its own session (VsLockReg); lockreg's own figures sum
// its sessions.
func (e *benchEnv) sessions(ctx context.Context, runs []*contenderRun) {
	i := slices.IndexFunc(runs, func(run *contenderRun) bool { return run.f.Name == contenders.LockReg.Name })
	var base *contenderRun
	if i >= 0 && runs[i].ok() {
		base = runs[i]
	}
	var peers []*contenderRun
	for _, run := range runs {
		if run.ok() && run != base {
			peers = append(peers, run)
		}
	}
	if len(peers) == 0 {
		peers = []*contenderRun{nil} // lockreg beside the floor alone
	}
	var floor, baseTotal time.Duration
	var floorPairs, baseCycles int64
	for _, peer := range peers {
		session := []*contenderRun{base, peer}
		clients := make([]contenders.Contender, len(session))
		for k, run := range session {
			if run == nil {
				continue
			}
			c, err := run.f.New(e.addr)
			if err == nil {
				defer c.Close()
				_, err = cycleOneKey(ctx, c, pass{d: 20 * time.Millisecond})
			}
			if err != nil {
				run.res.Err = err.Error()
				return
			}
			clients[k] = c
		}
		times := make([]time.Duration, len(session))
		var blocks [][2]time.Duration // lockreg's and the peer's time per block of cycles
		var cycles int64
		var sessionFloor time.Duration
		turns := newTurnOrder(len(session) + 1)
		for end := time.Now().Add(2 * e.d); time.Now().Before(end); cycles++ {
			if cycles%blockCycles == 0 {
				blocks = append(blocks, [2]time.Duration{})
			}
			for _, k := range turns.next() {
				start := time.Now()
				if k == len(session) {
					e.admin.Ping(ctx)
					e.admin.Ping(ctx)
					sessionFloor += time.Since(start)
					continue
				}
				if clients[k] == nil {
					continue
				}
				release, err := clients[k].Acquire(ctx, "s1")
				if err == nil {
					err = release(ctx)
				}
				if err != nil {
					session[k].res.Err = err.Error()
					return
				}
				took := time.Since(start)
				times[k] += took
				blocks[len(blocks)-1][k] += took
			}
		}
		floor, floorPairs = floor+sessionFloor, floorPairs+cycles
		if base != nil {
			baseTotal, baseCycles = baseTotal+times[0], baseCycles+cycles
		}
		if peer != nil {
			peer.timed = load{acquisitions: cycles, ops: cycles, elapsed: times[1]}
			peer.res.FloorNsPerOp = float64(sessionFloor.Nanoseconds()) / float64(cycles)
			if base != nil {
				peer.res.VsLockReg = float64(times[1]) / float64(times[0])
				peer.res.VsLockRegLo, peer.res.VsLockRegHi = ratioInterval(blocks)
			}
		}
	}
	if base != nil {
		base.timed = load{acquisitions: baseCycles, ops: baseCycles, elapsed: baseTotal}
		base.res.FloorNsPerOp = float64(floor.Nanoseconds()) / float64(floorPairs)
	}
}

// turnOrder is the order in which an S1 session's clients take their
// turns, cycle after cycle (the last client is the floor's PINGs): shuffled
// every cycle, with a fixed seed, so that every client follows every other
// equally often. What ran just before moves a cycle's time: with a fixed
// rotation, where lockreg followed the PINGs in two cycles of three and
// the peer followed lockreg, a session of two identical lockregs measured
// the second faster in 9 runs of 9 (0.992x-0.9998x), and 0.998x-1.005x
// with the order shuffled (docs/BENCHMARKS.md).
type turnOrder struct {
	rng   *rand.Rand
	order []int
}

func newTurnOrder(clients int) *turnOrder {
	t := &turnOrder{rng: rand.New(rand.NewPCG(3, 4)), order: make([]int, clients)}
	for i := range t.order {
		t.order[i] = i
	}
	return t
}

// next returns the next cycle's order.
func (t *turnOrder) next() []int {
	t.rng.Shuffle(len(t.order), func(i, j int) { t.order[i], t.order[j] = t.order[j], t.order[i] })
	return t.order
}

// blockCycles is how many cycles of an S1 session make one block of
// ratioInterval's resampling.
const blockCycles = 250

// ratioInterval is a 95% bootstrap interval of the peer's time over
// lockreg's in one S1 session: blocks of cycles, each lockreg's and the
// peer's time, are resampled with replacement (a fixed seed, so that one
// run's figures can be recomputed). It says how far the ratio would move
// with the noise inside the session; the machine's state between
// sessions is not in it. It returns zeros with too few blocks.
func ratioInterval(blocks [][2]time.Duration) (lo, hi float64) {
	const resamples = 2000
	if len(blocks) < 10 {
		return 0, 0
	}
	rng := rand.New(rand.NewPCG(1, 2))
	ratios := make([]float64, resamples)
	for i := range ratios {
		var base, peer time.Duration
		for range blocks {
			b := blocks[rng.IntN(len(blocks))]
			base, peer = base+b[0], peer+b[1]
		}
		ratios[i] = float64(peer) / float64(base)
	}
	slices.Sort(ratios)
	return ratios[resamples*25/1000], ratios[resamples*975/1000-1]
}

// prepare checks that the contender can run sc and, in process, opens and
// warms up the contender the timing pass uses (scripts loaded,
// connections open).
func (e *benchEnv) prepare(ctx context.Context, sc scenario, f contenders.Factory) *contenderRun {
	run := &contenderRun{f: f, res: Result{Scenario: sc.id, Contender: f.Name}}
	c, err := f.New(e.addr)
	if err != nil {
		run.res.Err = err.Error()
		return run
	}
	if sc.reentrant && !c.Reentrant() {
		run.res.NA = "not reentrant"
	}
	if run.res.NA != "" || sc.workers != nil || sc.cycleByCycle {
		_ = c.Close()
		return run
	}
	run.c = c
	if _, err := cycleOneKey(ctx, c, pass{d: 20 * time.Millisecond}); err != nil {
		run.res.Err = err.Error()
	}
	return run
}

// timeSlice runs sc for d on the contender, straight to Redis, and adds
// what it measured, server commands included, to the run.
func (e *benchEnv) timeSlice(ctx context.Context, sc scenario, run *contenderRun, d time.Duration) error {
	before, err := redisstat.CommandStats(ctx, e.admin)
	if err != nil {
		return err
	}
	var l load
	if sc.workers != nil {
		// Each worker's connection set-up is measured too: spread over its
		// run, as it would be in a service.
		l, err = e.processes(ctx, sc, run.f, e.addr, d)
	} else {
		l, err = sc.work(ctx, run.c, pass{d: d, recordWaits: true})
	}
	if err != nil {
		return err
	}
	after, err := redisstat.CommandStats(ctx, e.admin)
	if err != nil {
		return err
	}
	run.serverCmds += serverCommands(before, after)
	if sc.workers != nil {
		run.serverCmds -= l.acquisitions + l.pings // the workers' bookkeeping INCRs, the yardstick's PINGs
	}
	run.timed.add(l)
	return nil
}

// handoffFloor runs sc's workers (S4's) for d with the hand-off floor,
// one PUBLISH per hand-off between processes and no lock, and gives every
// contender's result its hand-off median and PING round trip.
func (e *benchEnv) handoffFloor(ctx context.Context, sc scenario, runs []*contenderRun, d time.Duration) {
	l, err := e.processes(ctx, sc, contenders.Factory{Name: contenders.HandoffFloorName}, e.addr, d)
	if err != nil {
		fmt.Fprintln(os.Stderr, "S4 hand-off floor:", err)
	}
	h := handoffs(l.holds).handoffs
	for _, run := range runs {
		if err != nil {
			run.res.FloorErr = err.Error()
			continue
		}
		run.res.FloorHandoffP50, run.res.FloorPingP50 = float64(quantile(h, 0.5)), float64(l.pingP50)
	}
}

// finish runs the counting pass, through the proxy, and fills in the
// result.
func (e *benchEnv) finish(ctx context.Context, sc scenario, run *contenderRun) {
	res, timed := &run.res, run.timed
	counted, err := e.countingPass(ctx, sc, run.f)
	if err != nil {
		res.Err = err.Error()
		return
	}
	sent := e.proxy.Commands() // the workers' bookkeeping goes straight to Redis

	res.Acquisitions = timed.acquisitions
	if timed.ops > 0 {
		res.NsPerOp = float64(timed.elapsed.Nanoseconds()) / float64(timed.ops)
		res.ServerCmds = float64(run.serverCmds) / float64(timed.ops)
	}
	if sc.cycleByCycle && counted.ops > 0 {
		res.ServerCmds = float64(counted.serverCmds) / float64(counted.ops)
	}
	res.AcqPerSec = float64(timed.acquisitions) / timed.elapsed.Seconds()
	if counted.ops > 0 {
		res.RoundTrips = float64(sent) / float64(counted.ops)
	}
	slices.Sort(timed.waits)
	if len(timed.waits) > 0 {
		res.WaitP50 = float64(quantile(timed.waits, 0.5))
		res.WaitP99 = float64(quantile(timed.waits, 0.99))
		res.MaxWait = float64(timed.waits[len(timed.waits)-1])
	}
	if sc.workers != nil {
		p := handoffs(timed.holds)
		h := p.handoffs
		res.HandoffP50, res.HandoffP99 = float64(quantile(h, 0.5)), float64(quantile(h, 0.99))
		res.PingP50 = float64(timed.pingP50)
		res.ReleaseP50, res.AfterReleaseP50 = float64(quantile(p.releases, 0.5)), float64(quantile(p.afterReturn, 0.5))
		if len(h) > 0 {
			before, _ := slices.BinarySearch(p.afterReturn, 0)
			res.BeforeRelease = float64(before) / float64(len(h))
		}
		for _, x := range h {
			res.Handoffs = append(res.Handoffs, float64(x))
		}
		if sc.workers.goroutines == 1 && len(timed.holds) > 0 {
			t := takingTurns(timed.holds, sc.workers.processes)
			res.OvertakenP99, res.OvertakenMax = quantile(t.overtaken, 0.99), t.overtaken[len(t.overtaken)-1]
			res.FewestHolds, res.MostHolds = t.fewest, t.most
		}
	}
	if timed.mallocs > 0 && timed.acquisitions > 0 {
		res.AllocsPerOp = float64(timed.mallocs) / float64(timed.acquisitions)
	}
	if sc.workers != nil {
		return
	}
	weighed, err := e.weighingPass(ctx, sc, run.f)
	if err != nil {
		res.Err = err.Error()
		return
	}
	res.HeapPeak, res.HeapKept = weighed.heapPeak, weighed.heapKept
}

// countingPass runs sc again with the contender connected through the
// counting proxy, which then holds the commands it sent, and returns what
// ran. Counts are per operation, so a shorter pass does for in-process
// scenarios.
func (e *benchEnv) countingPass(ctx context.Context, sc scenario, f contenders.Factory) (load, error) {
	if sc.workers != nil {
		e.proxy.ResetCommands()
		return e.processes(ctx, sc, f, e.proxy.Addr(), e.d)
	}
	c, err := f.New(e.proxy.Addr())
	if err != nil {
		return load{}, err
	}
	defer c.Close()
	if _, err := cycleOneKey(ctx, c, pass{d: 20 * time.Millisecond}); err != nil {
		return load{}, err
	}
	e.proxy.ResetCommands()
	var before map[string]int64
	if sc.cycleByCycle {
		// The timing pass interleaved the contenders, so the server's
		// work per contender is read here (S1 is uncontended: the proxy
		// changes no command).
		if before, err = redisstat.CommandStats(ctx, e.admin); err != nil {
			return load{}, err
		}
	}
	l, err := sc.work(ctx, c, pass{d: e.d / 3})
	if err != nil || !sc.cycleByCycle {
		return l, err
	}
	after, err := redisstat.CommandStats(ctx, e.admin)
	l.serverCmds = serverCommands(before, after)
	return l, err
}

// heapSample is how often the weighing pass weighs the heap under load,
// and heapSettle how long it lets in-flight acquisitions finish first.
const heapSample, heapSettle = 50 * time.Millisecond, 10 * time.Millisecond

// weighingPass runs an in-process sc once more, the contender connected
// straight to Redis (the proxy's buffers, 32 KiB per connection, would
// count as the contender's) and no other contender open (measureAll
// closed them), recording nothing, and weighs the live heap over the live
// heap before the contender was made.
//
// heapPeak is the largest of the weighings under load, every heapSample:
// each goroutine that takes its key parks while it holds it, and once the
// acquisitions in flight have had heapSettle to finish, a full collection
// weighs the heap with every hold and every waiter in place (connections,
// pooled buffers, per-key state). The pause keeps the weighing exact: a
// collection counts what is allocated while it marks as alive, and S5
// allocates megabytes a second. heapKept is the weighing once the
// workload is over, the contender still open: what stays, such as state
// for keys no goroutine uses any more (S5 touches 10,000).
func (e *benchEnv) weighingPass(ctx context.Context, sc scenario, f contenders.Factory) (load, error) {
	before := liveHeap(2)
	c, err := f.New(e.addr)
	if err != nil {
		return load{}, err
	}
	defer c.Close()
	var (
		gate sync.RWMutex // held by the weighing: holders park on it
		peak uint64
	)
	sampling, stopSampling := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(heapSample)
		defer tick.Stop()
		for {
			select {
			case <-sampling.Done():
				return
			case <-tick.C:
				gate.Lock()
				time.Sleep(heapSettle)
				peak = max(peak, liveHeap(1))
				gate.Unlock()
			}
		}
	}()
	l, err := sc.work(ctx, c, pass{d: e.d / 3, holding: func() { gate.RLock(); gate.RUnlock() }})
	stopSampling()
	<-sampled
	if err != nil {
		return l, err
	}
	kept := liveHeap(2)
	l.heapPeak, l.heapKept = sub0(max(peak, kept), before), sub0(kept, before)
	return l, nil
}

// sub0 is a-b, or 0 if b is larger.
func sub0(a, b uint64) uint64 {
	if a < b {
		return 0
	}
	return a - b
}

// liveHeap runs full collections and returns the bytes of heap objects
// the last one found alive. The weighing pass weighs the heap under load
// after one; at rest it weighs after two, as the first only moves what
// sync.Pools hold (go-redis and bufio pool their buffers) to their victim
// caches and the second frees it, so that a baseline holds no pooled
// garbage that a later reading would count as a fall.
func liveHeap(collections int) uint64 {
	for range collections {
		runtime.GC()
	}
	live := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(live)
	return live[0].Value.Uint64()
}

// serverCommands is how many commands the server ran between two INFO
// commandstats readings, INFO itself left out.
func serverCommands(before, after map[string]int64) int64 {
	var n int64
	for name, delta := range redisstat.Delta(before, after) {
		if name != "info" {
			n += delta
		}
	}
	return n
}

// pingFloor is the physical floor of a lock/unlock cycle: two PING round
// trips on one go-redis connection. It pings in pairs for d and returns
// the time taken and the pairs sent.
func (e *benchEnv) pingFloor(ctx context.Context, d time.Duration) (time.Duration, int) {
	start, n := time.Now(), 0
	for time.Since(start) < d {
		e.admin.Ping(ctx)
		e.admin.Ping(ctx)
		n++
	}
	return time.Since(start), n
}

// S4, S7: worker processes.

// workerSpec is what a worker process runs: its part of a scenario's
// workerShape, on key.
type workerSpec struct {
	Contender, Addr, BooksAddr, Key string
	Proc, Processes, Goroutines     int
	Start                           time.Time
	Duration, Hold                  time.Duration
}

type workerResult struct {
	Acquisitions int64
	Waits        []time.Duration
	Holds        []turn
}

// processes runs sc's worker processes for d with the contender f,
// connected to addr, and gathers what they measured.
func (e *benchEnv) processes(ctx context.Context, sc scenario, f contenders.Factory, addr string, d time.Duration) (load, error) {
	shape := sc.workers
	self, err := os.Executable()
	if err != nil {
		return load{}, err
	}
	start := time.Now().Add(500 * time.Millisecond)
	results := make([]workerResult, shape.processes)
	errs := make([]error, shape.processes)
	var wg sync.WaitGroup
	// The hand-off yardstick: PING round trips under the same load.
	var pings []time.Duration
	pingCtx, stopPinging := context.WithCancel(ctx)
	pinged := make(chan struct{})
	go func() {
		defer close(pinged)
		time.Sleep(time.Until(start))
		for pingCtx.Err() == nil {
			t := time.Now()
			if e.admin.Ping(pingCtx).Err() == nil {
				pings = append(pings, time.Since(t))
			}
			time.Sleep(time.Millisecond)
		}
	}()
	for p := range shape.processes {
		spec, _ := json.Marshal(workerSpec{Contender: f.Name, Addr: addr, BooksAddr: e.addr, Key: strings.ToLower(sc.id), Proc: p,
			Processes: shape.processes, Goroutines: shape.goroutines, Start: start, Duration: d, Hold: shape.hold})
		wg.Go(func() {
			cmd := exec.CommandContext(ctx, self)
			cmd.Env = append(os.Environ(), workerEnv+"="+string(spec))
			cmd.Stderr = os.Stderr
			out, err := cmd.Output()
			if err == nil {
				err = json.Unmarshal(out, &results[p])
			}
			errs[p] = err
		})
	}
	wg.Wait()
	stopPinging()
	<-pinged
	var l load
	l.elapsed = d
	slices.Sort(pings)
	l.pingP50, l.pings = quantile(pings, 0.5), int64(len(pings))
	for p, r := range results {
		if errs[p] != nil {
			return l, fmt.Errorf("worker %d: %w", p, errs[p])
		}
		l.acquisitions += r.Acquisitions
		l.waits = append(l.waits, r.Waits...)
		l.holds = append(l.holds, r.Holds...)
	}
	l.ops = l.acquisitions
	return l, nil
}

func runWorker(raw string) int {
	var spec workerSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 2
	}
	var c contenders.Contender
	var err error
	if spec.Contender == contenders.HandoffFloorName {
		c, err = contenders.NewHandoffFloor(spec.Addr, spec.Key, spec.Proc, spec.Processes)
	} else {
		i := slices.IndexFunc(contenders.All, func(f contenders.Factory) bool { return f.Name == spec.Contender })
		if i < 0 {
			fmt.Fprintln(os.Stderr, "worker: unknown contender", spec.Contender)
			return 2
		}
		c, err = contenders.All[i].New(spec.Addr)
	}
	ctx := context.Background()
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	defer c.Close()
	books := redis.NewClient(&redis.Options{Addr: spec.BooksAddr})
	defer books.Close()
	time.Sleep(time.Until(spec.Start))
	end := spec.Start.Add(spec.Duration)
	// A goroutine still waiting at the end may wait 10s more for
	// its turn; one starved beyond that fails the run, which says so.
	ctx, cancel := context.WithDeadline(ctx, end.Add(10*time.Second))
	defer cancel()

	var (
		mu  sync.Mutex
		res workerResult
		wg  sync.WaitGroup
		bad error
	)
	for range spec.Goroutines {
		wg.Go(func() {
			var waits []time.Duration
			var holds []turn
			for time.Now().Before(end) {
				t := time.Now()
				release, err := c.Acquire(ctx, spec.Key)
				if err != nil {
					mu.Lock()
					bad = cmp(bad, err)
					mu.Unlock()
					return
				}
				h := turn{Asked: t.UnixNano(), Acquired: time.Now().UnixNano(), Proc: spec.Proc}
				waits = append(waits, time.Since(t))
				h.Seq, err = books.Incr(ctx, "bench:"+spec.Key+":seq").Result()
				time.Sleep(spec.Hold)
				h.Released = time.Now().UnixNano()
				if err == nil {
					err = release(ctx)
				}
				h.Returned = time.Now().UnixNano()
				if err != nil {
					mu.Lock()
					bad = cmp(bad, err)
					mu.Unlock()
					return
				}
				holds = append(holds, h)
			}
			mu.Lock()
			res.Acquisitions += int64(len(holds))
			res.Waits = append(res.Waits, waits...)
			res.Holds = append(res.Holds, holds...)
			mu.Unlock()
		})
	}
	wg.Wait()
	if bad != nil {
		fmt.Fprintln(os.Stderr, "worker:", bad)
		return 1
	}
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		return 1
	}
	return 0
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
	}
	return fmt.Sprintf("%s %-22s %10.0f ns/op %9.0f acq/s %6.2f rt/acq %6.2f srv/acq", r.Scenario, r.Contender, r.NsPerOp, r.AcqPerSec, r.RoundTrips, r.ServerCmds)
}
