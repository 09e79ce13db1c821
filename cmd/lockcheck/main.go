//go:build linux

// Command lockcheck checks lockreg's mutual exclusion and fencing under
// faults, on real Redis servers it starts itself.
//
// Worker processes (re-executions of this binary), each with one registry
// shared by several goroutines, loop for the run: lock one of the keys,
// increment the key's record in a fenced store (a second Redis, never
// faulted, that rejects calls with a token lower than one it has seen)
// with a separate read and write, and unlock. Meanwhile lockcheck stops
// and kills holders, kills connections, crashes and restarts the lock
// Redis, pauses it and makes it sleep. The workers stream every hold to
// lockcheck, which then checks the history: no two holds of a key whose
// leases were live overlap, tokens only rise, the store rejected every
// stale call, no increment was lost, no waiter starved, and every fault
// was recovered from. docs/RELIABILITY.md has the definitions and a long
// run's figures.
//
//	go run ./cmd/lockcheck            # about 30s
//	go run ./cmd/lockcheck -d 10m     # the long run (make chaos)
//
// It exits 1 on any violation. It runs on Linux only: it relies on
// SIGSTOP and on children that die with it (Pdeathsig).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockreg/lockreg/internal/redistest"
)

type config struct {
	d           time.Duration
	keys        []int
	p, g        int
	lease       time.Duration
	retry       time.Duration
	work        time.Duration
	wait        time.Duration
	every       time.Duration
	faults      []string
	seed        uint64
	json        bool
	keysFlag    string        // as given, for the log
	perKeyCount time.Duration // the length of each phase
}

func main() {
	if spec, ok := os.LookupEnv(workerEnv); ok {
		os.Exit(runWorker(spec))
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "lockcheck:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logf := func(format string, a ...any) { fmt.Fprintf(stderr, "lockcheck: "+format+"\n", a...) }
	phases, err := check(ctx, cfg, stderr, logf)
	if ctx.Err() != nil {
		logf("interrupted; every worker and Redis it started is stopped")
		return 130
	}
	if err != nil {
		logf("%v", err)
		return 1
	}
	total := merge(phases)
	if cfg.json {
		err = writeJSON(stdout, cfg, phases, total)
	} else {
		err = writeTable(stdout, cfg, phases, total)
	}
	if err != nil {
		logf("%v", err)
		return 1
	}
	if total.ViolationCount > 0 {
		return 1
	}
	return 0
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("lockcheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.DurationVar(&cfg.d, "d", 30*time.Second, "how long to run, split evenly among the -keys counts")
	fs.StringVar(&cfg.keysFlag, "keys", "1,16", "how many keys the workers choose from; a list runs one phase per count")
	fs.IntVar(&cfg.p, "p", 4, "worker processes")
	fs.IntVar(&cfg.g, "g", 8, "goroutines per worker, sharing its registry")
	fs.DurationVar(&cfg.lease, "lease", time.Second, "the lock lease (WithExpireAfter); stops and pauses last 1.5 leases, DEBUG SLEEP half of one")
	fs.DurationVar(&cfg.retry, "retry", 100*time.Millisecond, "the retry interval (WithRetryInterval)")
	fs.DurationVar(&cfg.work, "work", time.Millisecond, "mean pause between a critical section's read and its write")
	fs.DurationVar(&cfg.wait, "wait", 10*time.Second, "an acquisition that waits this long has starved (a violation)")
	fs.DurationVar(&cfg.every, "every", 2500*time.Millisecond, "the interval between faults")
	faults := fs.String("faults", strings.Join(faultKinds, ","), "the faults to inject, in rotation; empty for none")
	fs.Uint64Var(&cfg.seed, "seed", 0, "random seed (0: pick one; the report shows it)")
	fs.BoolVar(&cfg.json, "json", false, "print the results as JSON instead of a table")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected argument %q; all settings are flags (see -h)", fs.Arg(0))
	}
	for _, s := range strings.Split(cfg.keysFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return cfg, fmt.Errorf("-keys: %q is not a key count of at least 1", s)
		}
		cfg.keys = append(cfg.keys, n)
	}
	if *faults != "" {
		for _, s := range strings.Split(*faults, ",") {
			if s = strings.TrimSpace(s); !slices.Contains(faultKinds, s) {
				return cfg, fmt.Errorf("-faults: unknown fault %q; the kinds are %s", s, strings.Join(faultKinds, ","))
			}
			cfg.faults = append(cfg.faults, s)
		}
	}
	switch {
	case cfg.p < 1 || cfg.g < 1:
		return cfg, fmt.Errorf("-p and -g must be at least 1")
	case cfg.retry <= 0 || cfg.retry >= cfg.lease:
		return cfg, fmt.Errorf("-retry (%v) must be positive and shorter than -lease (%v)", cfg.retry, cfg.lease)
	case cfg.work < 0:
		return cfg, fmt.Errorf("-work must not be negative")
	case cfg.wait <= 2*stopFor(cfg.lease):
		return cfg, fmt.Errorf("-wait (%v) must be longer than two stops of 1.5 leases (%v): waiting across a fault is fair", cfg.wait, 2*stopFor(cfg.lease))
	case cfg.every < 2*cfg.lease:
		return cfg, fmt.Errorf("-every (%v) must be at least two leases (%v), so that each fault is over and recovered from before the next", cfg.every, 2*cfg.lease)
	}
	cfg.perKeyCount = cfg.d / time.Duration(len(cfg.keys))
	if cfg.perKeyCount < warmup(cfg.lease)+tail(cfg.lease) {
		return cfg, fmt.Errorf("-d (%v) leaves %v per key count, less than the %v a phase needs around its faults", cfg.d, cfg.perKeyCount, warmup(cfg.lease)+tail(cfg.lease))
	}
	if cfg.seed == 0 {
		cfg.seed = uint64(time.Now().UnixNano())
	}
	return cfg, nil
}

