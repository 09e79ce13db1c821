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
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockreg/lockreg/bench/contenders"
	"github.com/lockreg/lockreg/bench/proxy"
	"github.com/lockreg/lockreg/internal/redisstat"
	"github.com/lockreg/lockreg/internal/redistest"
)

// workerEnv makes this binary an S4 worker process.
const workerEnv = "LOCKREG_BENCH_WORKER"

// Result is one scenario's figures for one contender. Durations are ns.
type Result struct {
	Scenario, Contender string
	NA                  string `json:",omitempty"` // why it could not run
	Err                 string `json:",omitempty"`
	Acquisitions        int64
	NsPerOp             float64
	FloorNsPerOp        float64 `json:",omitempty"` // S1: two PINGs, measured just before
	AcqPerSec           float64
	WaitP50, WaitP99    float64   `json:",omitempty"`
	MaxWait             float64   `json:",omitempty"`
	HandoffP50          float64   `json:",omitempty"`
	HandoffP99          float64   `json:",omitempty"`
	PingP50             float64   `json:",omitempty"` // S4: a PING round trip under the same load
	Handoffs            []float64 `json:"-"`          // S4, for the chart
	RoundTrips          float64   // commands sent per acquisition (per op in S2)
	ServerCmds          float64   // commands the server ran per acquisition (per op in S2)
	AllocsPerOp         float64   `json:",omitempty"`
	HeapInUse           uint64    `json:",omitempty"`
}

