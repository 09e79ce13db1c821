// S8 (#34, item 5): one registry holding many keys, on a redis-server of
// its own: how fast it takes them, what each held lock costs in Redis and
// in the Go heap, what the renewal costs the server while they are held,
// what an unrelated client's PINGs see meanwhile, and how long releasing
// them all takes. bsm/redislock, which holds without renewal, is shown
// for its memory.

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bsm/redislock"
	"github.com/redis/go-redis/v9"

	"github.com/lockreg/lockreg"
	"github.com/lockreg/lockreg/bench/contenders"
	"github.com/lockreg/lockreg/internal/redistest"
)

// realtime (-realtime) has S8 run its redis-server and its unrelated
// client at real-time priority: on a machine of two cores, the registry's
// own process, its renewals' client side, competes with Redis and the
// PINGs for them, and the PINGs' worst cases then time the scheduler more
// than Redis. With both ahead of every ordinary process, what the PINGs
// still wait for is Redis's own work.
var realtime bool

// fifo is the chrt priority -realtime gives the redis-server; the
// unrelated client gets one more, so that it runs as soon as its reply
// is in.
const fifo = 20

// scaleShape is how S8 runs.
type scaleShape struct {
	keys   int
	leases []time.Duration // lockreg's, one row each
	// rounds is how many renewal intervals (lease/3) the holding window
	// spans; rest, the PINGs' window at rest, before any key is taken.
	rounds int
	rest   time.Duration
	// goroutines take, and release, the keys in parallel.
	goroutines int
}

// smoke is the shape of a smoke run that names S8 (BENCH_QUICK=1 -scenarios S8).
func (s scaleShape) smoke() scaleShape {
	return scaleShape{keys: 2_000, leases: []time.Duration{3 * time.Second}, rounds: 1, rest: 300 * time.Millisecond, goroutines: s.goroutines}
}

// scaleBSMTTL is bsm/redislock's lease in S8: lockreg's default, as in the
// other scenarios; it holds no longer than the few seconds S8 needs.
const scaleBSMTTL = 30 * time.Second

// ScaleResult is one S8 row. Durations are ns; per-lock figures divide by
// Keys.
type ScaleResult struct {
	Keys  int
	Lease float64 `json:",omitempty"` // 0: no renewal (bsm/redislock)
	// MemoryOnly: a lock without renewal, shown for its memory.
	MemoryOnly bool `json:",omitempty"`
	AcqPerSec  float64
	// RedisBytesPerLock is INFO memory's used_memory while the keys are
	// held, over what it was before they were taken, and
	// RedisBytesLessClients the same less the clients' buffers (see
	// redisMemory); HeapBytesPerLock and
	// HeapObjectsPerLock, runtime.MemStats' HeapAlloc and HeapObjects
	// after two collections, likewise (the least of three readings a
	// third of a renewal interval apart, so that a renewal round's
	// transient garbage is not counted as held). HeapKeptPerKey is what
	// stays once every key is released.
	RedisBytesPerLock, RedisBytesLessClients             float64
	HeapBytesPerLock, HeapObjectsPerLock, HeapKeptPerKey float64
	// The holding window, Rounds renewal intervals: the registry's calls
	// per second by what they were for (its RedisCalls hook), the
	// server's commands per second (INFO commandstats; the PINGs and INFO
	// left out) and by name, with each name's µs per second (commandstats
	// usec: a script's includes the commands it ran, which are counted
	// under their own names too), its CPU (INFO cpu, sys+user, % of one
	// core), and ScriptBusy, EVALSHA's usec in % of the window: the
	// renewal scripts' time in Redis, the commands they ran included.
	Window                                  float64            `json:",omitempty"`
	Rounds                                  int                `json:",omitempty"`
	RenewCallsPerSec, TrackCallsPerSec      float64            `json:",omitempty"`
	ServerCmdsPerSec, ServerCPU, ScriptBusy float64            `json:",omitempty"`
	ServerCmdsByName, ServerUsecByName      map[string]float64 `json:",omitempty"`
	ServerCPURest                           float64            `json:",omitempty"`
	PingRest, PingHold                      *PingFigures       `json:",omitempty"`
	ReleaseAll                              float64            `json:",omitempty"`
	Lost                                    int                `json:",omitempty"` // holds lost before their release
	// Realtime: the row ran with -realtime.
	Realtime bool `json:",omitempty"`
	// LostBy counts the losses the registry signalled (its Lost hook), by
	// cause.
	LostBy map[string]int `json:",omitempty"`
	// RoundsTaking and RoundsHeld are the renewal rounds' durations, each
	// round one pipeline of renew.lua calls timed by a go-redis hook on
	// the registry's client, while the keys were being taken and in the
	// holding window: how many, their median and the longest.
	RoundsTaking, RoundsHeld *RoundFigures `json:",omitempty"`
}