// A phase injects faults only after a warm-up, and none in its tail, which
// leaves time to recover from the last one (a killed holder's key stays
// taken for up to a lease).
func warmup(lease time.Duration) time.Duration { return lease }
func tail(lease time.Duration) time.Duration   { return 2*lease + time.Second }

// check runs one phase per key count on one pair of Redis servers and
// analyzes each phase's history.
func check(ctx context.Context, cfg config, stderr io.Writer, logf func(string, ...any)) ([]*Result, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	lockSrv, err := redistest.Launch()
	if err != nil {
		return nil, err
	}
	defer lockSrv.Shutdown()
	storeSrv, err := redistest.Launch()
	if err != nil {
		return nil, err
	}
	defer storeSrv.Shutdown()
	store := redis.NewClient(&redis.Options{Addr: storeSrv.Addr()})
	defer store.Close()
	admin := redis.NewClient(&redis.Options{Addr: lockSrv.Addr(), ReadTimeout: pauseFor(cfg.lease) + 5*time.Second})
	defer admin.Close()

	logf("%d workers x %d goroutines, lease %v, keys %s, %v per key count, seed %d; lock Redis %s, store Redis %s",
		cfg.p, cfg.g, cfg.lease, cfg.keysFlag, cfg.perKeyCount, cfg.seed, lockSrv.Addr(), storeSrv.Addr())
	var results []*Result
	rotation := 0
	for n, keys := range cfg.keys {
		ph := &phase{
			cfg: cfg, self: self, stderr: stderr,
			lockAddr: lockSrv.Addr(), storeAddr: storeSrv.Addr(),
			registry: fmt.Sprintf("lockcheck-k%d", keys),
			procs:    make(map[int]*workerProc),
		}
		for i := range keys {
			ph.keys = append(ph.keys, fmt.Sprintf("k%d", i))
		}
		in := &injector{
			ph: ph, lock: lockSrv, admin: admin, kinds: cfg.faults, next: &rotation,
			rng: rand.New(rand.NewPCG(cfg.seed, uint64(n))),
			log: func(format string, a ...any) { logf("keys=%d: "+format, append([]any{keys}, a...)...) },
		}
		h, err := ph.run(ctx, in, store)
		if err != nil {
			return nil, fmt.Errorf("keys=%d: %w", keys, err)
		}
		res := Analyze(h)
		logf("keys=%d: %d acquisitions, %d faults, %d violations", keys, res.Acquisitions, len(h.Faults), res.ViolationCount)
		results = append(results, res)
	}
	return results, nil
}

// phase is one key count's run: its workers, their history, the faults.
type phase struct {
	cfg                 config
	self                string
	stderr              io.Writer
	lockAddr, storeAddr string
	registry            string
	keys                []string
	until               time.Time
	col                 *collector

	mu     sync.Mutex
	procs  map[int]*workerProc // running
	nextID int
}

type workerProc struct {
	id     int
	cmd    *exec.Cmd
	killed atomic.Bool
	done   chan struct{} // its output is read and it has exited
}

