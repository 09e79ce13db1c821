// The measuring passes of one scenario: measureAll runs every contender's
// timing passes in turns (prepare, timeSlice; S4's hand-off floor), then
// finish runs each one's counting pass and, in process, its weighing pass,
// and fills in its Result.

package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/metrics"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockreg/lockreg/bench/contenders"
	"github.com/lockreg/lockreg/internal/faultproxy"
	"github.com/lockreg/lockreg/internal/redisstat"
)

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
	if sc.scale != nil {
		return e.scale(ctx, sc, fs)
	}
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
		if sc.workers != nil && sc.workers.split {
			e.splitPasses(ctx, sc, runs, slice)
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