// RoundFigures are renewal rounds' durations, ns.
type RoundFigures struct {
	N        int
	P50, Max float64
}

// roundTimer is a go-redis hook that times the pipelines of EVALSHA
// calls, the registry's renewal rounds (its acquisitions and releases
// run alone or in pipelines of SETs and scripts, which S8 does not mix
// with holding).
type roundTimer struct {
	mu     sync.Mutex
	rounds []time.Duration
}

func (t *roundTimer) DialHook(next redis.DialHook) redis.DialHook { return next }

func (t *roundTimer) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (t *roundTimer) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) == 0 || cmds[0].Name() != "evalsha" {
			return next(ctx, cmds)
		}
		start := time.Now()
		err := next(ctx, cmds)
		t.mu.Lock()
		t.rounds = append(t.rounds, time.Since(start))
		t.mu.Unlock()
		return err
	}
}

// take returns the rounds timed since the last take.
func (t *roundTimer) take() *RoundFigures {
	t.mu.Lock()
	rounds := t.rounds
	t.rounds = nil
	t.mu.Unlock()
	if len(rounds) == 0 {
		return nil
	}
	slices.Sort(rounds)
	return &RoundFigures{N: len(rounds), P50: float64(quantile(rounds, 0.5)), Max: float64(rounds[len(rounds)-1])}
}

// PingFigures is what an unrelated client's PINGs, one every ms or so on
// a connection of their own in a process of their own, took.
type PingFigures struct {
	N             int
	P50, P99, Max float64
}

// scale runs S8 for the contenders that hold that many keys: lockreg at
// each lease, bsm/redislock for its memory.
func (e *benchEnv) scale(ctx context.Context, sc scenario, fs []contenders.Factory) []Result {
	shape := *sc.scale
	if e.quick {
		shape = shape.smoke()
	}
	srv, err := redistest.Launch()
	if err != nil {
		return []Result{{Scenario: sc.id, Contender: contenders.LockReg.Name, Err: err.Error()}}
	}
	defer srv.Shutdown()
	if realtime {
		// All the server's threads, -a: its I/O and background threads too.
		if out, err := exec.CommandContext(ctx, "chrt", "-a", "-f", "-p", strconv.Itoa(fifo), strconv.Itoa(srv.Pid())).CombinedOutput(); err != nil {
			return []Result{{Scenario: sc.id, Contender: contenders.LockReg.Name, Err: fmt.Sprintf("-realtime: chrt the redis-server: %v: %s", err, strings.TrimSpace(string(out)))}}
		}
	}
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer admin.Close()
	var results []Result
	add := func(name string, s *ScaleResult, err error) {
		if s != nil {
			s.Realtime = realtime
		}
		r := Result{Scenario: sc.id, Contender: name, Scale: s}
		if err != nil {
			r.Err = err.Error()
		}
		fmt.Fprintln(os.Stderr, r.line())
		results = append(results, r)
	}
	for _, f := range fs {
		switch f.Name {
		case contenders.LockReg.Name:
			for _, lease := range shape.leases {
				s, err := holdLockReg(ctx, srv.Addr(), admin, shape, lease)
				add(f.Name, s, err)
			}
		case contenders.RedisLockLinear.Name:
			s, err := holdRedisLock(ctx, srv.Addr(), admin, shape)
			add(f.Name, s, err)
		}
	}
	return results
}

// scaleKeys names n keys.
func scaleKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "s8:" + strconv.Itoa(i)
	}
	return keys
}