func (ph *phase) run(ctx context.Context, in *injector, store *redis.Client) (*History, error) {
	cfg := ph.cfg
	start := time.Now()
	ph.until = start.Add(cfg.perKeyCount)
	ph.col = newCollector(History{Keys: len(ph.keys), Lease: cfg.lease, Wait: cfg.wait, Start: start.UnixNano()}, ph.keys)
	defer ph.killAll()
	for range cfg.p {
		if _, err := ph.startWorker(); err != nil {
			return nil, err
		}
	}
	injected := make(chan error, 1)
	if len(cfg.faults) == 0 {
		injected <- nil
	} else {
		go func() {
			injected <- in.run(ctx, start.Add(warmup(cfg.lease)), cfg.every, ph.until.Add(-tail(cfg.lease)))
		}()
	}
	if err := <-injected; err != nil {
		return nil, err
	}
	// Workers end on their own at until; one that is not done well after
	// its last wait could have ended is stuck.
	grace := time.NewTimer(time.Until(ph.until.Add(cfg.wait + 10*time.Second)))
	defer grace.Stop()
	for {
		w := ph.anyProc()
		if w == nil {
			break
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-grace.C:
			return nil, fmt.Errorf("worker %d did not finish by %v after the end of the run", w.id, cfg.wait+10*time.Second)
		case <-w.done:
			ph.mu.Lock()
			delete(ph.procs, w.id)
			ph.mu.Unlock()
		}
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	h := ph.col.history()
	h.End = time.Now().UnixNano()
	h.Records = make(map[string]Record)
	for _, k := range ph.keys {
		rec, err := readRecord(ctx, store, storeRecord(ph.registry, k))
		if err != nil {
			return nil, fmt.Errorf("read the store: %w", err)
		}
		h.Records[k] = rec
	}
	return h, nil
}

func (ph *phase) startWorker() (int, error) {
	ph.mu.Lock()
	id := ph.nextID
	ph.nextID++
	ph.mu.Unlock()
	spec, err := json.Marshal(workerConfig{
		ID: id, LockAddr: ph.lockAddr, StoreAddr: ph.storeAddr, Registry: ph.registry, Keys: ph.keys,
		Goroutines: ph.cfg.g, Until: ph.until, Lease: ph.cfg.lease, Retry: ph.cfg.retry,
		Wait: ph.cfg.wait, Work: ph.cfg.work, Seed: ph.cfg.seed,
	})
	if err != nil {
		return 0, err
	}
	cmd := exec.Command(ph.self)
	cmd.Env = append(os.Environ(), workerEnv+"="+string(spec))
	cmd.Stderr = ph.stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	ph.col.workerStarted(id, time.Now())
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("start worker %d: %w", id, err)
	}
	w := &workerProc{id: id, cmd: cmd, done: make(chan struct{})}
	ph.mu.Lock()
	ph.procs[id] = w
	ph.mu.Unlock()
	go func() {
		defer close(w.done)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		for sc.Scan() {
			var ev event
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
				ph.col.failed("worker %d wrote %q: %v", id, sc.Text(), err)
				continue
			}
			ph.col.add(id, ev)
		}
		if err := cmd.Wait(); err != nil && !w.killed.Load() {
			ph.col.failed("worker %d: %v", id, err)
		}
	}()
	return id, nil
}

func (ph *phase) proc(id int) *workerProc {
	ph.mu.Lock()
	defer ph.mu.Unlock()
	return ph.procs[id]
}

func (ph *phase) anyProc() *workerProc {
	ph.mu.Lock()
	defer ph.mu.Unlock()
	for _, w := range ph.procs {
		return w
	}
	return nil
}

// kill is kill -9: the worker dies wherever it is, inside a critical
// section or not. Its events up to then are all read before it is filed
// as killed.
func (ph *phase) kill(w *workerProc) error {
	at := time.Now()
	w.killed.Store(true)
	if err := w.cmd.Process.Kill(); err != nil {
		return err
	}
	<-w.done
	ph.mu.Lock()
	delete(ph.procs, w.id)
	ph.mu.Unlock()
	ph.col.workerKilled(w.id, at)
	return nil
}

// killAll ends every worker still running, stopped ones included, and
// waits for them.
func (ph *phase) killAll() {
	ph.mu.Lock()
	procs := make([]*workerProc, 0, len(ph.procs))
	for _, w := range ph.procs {
		procs = append(procs, w)
	}
	ph.procs = map[int]*workerProc{}
	ph.mu.Unlock()
	for _, w := range procs {
		w.killed.Store(true)
		_ = w.cmd.Process.Kill()
	}
	for _, w := range procs {
		<-w.done
	}
}
