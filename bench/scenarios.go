package main

import (
	"context"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockreg/lockreg/bench/contenders"
)

// load is what one workload run measured.
type load struct {
	acquisitions int64
	ops          int64 // what ns/op divides by (S2: outer cycles)
	elapsed      time.Duration
	waits        []time.Duration
	holds        []turn // S4, S7: holds numbered across processes
	mallocs      uint64
	heapPeak     uint64        // the weighing pass: live heap the contender uses under load
	heapKept     uint64        // the weighing pass: live heap the contender keeps after it
	pingP50      time.Duration // S4, S7: PING round trip under the same load
	pings        int64         // S4, S7: those PINGs, which the server's command counts must leave out
	serverCmds   int64         // S1's counting pass: commands the server ran
}

// add adds what another slice of the same run measured.
func (l *load) add(m load) {
	l.acquisitions += m.acquisitions
	l.ops += m.ops
	l.elapsed += m.elapsed
	l.waits = append(l.waits, m.waits...)
	l.holds = append(l.holds, m.holds...)
	l.mallocs += m.mallocs
	l.pingP50 = max(l.pingP50, m.pingP50)
	l.pings += m.pings
}

// turn is one hold in S4 or S7, numbered by INCR across all processes:
// when its goroutine asked for the key, when it had it, when it began to
// release it, and when that release call returned (unix ns). The hand-off
// split's passes (split.go) add when the release's call went out and its
// reply came (Sent, Replied; 0 if the release made no call), when the
// process last heard a grant before the hold (Heard), and how lockreg
// took the key (Path).
type turn struct {
	Seq, Asked, Acquired, Released, Returned int64
	Proc                                     int
	Sent, Replied, Heard                     int64  `json:",omitempty"`
	Path                                     string `json:",omitempty"`
}

// workload runs against one contender as p says.
type workload func(ctx context.Context, c contenders.Contender, p pass) (load, error)

// pass is how a workload runs: for d, recording each acquisition's wait if
// recordWaits (8 bytes each, which the passes that weigh the heap or count
// commands leave out), and calling holding, if set, each time a goroutine
// holds its key (the weighing pass parks them there).
type pass struct {
	d           time.Duration
	recordWaits bool
	holding     func()
}

func (p pass) held() {
	if p.holding != nil {
		p.holding()
	}
}

type scenario struct {
	id, title string
	// reentrant: only for contenders that can re-lock.
	reentrant bool
	// workers, if set, runs the scenario in worker processes (S4, S7).
	workers *workerShape
	// cycleByCycle: each contender runs alone, its cycles timed in turn
	// with two PINGs (S1), instead of in slices in turn with the others.
	cycleByCycle bool
	// timing is the timing pass of each contender in a full run, if not
	// the run's default (3s).
	timing time.Duration
	work   workload
	// scale, if set, is S8's shape: one registry holding many keys, on a
	// server of its own (scale.go). A smoke run leaves it out unless
	// -scenarios names it.
	scale *scaleShape
}

var scenarios = []scenario{
	{id: "S1", title: "uncontended lock/unlock, one goroutine, one key", cycleByCycle: true, work: cycleOneKey},
	{id: "S2", title: "reentrant depth 5 while held", reentrant: true, work: reentrant5},
	{id: "S3", title: "one process, 64 goroutines, one hot key", timing: 10 * time.Second, work: hotKey(64)}, // #5 fixes S3's 10s
	{id: "S4", title: "4 processes x 16 goroutines, one hot key", workers: &workerShape{processes: 4, goroutines: 16, handoffFloor: true, split: true}},
	{id: "S5", title: "one process, 64 goroutines, 10,000 keys", work: manyKeys(64, 10_000)},
	{id: "S6", title: "parallel lock/unlock on distinct keys", work: distinctKeys(64)},
	{id: "S7", title: "taking turns: 4 processes x 1 goroutine, one hot key held 50ms", timing: 10 * time.Second,
		workers: &workerShape{processes: 4, goroutines: 1, hold: 50 * time.Millisecond}},
	{id: "S8", title: "one registry holding 100,000 keys", scale: &scaleShape{
		keys: 100_000, leases: []time.Duration{3 * time.Second, 30 * time.Second}, rounds: 3, rest: 2 * time.Second, goroutines: 64}},
}

// workerShape is how a scenario runs in worker processes, started with
// os/exec: each runs goroutines that take one key in a loop, each hold
// lasting hold. S7's holds, half lockreg's retry interval, make every
// process wait longer than that interval, as in the grant order's defect
// before 23d8dc1, where the process that last retried earliest was served
// first, and some were passed over for seconds.
type workerShape struct {
	processes, goroutines int
	hold                  time.Duration
	// handoffFloor: measure the hand-off floor beside the contenders (S4).
	handoffFloor bool
	// split: split the hand-offs between processes into their parts,
	// lockreg's and the floor's, in probed passes of their own (S4; see
	// splitPasses).
	split bool
}

func cycleOneKey(ctx context.Context, c contenders.Contender, p pass) (load, error) {
	var l load
	start := time.Now()
	for time.Since(start) < p.d {
		release, err := c.Acquire(ctx, "s1")
		if err != nil {
			return l, err
		}
		p.held()
		if err := release(ctx); err != nil {
			return l, err
		}
		l.acquisitions++
	}
	l.ops, l.elapsed = l.acquisitions, time.Since(start)
	return l, nil
}

