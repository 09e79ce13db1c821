// S4, S7: worker processes. processes starts them (this binary again, with
// workerEnv set) and gathers what they measured; runWorker is what each
// one runs.

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockreg/lockreg/bench/contenders"
)

// workerEnv makes this binary a worker process of S4 or S7.
const workerEnv = "LOCKREG_BENCH_WORKER"

// workerSpec is what a worker process runs: its part of a scenario's
// workerShape, on key.
type workerSpec struct {
	Contender, Addr, BooksAddr, Key string
	Proc, Processes, Goroutines     int
	Start                           time.Time
	Duration, Hold                  time.Duration
	// Split probes the contender (lockreg or the hand-off floor) for the
	// hand-off split (split.go): each hold records when its release call
	// was sent and answered, and when the process last heard a grant (the
	// floor: its baton).
	Split bool `json:",omitempty"`
}

type workerResult struct {
	Acquisitions int64
	Waits        []time.Duration
	Holds        []turn
}

// processes runs sc's worker processes for d with the contender f,
// connected to addr, and gathers what they measured.
func (e *benchEnv) processes(ctx context.Context, sc scenario, f contenders.Factory, addr string, d time.Duration) (load, error) {
	return e.workerProcesses(ctx, sc, f.Name, addr, d, false)
}

// workerProcesses is processes for the contender named contender,
// probed for the hand-off split if split.
func (e *benchEnv) workerProcesses(ctx context.Context, sc scenario, contender, addr string, d time.Duration, split bool) (load, error) {
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
		spec, _ := json.Marshal(workerSpec{Contender: contender, Addr: addr, BooksAddr: e.addr, Key: strings.ToLower(sc.id), Proc: p,
			Processes: shape.processes, Goroutines: shape.goroutines, Start: start, Duration: d, Hold: shape.hold, Split: split})
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
	var probe *contenders.Probe
	switch {
	case spec.Split && spec.Contender == contenders.HandoffFloorName:
		probe = contenders.NewProbe(contenders.FloorBaton)
		c, err = contenders.NewHandoffFloor(spec.Addr, spec.Key, spec.Proc, spec.Processes, probe.Hook())
	case spec.Split && spec.Contender == contenders.LockReg.Name:
		probe = contenders.NewProbe(contenders.LockRegGrant)
		c, err = contenders.NewProbedLockReg(spec.Addr, probe)
	case spec.Split:
		fmt.Fprintln(os.Stderr, "worker: no hand-off split for", spec.Contender)
		return 2
	case spec.Contender == contenders.HandoffFloorName:
		c, err = contenders.NewHandoffFloor(spec.Addr, spec.Key, spec.Proc, spec.Processes)
	default:
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
			ctx := ctx
			var times *contenders.CallTimes
			if probe != nil {
				times = new(contenders.CallTimes)
				ctx = contenders.WithCallTimes(ctx, times)
			}
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
				if probe != nil {
					h.Heard, h.Path = probe.Heard(), times.TakePath()
				}
				waits = append(waits, time.Since(t))
				h.Seq, err = books.Incr(ctx, "bench:"+spec.Key+":seq").Result()
				time.Sleep(spec.Hold)
				if times != nil {
					times.Arm()
				}
				h.Released = time.Now().UnixNano()
				if err == nil {
					err = release(ctx)
				}
				h.Returned = time.Now().UnixNano()
				if times != nil {
					h.Sent, h.Replied = times.Disarm()
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