// eachKey runs fn for every index below n on goroutines goroutines, each
// taking the indexes congruent to its number, and returns the first error.
func eachKey(goroutines, n int, fn func(i int) error) error {
	var wg sync.WaitGroup
	errs := make([]error, goroutines)
	for g := range goroutines {
		wg.Go(func() {
			for i := g; i < n; i += goroutines {
				if err := fn(i); err != nil {
					errs[g] = fmt.Errorf("key %d: %w", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// holdLockReg runs S8 on one registry with lease.
func holdLockReg(ctx context.Context, addr string, admin *redis.Client, shape scaleShape, lease time.Duration) (*ScaleResult, error) {
	if err := admin.FlushAll(ctx).Err(); err != nil {
		return nil, err
	}
	keys := scaleKeys(shape.keys)
	holds := make([]*lockreg.Hold, len(keys))
	var renewCalls, trackCalls atomic.Int64
	var lostMu sync.Mutex
	lostBy := map[string]int{}
	client := redis.NewClient(&redis.Options{Addr: addr})
	defer client.Close()
	rounds := new(roundTimer)
	client.AddHook(rounds)
	reg, err := lockreg.New(client, "bench", lockreg.WithExpireAfter(lease))
	if err != nil {
		return nil, err
	}
	defer reg.Close()
	reg.AddHooks(lockreg.Hooks{RedisCalls: func(op lockreg.RedisOp, n int) {
		switch op {
		case lockreg.OpRenew:
			renewCalls.Add(int64(n))
		case lockreg.OpTrack:
			trackCalls.Add(int64(n))
		}
	}, Lost: func(e lockreg.LossEvent) {
		lostMu.Lock()
		lostBy[e.Cause.String()]++
		lostMu.Unlock()
	}})
	// Warm up at the same parallelism: connections, scripts, the
	// subscription and the tracker, all up before the baselines.
	warm := min(1_000, len(keys))
	if err := eachKey(shape.goroutines, warm, func(i int) error {
		h, err := reg.Obtain("warm:" + keys[i]).Acquire(ctx)
		if err == nil {
			err = h.Release(ctx)
		}
		return err
	}); err != nil {
		return nil, err
	}
	time.Sleep(100 * time.Millisecond)

	res := &ScaleResult{Keys: len(keys), Lease: float64(lease), Rounds: shape.rounds}
	var cpu0, cpu1 float64
	var t0, t1 time.Time
	res.PingRest, err = watched(ctx, addr, shape.rest, func() (err error) {
		t0 = time.Now()
		cpu0, err = serverCPU(ctx, admin)
		return err
	}, func() (err error) {
		t1 = time.Now()
		cpu1, err = serverCPU(ctx, admin)
		return err
	})
	if err != nil {
		return nil, err
	}
	res.ServerCPURest = 100 * (cpu1 - cpu0) / t1.Sub(t0).Seconds()

	mem0, lean0, err := settledMemory(ctx, admin)
	if err != nil {
		return nil, err
	}
	heap0 := heapNow()
	rounds.take()
	start := time.Now()
	if err := eachKey(shape.goroutines, len(keys), func(i int) error {
		var err error
		holds[i], err = reg.Obtain(keys[i]).Acquire(ctx)
		return err
	}); err != nil {
		return nil, err
	}
	res.AcqPerSec = float64(len(keys)) / time.Since(start).Seconds()
	res.RoundsTaking = rounds.take()

	// Hold for rounds renewal intervals, the server and the PINGs watched.
	window := time.Duration(shape.rounds) * lease / 3
	var stats0, stats1 map[string][2]int64
	var renew0, track0, renew1, track1 int64
	res.PingHold, err = watched(ctx, addr, window, func() (err error) {
		t0 = time.Now()
		rounds.take()
		renew0, track0 = renewCalls.Load(), trackCalls.Load()
		if stats0, err = commandStats(ctx, admin); err == nil {
			cpu0, err = serverCPU(ctx, admin)
		}
		return err
	}, func() (err error) {
		t1 = time.Now()
		res.RoundsHeld = rounds.take()
		renew1, track1 = renewCalls.Load(), trackCalls.Load()
		if stats1, err = commandStats(ctx, admin); err == nil {
			cpu1, err = serverCPU(ctx, admin)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	wall := t1.Sub(t0).Seconds()
	res.Window = float64(t1.Sub(t0))
	res.RenewCallsPerSec = float64(renew1-renew0) / wall
	res.TrackCallsPerSec = float64(track1-track0) / wall
	res.ServerCPU = 100 * (cpu1 - cpu0) / wall
	res.ServerCmdsByName, res.ServerUsecByName = map[string]float64{}, map[string]float64{}
	var calls int64
	for name, after := range stats1 {
		if name == "info" || name == "ping" {
			continue
		}
		before := stats0[name]
		if d := after[0] - before[0]; d > 0 {
			calls += d
			res.ServerCmdsByName[name] = float64(d) / wall
			res.ServerUsecByName[name] = float64(after[1]-before[1]) / wall
		}
	}
	res.ServerCmdsPerSec = float64(calls) / wall
	res.ScriptBusy = res.ServerUsecByName["evalsha"] / 1e6 * 100

	// What the held keys cost, read a third of a renewal interval apart.
	var redisBytes, leanBytes, heapBytes, objects float64 = -1, -1, -1, -1
	for k := range 3 {
		if k > 0 {
			time.Sleep(lease / 9)
		}
		mem, lean, err := redisMemory(ctx, admin)
		if err != nil {
			return nil, err
		}
		h := heapNow()
		redisBytes = minPositive(redisBytes, float64(mem-mem0))
		leanBytes = minPositive(leanBytes, float64(lean-lean0))
		heapBytes = minPositive(heapBytes, float64(h.HeapAlloc)-float64(heap0.HeapAlloc))
		objects = minPositive(objects, float64(h.HeapObjects)-float64(heap0.HeapObjects))
	}
	n := float64(len(keys))
	res.RedisBytesPerLock, res.RedisBytesLessClients = redisBytes/n, leanBytes/n
	res.HeapBytesPerLock, res.HeapObjectsPerLock = heapBytes/n, objects/n
	for _, h := range holds {
		select {
		case <-h.Lost():
			res.Lost++
		default:
		}
	}
	lostMu.Lock()
	if len(lostBy) > 0 {
		res.LostBy = maps.Clone(lostBy)
	}
	lostMu.Unlock()

	err = res.releaseAll(shape.goroutines, heap0, func(i int) error {
		err := holds[i].Release(ctx)
		if errors.Is(err, lockreg.ErrLockLost) {
			return nil // counted above, or lost since: the release ended it all the same
		}
		return err
	}, func() { clear(holds) })
	return res, err
}

// releaseAll releases the row's keys, release(i) each, on goroutines
// goroutines, timed; then, once forget dropped the harness's own
// references to the holds, weighs what the heap keeps over heap0.
func (res *ScaleResult) releaseAll(goroutines int, heap0 runtime.MemStats, release func(i int) error, forget func()) error {
	start := time.Now()
	err := eachKey(goroutines, res.Keys, release)
	res.ReleaseAll = float64(time.Since(start))
	if err != nil {
		return err
	}
	forget()
	res.HeapKeptPerKey = (float64(heapNow().HeapAlloc) - float64(heap0.HeapAlloc)) / float64(res.Keys)
	return nil
}

// holdRedisLock takes the keys with bsm/redislock, which does not renew,
// for its memory.
func holdRedisLock(ctx context.Context, addr string, admin *redis.Client, shape scaleShape) (*ScaleResult, error) {
	if err := admin.FlushAll(ctx).Err(); err != nil {
		return nil, err
	}
	keys := scaleKeys(shape.keys)
	locks := make([]*redislock.Lock, len(keys))
	client := redis.NewClient(&redis.Options{Addr: addr})
	defer client.Close()
	locker := redislock.New(client)
	warm := min(1_000, len(keys))
	if err := eachKey(shape.goroutines, warm, func(i int) error {
		l, err := locker.Obtain(ctx, "warm:"+keys[i], scaleBSMTTL, nil)
		if err == nil {
			err = l.Release(ctx)
		}
		return err
	}); err != nil {
		return nil, err
	}
	res := &ScaleResult{Keys: len(keys), MemoryOnly: true}
	mem0, lean0, err := settledMemory(ctx, admin)
	if err != nil {
		return nil, err
	}
	heap0 := heapNow()
	start := time.Now()
	if err := eachKey(shape.goroutines, len(keys), func(i int) error {
		var err error
		locks[i], err = locker.Obtain(ctx, keys[i], scaleBSMTTL, nil)
		return err
	}); err != nil {
		return nil, err
	}
	res.AcqPerSec = float64(len(keys)) / time.Since(start).Seconds()
	mem1, lean1, err := settledMemory(ctx, admin)
	if err != nil {
		return nil, err
	}
	heap1 := heapNow()
	n := float64(len(keys))
	res.RedisBytesPerLock, res.RedisBytesLessClients = float64(mem1-mem0)/n, float64(lean1-lean0)/n
	res.HeapBytesPerLock = (float64(heap1.HeapAlloc) - float64(heap0.HeapAlloc)) / n
	res.HeapObjectsPerLock = (float64(heap1.HeapObjects) - float64(heap0.HeapObjects)) / n
	err = res.releaseAll(shape.goroutines, heap0, func(i int) error { return locks[i].Release(ctx) }, func() { clear(locks) })
	return res, err
}

// minPositive is the smaller of a and b, where a negative a is none yet.
func minPositive(a, b float64) float64 {
	if a < 0 {
		return b
	}
	return min(a, b)
}

// heapNow is the heap after two full collections (the first moves what
// sync.Pools hold to their victim caches, the second frees it).
func heapNow() runtime.MemStats {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m
}

// infoField reads a numeric field of an INFO section.
func infoField(ctx context.Context, admin *redis.Client, section, field string) (float64, error) {
	info, err := admin.Info(ctx, section).Result()
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return strconv.ParseFloat(v, 64)
		}
	}
	return 0, fmt.Errorf("INFO %s has no %s", section, field)
}

func usedMemory(ctx context.Context, admin *redis.Client) (int64, error) {
	v, err := infoField(ctx, admin, "memory", "used_memory")
	return int64(v), err
}

// settledMemory is redisMemory once it stopped moving: two readings
// 100ms apart within 1 KiB of each other (for 3s at most). After a burst
// of calls, Redis frees memory for a few hundred ms (about 150 KiB after
// 300 keys taken and released), which a baseline read at once would count
// against the keys taken next.
func settledMemory(ctx context.Context, admin *redis.Client) (used, lessClients int64, err error) {
	used, lessClients, err = redisMemory(ctx, admin)
	for deadline := time.Now().Add(3 * time.Second); err == nil && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		u, l, e := redisMemory(ctx, admin)
		settled := max(u-used, used-u) < 1024 && max(l-lessClients, lessClients-l) < 1024
		used, lessClients, err = u, l, e
		if settled {
			break
		}
	}
	return used, lessClients, err
}

// redisMemory is INFO memory's used_memory, and the same less the
// clients' buffers (MEMORY STATS clients.normal), which move with what
// connections did lately (Redis shrinks idle ones' query buffers in its
// cron), not with the keys.
func redisMemory(ctx context.Context, admin *redis.Client) (used, lessClients int64, err error) {
	if used, err = usedMemory(ctx, admin); err != nil {
		return 0, 0, err
	}
	stats, err := admin.Do(ctx, "memory", "stats").Result()
	if err != nil {
		return 0, 0, err
	}
	var clients any
	switch m := stats.(type) {
	case map[any]any:
		clients = m["clients.normal"]
	case []any:
		for i := 0; i+1 < len(m); i += 2 {
			if m[i] == "clients.normal" {
				clients = m[i+1]
			}
		}
	}
	n, ok := clients.(int64)
	if !ok {
		return 0, 0, fmt.Errorf("MEMORY STATS has no clients.normal: %v", stats)
	}
	return used, used - n, nil
}

// serverCPU is the server's CPU seconds so far, system and user.
func serverCPU(ctx context.Context, admin *redis.Client) (float64, error) {
	sys, err := infoField(ctx, admin, "cpu", "used_cpu_sys")
	if err != nil {
		return 0, err
	}
	user, err := infoField(ctx, admin, "cpu", "used_cpu_user")
	return sys + user, err
}

// commandStats is INFO commandstats: each command's calls and usec.
func commandStats(ctx context.Context, admin *redis.Client) (map[string][2]int64, error) {
	info, err := admin.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, err
	}
	stats := map[string][2]int64{}
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		// cmdstat_get:calls=5,usec=12,...
		name, rest, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(sc.Text()), "cmdstat_"), ":calls=")
		if !ok {
			continue
		}
		calls, rest, _ := strings.Cut(rest, ",usec=")
		usec, _, _ := strings.Cut(rest, ",")
		c, err1 := strconv.ParseInt(calls, 10, 64)
		u, err2 := strconv.ParseInt(usec, 10, 64)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("INFO commandstats: cannot read %q", sc.Text())
		}
		stats[name] = [2]int64{c, u}
	}
	return stats, nil
}

// pingerEnv makes this binary S8's unrelated client: it PINGs the server
// about every ms, on a connection of its own, for a while, and prints what
// the PINGs took.
const pingerEnv = "LOCKREG_BENCH_PINGER"

type pingerSpec struct {
	Addr     string
	Start    time.Time
	Duration time.Duration
}

// startPinger starts the unrelated client, to PING from start for d, and
// returns the function that waits for it and returns what its PINGs took.
func startPinger(ctx context.Context, addr string, start time.Time, d time.Duration) (wait func() (*PingFigures, error), err error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	spec, _ := json.Marshal(pingerSpec{Addr: addr, Start: start, Duration: d})
	cmd := exec.CommandContext(ctx, self)
	if realtime {
		cmd = exec.CommandContext(ctx, "chrt", "-f", strconv.Itoa(fifo+1), self)
	}
	cmd.Env = append(os.Environ(), pingerEnv+"="+string(spec))
	cmd.Stderr = os.Stderr
	var out strings.Builder
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("pinger: %w", err)
	}
	return func() (*PingFigures, error) {
		if err := cmd.Wait(); err != nil {
			return nil, fmt.Errorf("pinger: %w", err)
		}
		var f PingFigures
		if err := json.Unmarshal([]byte(out.String()), &f); err != nil {
			return nil, fmt.Errorf("pinger: %w", err)
		}
		return &f, nil
	}, nil
}

// pingerLead is how long before its start the unrelated client is
// started, so that it has connected by then.
const pingerLead = 300 * time.Millisecond

// watched runs the unrelated client for d from pingerLead from now, and
// around that window, calls before at its start and after at its end.
func watched(ctx context.Context, addr string, d time.Duration, before, after func() error) (*PingFigures, error) {
	start := time.Now().Add(pingerLead)
	wait, err := startPinger(ctx, addr, start, d)
	if err != nil {
		return nil, err
	}
	time.Sleep(time.Until(start))
	err = before()
	time.Sleep(time.Until(start.Add(d)))
	if err == nil {
		err = after()
	}
	f, waitErr := wait()
	return f, errors.Join(err, waitErr)
}

func runPinger(raw string) int {
	var spec pingerSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "pinger:", err)
		return 2
	}
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: spec.Addr, PoolSize: 1})
	defer client.Close()
	if err := client.Ping(ctx).Err(); err != nil {
		fmt.Fprintln(os.Stderr, "pinger:", err)
		return 1
	}
	took := make([]time.Duration, 0, spec.Duration/time.Millisecond+16)
	time.Sleep(time.Until(spec.Start))
	for end := spec.Start.Add(spec.Duration); time.Now().Before(end); {
		t := time.Now()
		if err := client.Ping(ctx).Err(); err != nil {
			fmt.Fprintln(os.Stderr, "pinger:", err)
			return 1
		}
		took = append(took, time.Since(t))
		time.Sleep(time.Millisecond)
	}
	slices.Sort(took)
	f := PingFigures{N: len(took)}
	if len(took) > 0 {
		f.P50, f.P99, f.Max = float64(quantile(took, 0.5)), float64(quantile(took, 0.99)), float64(took[len(took)-1])
	}
	if err := json.NewEncoder(os.Stdout).Encode(f); err != nil {
		return 1
	}
	return 0
}