func reentrant5(ctx context.Context, c contenders.Contender, p pass) (load, error) {
	var l load
	outer, err := c.Acquire(ctx, "s2")
	if err != nil {
		return l, err
	}
	defer outer(ctx)
	start := time.Now()
	releases := make([]func(context.Context) error, 5)
	for time.Since(start) < p.d {
		for i := range releases {
			if releases[i], err = c.Acquire(ctx, "s2"); err != nil {
				return l, err
			}
		}
		p.held()
		for i := len(releases) - 1; i >= 0; i-- {
			if err := releases[i](ctx); err != nil {
				return l, err
			}
		}
		l.ops++
		l.acquisitions += 5
	}
	l.elapsed = time.Since(start)
	return l, nil
}

// parallel runs goroutines that each take key(g, i) in a loop.
func parallel(ctx context.Context, c contenders.Contender, p pass, goroutines int, key func(g, i int) string) (load, error) {
	var (
		l        load
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
		count    atomic.Int64
	)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	start := time.Now()
	for g := range goroutines {
		wg.Go(func() {
			var waits []time.Duration
			for i := 0; time.Since(start) < p.d; i++ {
				t := time.Now()
				release, err := c.Acquire(ctx, key(g, i))
				if err == nil {
					if p.recordWaits {
						waits = append(waits, time.Since(t))
					}
					p.held()
					err = release(ctx)
				}
				if err != nil {
					mu.Lock()
					firstErr = cmp(firstErr, err)
					mu.Unlock()
					return
				}
				count.Add(1)
			}
			mu.Lock()
			l.waits = append(l.waits, waits...)
			mu.Unlock()
		})
	}
	wg.Wait()
	l.elapsed = time.Since(start)
	runtime.ReadMemStats(&after)
	l.acquisitions = count.Load()
	l.ops = l.acquisitions
	l.mallocs = after.Mallocs - before.Mallocs
	return l, firstErr
}

func cmp(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

func hotKey(goroutines int) workload {
	return func(ctx context.Context, c contenders.Contender, p pass) (load, error) {
		return parallel(ctx, c, p, goroutines, func(int, int) string { return "s3" })
	}
}

func manyKeys(goroutines, keys int) workload {
	return func(ctx context.Context, c contenders.Contender, p pass) (load, error) {
		return parallel(ctx, c, p, goroutines, func(int, int) string { return "s5:" + strconv.Itoa(rand.IntN(keys)) })
	}
}

func distinctKeys(goroutines int) workload {
	return func(ctx context.Context, c contenders.Contender, p pass) (load, error) {
		names := make([]string, goroutines)
		for g := range names {
			names[g] = "s6:" + strconv.Itoa(g)
		}
		return parallel(ctx, c, p, goroutines, func(g, _ int) string { return names[g] })
	}
}

// quantile returns the q-quantile of sorted values.
func quantile[T any](sorted []T, q float64) T {
	if len(sorted) == 0 {
		var zero T
		return zero
	}
	return sorted[min(int(q*float64(len(sorted))), len(sorted)-1)]
}

// passes is what the hand-offs between processes took, each list sorted:
// from one process's release to the next hold, another process's
// (handoffs); the release calls that passed the key on, from that start
// to their return (releases); and when the next holder had the key,
// counted from that return (afterReturn; negative if before it).
type passes struct {
	handoffs, releases, afterReturn []time.Duration
}

// handoffs reads the hand-offs between processes off holds.
func handoffs(holds []turn) passes {
	slices.SortFunc(holds, func(a, b turn) int { return int(a.Seq - b.Seq) })
	var p passes
	for i := 1; i < len(holds); i++ {
		prev, next := holds[i-1], holds[i]
		if next.Proc != prev.Proc {
			p.handoffs = append(p.handoffs, time.Duration(next.Acquired-prev.Released))
			p.releases = append(p.releases, time.Duration(prev.Returned-prev.Released))
			p.afterReturn = append(p.afterReturn, time.Duration(next.Acquired-prev.Returned))
		}
	}
	slices.Sort(p.handoffs)
	slices.Sort(p.releases)
	slices.Sort(p.afterReturn)
	return p
}

// turns is how evenly processes took turns with the key: for each hold,
// how many holds of other processes began while its goroutine asked for
// it (overtaken, sorted; first come, first served gives at most one per
// other process), and the fewest and most holds one of processes got.
type turns struct {
	overtaken    []int
	fewest, most int
}

// takingTurns reads holds (S7: one goroutine per process) for turns.
func takingTurns(holds []turn, processes int) turns {
	slices.SortFunc(holds, func(a, b turn) int { return int(a.Seq - b.Seq) })
	perProc := make([]int, processes)
	var t turns
	for i, h := range holds {
		perProc[h.Proc]++
		n := 0
		for j := i - 1; j >= 0 && holds[j].Acquired > h.Asked; j-- {
			if holds[j].Proc != h.Proc {
				n++
			}
		}
		t.overtaken = append(t.overtaken, n)
	}
	slices.Sort(t.overtaken)
	t.fewest, t.most = slices.Min(perProc), slices.Max(perProc)
	return t
}
