//go:build linux

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockreg/lockreg/internal/faultproxy"
)

// phase is one key count's run: its workers, their history, the faults.
type phase struct {
	cfg       config
	self      string
	stderr    io.Writer
	topo      topology
	storeAddr string
	registry  string
	keys      []string
	until     time.Time
	col       *collector
	// routed: each worker reaches Redis through a router of its own, for
	// the network faults.
	routed  bool
	servers []string // the addresses of the lock Redis's servers
	// refusal is what a registry without WithEvictionAllowed did on the
	// evicting lock Redis (the first phase of a run with evict faults).
	refusal *refusal

	mu     sync.Mutex
	procs  map[int]*workerProc // running
	nextID int
}

type workerProc struct {
	id     int
	cmd    *exec.Cmd
	router *faultproxy.Proxy // nil unless the phase is routed
	killed atomic.Bool
	done   chan struct{} // its output is read, it has exited, its router is closed
}

func (ph *phase) run(ctx context.Context, in *injector, store *redis.Client) (*history, error) {
	cfg := ph.cfg
	start := time.Now()
	ph.until = start.Add(cfg.perKeyCount)
	ph.col = newCollector(history{
		keys: len(ph.keys), lease: cfg.lease, wait: cfg.wait, start: start.UnixNano(), acknowledged: cfg.waitReplica > 0, refusal: ph.refusal,
	}, ph.keys)
	watchCtx, stopWatching := context.WithCancel(ctx)
	watching := make(chan struct{})
	go func() {
		defer close(watching)
		newWatcher(ph.topo, ph.keys, ph.col).run(watchCtx)
	}()
	// The watcher files its last switches before the history is read.
	defer func() { stopWatching(); <-watching }()
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
			injected <- in.run(ctx, start.Add(warmup(cfg)), cfg.every, ph.until.Add(-tail(cfg)))
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
	stopWatching()
	<-watching
	h := ph.col.history()
	h.end = time.Now().UnixNano()
	h.records = make(map[string]recordState)
	for _, k := range ph.keys {
		rec, err := readRecord(ctx, store, storeRecord(ph.registry, k))
		if err != nil {
			return nil, fmt.Errorf("read the store: %w", err)
		}
		h.records[k] = rec
	}
	return h, nil
}

func (ph *phase) startWorker() (int, error) {
	ph.mu.Lock()
	id := ph.nextID
	ph.nextID++
	ph.mu.Unlock()
	w := &workerProc{id: id, done: make(chan struct{})}
	wc := workerConfig{
		ID: id, Topology: ph.cfg.topology, LockAddrs: ph.topo.addrs(), Servers: ph.servers, WaitReplicas: ph.cfg.waitReplica,
		StoreAddr: ph.storeAddr, Registry: ph.registry, Keys: ph.keys,
		Goroutines: ph.cfg.g, Until: ph.until, Lease: ph.cfg.lease, Retry: ph.cfg.retry,
		Wait: ph.cfg.wait, Work: ph.cfg.work, Long: ph.cfg.long, Seed: ph.cfg.seed,
		EvictionAllowed: slices.Contains(ph.cfg.faults, faultEvict),
	}
	if ph.routed {
		router, err := faultproxy.StartRouter()
		if err != nil {
			return 0, err
		}
		w.router, wc.Router = router, router.Addr()
	}
	spec, err := json.Marshal(wc)
	if err != nil {
		w.closeRouter()
		return 0, err
	}
	cmd := exec.Command(ph.self)
	cmd.Env = append(os.Environ(), workerEnv+"="+string(spec))
	cmd.Stderr = ph.stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		w.closeRouter()
		return 0, err
	}
	ph.col.workerStarted(id, time.Now())
	if err := cmd.Start(); err != nil {
		w.closeRouter()
		return 0, fmt.Errorf("start worker %d: %w", id, err)
	}
	w.cmd = cmd
	ph.mu.Lock()
	ph.procs[id] = w
	ph.mu.Unlock()
	go func() {
		defer close(w.done)
		defer w.closeRouter()
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

func (w *workerProc) closeRouter() {
	if w.router != nil {
		_ = w.router.Close()
	}
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