// line is the row's line on stderr.
func (s *ScaleResult) line(scenario, contender string) string {
	if s.MemoryOnly {
		return fmt.Sprintf("%s %-22s %d keys, no renewal: %.0f acq/s, Redis %.0f B/lock (%.0f less client buffers), heap %.0f B and %.1f objects/lock, released in %v",
			scenario, contender, s.Keys, s.AcqPerSec, s.RedisBytesPerLock, s.RedisBytesLessClients, s.HeapBytesPerLock, s.HeapObjectsPerLock, time.Duration(s.ReleaseAll).Round(time.Millisecond))
	}
	return fmt.Sprintf("%s %-22s %d keys, lease %v: %.0f acq/s, Redis %.0f B/lock (%.0f less client buffers), heap %.0f B and %.1f objects/lock, %.0f server cmds/s, server CPU %.0f%% (%.0f%% at rest), PING p99 %.0f µs (%.0f at rest), %d lost, released in %v",
		scenario, contender, s.Keys, time.Duration(s.Lease), s.AcqPerSec, s.RedisBytesPerLock, s.RedisBytesLessClients, s.HeapBytesPerLock, s.HeapObjectsPerLock,
		s.ServerCmdsPerSec, s.ServerCPU, s.ServerCPURest, pingP99(s.PingHold), pingP99(s.PingRest), s.Lost, time.Duration(s.ReleaseAll).Round(time.Millisecond))
}

func pingP99(f *PingFigures) float64 {
	if f == nil {
		return 0
	}
	return f.P99 / 1e3
}