func main() {
	if spec := os.Getenv(workerEnv); spec != "" {
		os.Exit(runWorker(spec))
	}
	quick := flag.Bool("quick", os.Getenv("BENCH_QUICK") != "", "smoke run: a fraction of a second per pass (also BENCH_QUICK=1)")
	out := flag.String("out", ".", "where results/, RESULTS.md and charts/ go")
	only := flag.String("contenders", "", "comma-separated contender names (default: all)")
	onlyScenarios := flag.String("scenarios", "", "comma-separated scenario ids, e.g. S1,S6 (default: all)")
	flag.Parse()
	if err := run(*quick, *out, *only, *onlyScenarios); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(quick bool, out, only, onlyScenarios string) error {
	srv, err := redistest.Launch()
	if err != nil {
		return err
	}
	defer srv.Shutdown()
	counter, err := proxy.Start(srv.Addr())
	if err != nil {
		return err
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
	env := &benchEnv{addr: srv.Addr(), proxy: counter, admin: admin, d: d}
	var results []Result
	for _, sc := range scenarios {
		if onlyScenarios != "" && !slices.Contains(strings.Split(onlyScenarios, ","), sc.id) {
			continue
		}
		for _, f := range factories {
			res := env.measure(sc, f)
			results = append(results, res)
			fmt.Fprintln(os.Stderr, res.line())
		}
	}
	version, _ := admin.Info(context.Background(), "server").Result()
	return report(out, quick, results, redisVersion(version))
}

type benchEnv struct {
	addr  string
	proxy *proxy.Proxy
	admin *redis.Client
	d     time.Duration
}

func (e *benchEnv) measure(sc scenario, f contenders.Factory) Result {
	res := Result{Scenario: sc.id, Contender: f.Name}
	ctx := context.Background()
	probe, err := f.New(e.addr)
	if err != nil {
		res.Err = err.Error()
		return res
	}
	reentrant := probe.Reentrant()
	_ = probe.Close()
	if sc.reentrant && !reentrant {
		res.NA = "not reentrant"
		return res
	}
	if sc.id == "S1" {
		res.FloorNsPerOp = e.pingFloor(ctx)
	}

	// Timing pass, straight to Redis.
	var before map[string]int64
	timed, err := e.pass(ctx, sc, f, e.addr, func() (err error) {
		before, err = redisstat.CommandStats(ctx, e.admin)
		return err
	})
	if err != nil {
		res.Err = err.Error()
		return res
	}
	after, err := redisstat.CommandStats(ctx, e.admin)
	if err != nil {
		res.Err = err.Error()
		return res
	}
	server := redisstat.Delta(before, after)
	delete(server, "info")
	if sc.multiProcess {
		server["incr"] -= timed.acquisitions // the workers' bookkeeping
	}
	var serverCmds int64
	for _, n := range server {
		serverCmds += n
	}

	// Counting pass, through the proxy.
	counted, err := e.pass(ctx, sc, f, e.proxy.Addr(), func() error { e.proxy.Reset(); return nil })
	if err != nil {
		res.Err = err.Error()
		return res
	}
	sent := e.proxy.Commands() // the S4 workers' bookkeeping goes straight to Redis

	res.Acquisitions = timed.acquisitions
	if timed.ops > 0 {
		res.NsPerOp = float64(timed.elapsed.Nanoseconds()) / float64(timed.ops)
		res.ServerCmds = float64(serverCmds) / float64(timed.ops)
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
	if sc.multiProcess {
		h := handoffs(timed.holds)
		res.HandoffP50, res.HandoffP99 = float64(quantile(h, 0.5)), float64(quantile(h, 0.99))
		res.PingP50 = float64(timed.pingP50)
		for _, x := range h {
			res.Handoffs = append(res.Handoffs, float64(x))
		}
	}
	if timed.mallocs > 0 && timed.acquisitions > 0 {
		res.AllocsPerOp = float64(timed.mallocs) / float64(timed.acquisitions)
		res.HeapInUse = timed.heapInUse
	}
	return res
}

// pass runs the scenario once with the contender connected to addr, and
// calls measureFrom when what follows is to be measured.
func (e *benchEnv) pass(ctx context.Context, sc scenario, f contenders.Factory, addr string, measureFrom func() error) (load, error) {
	if sc.multiProcess {
		// Each worker's connection set-up is measured too: spread over
		// its run, as it would be in a service.
		if err := measureFrom(); err != nil {
			return load{}, err
		}
		return e.processes(ctx, f, addr)
	}
	c, err := f.New(addr)
	if err != nil {
		return load{}, err
	}
	defer c.Close()
	// A short warm-up loads scripts and opens connections.
	if _, err := cycleOneKey(ctx, c, 20*time.Millisecond); err != nil {
		return load{}, err
	}
	if err := measureFrom(); err != nil {
		return load{}, err
	}
	return sc.work(ctx, c, e.d)
}

// pingFloor is the physical floor of a lock/unlock cycle: two PING round
// trips on one go-redis connection, ns per pair.
func (e *benchEnv) pingFloor(ctx context.Context) float64 {
	start, n := time.Now(), 0
	for time.Since(start) < e.d/2 {
		e.admin.Ping(ctx)
		e.admin.Ping(ctx)
		n++
	}
	return float64(time.Since(start).Nanoseconds()) / float64(n)
}

// S4: worker processes.

type workerSpec struct {
	Contender, Addr, BooksAddr string
	Proc, Goroutines           int
	Start                      time.Time
	Duration                   time.Duration
}

type workerResult struct {
	Acquisitions int64
	Waits        []time.Duration
	Holds        []turn
}

const s4Processes, s4Goroutines = 4, 16

func (e *benchEnv) processes(ctx context.Context, f contenders.Factory, addr string) (load, error) {
	self, err := os.Executable()
	if err != nil {
		return load{}, err
	}
	start := time.Now().Add(500 * time.Millisecond)
	results := make([]workerResult, s4Processes)
	errs := make([]error, s4Processes)
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
	for p := range s4Processes {
		spec, _ := json.Marshal(workerSpec{Contender: f.Name, Addr: addr, BooksAddr: e.addr, Proc: p,
			Goroutines: s4Goroutines, Start: start, Duration: e.d})
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
	l.elapsed = e.d
	slices.Sort(pings)
	l.pingP50 = quantile(pings, 0.5)
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
	i := slices.IndexFunc(contenders.All, func(f contenders.Factory) bool { return f.Name == spec.Contender })
	if i < 0 {
		fmt.Fprintln(os.Stderr, "worker: unknown contender", spec.Contender)
		return 2
	}
	ctx := context.Background()
	c, err := contenders.All[i].New(spec.Addr)
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
				release, err := c.Acquire(ctx, "s4")
				if err != nil {
					mu.Lock()
					bad = cmp(bad, err)
					mu.Unlock()
					return
				}
				h := turn{Acquired: time.Now().UnixNano(), Proc: spec.Proc}
				waits = append(waits, time.Since(t))
				h.Seq, err = books.Incr(ctx, "bench:s4:seq").Result()
				h.Released = time.Now().UnixNano()
				if err == nil {
					err = release(ctx)
				}
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
