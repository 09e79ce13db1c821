//go:build linux

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockreg/lockreg"
	"github.com/redis/go-redis/v9"
)

// workerEnv carries a worker's configuration, as JSON; its presence makes
// the binary a worker instead of the checker.
const workerEnv = "LOCKCHECK_WORKER"

// maxHandoffs is the library's default bound on local hand-offs in a row
// (WithLocalHandoff), each of which raises the token by one.
const maxHandoffs = 16

// workerConfig is a worker's configuration. It travels to the worker as
// JSON in workerEnv, so its fields stay exported.
type workerConfig struct {
	ID       int
	Topology string
	// LockAddrs are the lock Redis's addresses: the server's, the
	// Sentinels' or the cluster nodes'.
	LockAddrs []string
	// Servers are the lock Redis's servers, whatever their roles.
	Servers []string
	// Router is the worker's fault proxy ("": the worker dials Redis
	// directly).
	Router       string
	WaitReplicas int
	StoreAddr    string
	Registry     string
	Keys         []string
	Goroutines   int
	Until        time.Time // the run ends
	Lease        time.Duration
	Retry        time.Duration
	Wait         time.Duration
	Work         time.Duration
	Long         float64 // the share of critical sections that pause 0.5 to 1.5 leases
	Seed         uint64
	// EvictionAllowed: the lock Redis may evict keys (the evict fault),
	// which the registry accepts (WithEvictionAllowed).
	EvictionAllowed bool
}

// storeRecord is the fenced store's record for key.
func storeRecord(registry, key string) string { return "lockcheck:store:" + registry + ":" + key }

// runWorker is a worker process: one registry, as a service would have,
// shared by Goroutines goroutines that take random keys until the run
// ends. It reports on stdout, one JSON event a line, each written before
// the worker goes on, so that a kill -9 loses nothing it has done.
func runWorker(spec string) int {
	var cfg workerConfig
	if err := json.Unmarshal([]byte(spec), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "lockcheck worker:", err)
		return 2
	}
	redis.SetLogger(quietRedis{})
	out := &emitter{w: bufio.NewWriter(os.Stdout)}
	leases := newLeaseTracker(cfg.Registry, cfg.Keys, out)
	lockClient := newLockClient(cfg, cfg.Router, leases)
	addHook(lockClient, leases)
	defer lockClient.Close()
	storeClient := redis.NewClient(&redis.Options{Addr: cfg.StoreAddr})
	defer storeClient.Close()
	// Faults make the library log every retry; the history says more.
	opts := []lockreg.Option{
		lockreg.WithExpireAfter(cfg.Lease), lockreg.WithRetryInterval(cfg.Retry),
		lockreg.WithLogger(slog.New(slog.DiscardHandler)),
	}
	if cfg.WaitReplicas > 0 {
		opts = append(opts, lockreg.WithWaitReplicas(cfg.WaitReplicas, cfg.Retry))
	}
	if cfg.EvictionAllowed {
		opts = append(opts, lockreg.WithEvictionAllowed())
	}
	reg, err := lockreg.New(lockClient, cfg.Registry, opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "lockcheck worker:", err)
		return 2
	}
	losses := &lossLog{last: make(map[string]lossNote)}
	reg.AddHooks(lockreg.Hooks{Lost: losses.record, AcquireDone: tellPath})
	// The tracker's subscriptions bypass the router: a network fault is
	// for the library's connections, and a grant message it held back
	// would leave the hold it explains unexplained.
	stopWatching, err := leases.watchGrants(cfg.Servers, cfg.Registry)
	if err != nil {
		fmt.Fprintln(os.Stderr, "lockcheck worker:", err)
		return 2
	}
	defer stopWatching()
	w := &worker{cfg: cfg, reg: reg, store: storeClient, leases: leases, losses: losses, out: out}
	runs := make([]goroutineRun, cfg.Goroutines)
	var wg sync.WaitGroup
	for g := range runs {
		wg.Go(func() { runs[g] = w.loop(g) })
	}
	wg.Wait()
	w.judging.Wait()
	_ = reg.Close()
	out.emit(event{E: "done", Goroutines: runs, LostUnlocks: int(w.lostUnlocks.Load()), NoTokens: int(w.noTokens.Load()), LateCredits: int(w.lateCredits.Load())})
	return 0
}

type worker struct {
	cfg         workerConfig
	reg         *lockreg.Registry
	store       *redis.Client
	leases      *leaseTracker
	losses      *lossLog
	out         *emitter
	lostUnlocks atomic.Int64
	noTokens    atomic.Int64
	// judging counts the holds being judged in the background
	// (missedGrant); lateCredits, those it credited.
	judging     sync.WaitGroup
	lateCredits atomic.Int64
}

func (w *worker) loop(g int) goroutineRun {
	run := goroutineRun{G: g}
	rng := rand.New(rand.NewPCG(w.cfg.Seed, uint64(w.cfg.ID)<<32|uint64(g)))
	for {
		acq := time.Now()
		if !acq.Before(w.cfg.Until) {
			return run
		}
		if run.First == 0 {
			run.First = acq.UnixNano()
		}
		key := w.cfg.Keys[rng.IntN(len(w.cfg.Keys))]
		lock := w.reg.Obtain(key)
		deadline, cut := acq.Add(w.cfg.Wait), false
		if deadline.After(w.cfg.Until) {
			deadline, cut = w.cfg.Until, true
		}
		path := new(lockreg.Path)
		ctx, cancel := context.WithDeadline(context.WithValue(context.Background(), pathKey{}, path), deadline)
		err := lock.LockContext(ctx)
		cancel()
		switch {
		case err == nil:
			run.Acquisitions++
			w.critical(g, lock, acq.UnixNano(), *path, rng)
		case !errors.Is(err, context.DeadlineExceeded):
			w.out.emit(event{E: "error", Msg: fmt.Sprintf("goroutine %d: LockContext(%s): %v", g, key, err)})
		case !cut:
			w.out.emit(event{E: "timeout", G: g, Key: key, Acq: acq.UnixNano(), At: time.Now().UnixNano()})
		}
	}
}

// critical is the critical section: a read-modify-write increment of the
// key's record in the fenced store, with a pause between read and write
// in which a stale holder's write could overtake a newer holder's.
func (w *worker) critical(g int, lock *lockreg.Lock, acq int64, path lockreg.Path, rng *rand.Rand) {
	ctx := context.Background()
	enter := time.Now().UnixNano()
	key, lost := lock.Key(), lock.Lost()
	token, err := lock.Token(ctx)
	if err != nil {
		// Lost before the token was drawn, or Redis failing: the hold has
		// no token to fence its writes with, so it makes none.
		if !errors.Is(err, lockreg.ErrLockLost) && !errors.Is(err, lockreg.ErrRedis) {
			w.out.emit(event{E: "error", Msg: fmt.Sprintf("goroutine %d: Token(%s): %v", g, key, err)})
		}
		w.noTokens.Add(1)
		w.leases.note(key, "a hold got no token: %v", err)
		if errors.Is(err, lockreg.ErrLockLost) {
			// Told, at the start: a key fault's analysis needs it if the
			// hold was handed off from one the fault struck (blindtime.go).
			told := time.Now().UnixNano()
			w.out.emit(event{E: "notoken", G: g, Key: key, Acq: acq, At: enter, Lost: told, Cause: w.losses.since(key, acq), Handoff: path == lockreg.PathHandoff})
		}
		w.unlock(ctx, lock)
		return
	}
	root, ok := w.leases.rootOf(key, token)
	if !ok {
		w.judging.Go(func() {
			if w.leases.missedGrant(key, token, root.after, gapWait) {
				w.lateCredits.Add(1)
			} else {
				w.out.emit(event{E: "error", Msg: fmt.Sprintf("goroutine %d holds %s with token %d, which no obtain call or grant the worker saw explains (last: %d); %s", g, key, token, w.leases.lastToken(key), w.leases.historyOf(key))})
			}
		})
	}
	w.out.emit(event{E: "enter", G: g, Key: key, Token: token, Fresh: root.fresh, Acq: acq, At: enter, Root: root.sent, RootLease: root.lease, RenewedFrom: root.renewedFrom})

	var lostAt atomic.Int64
	stop, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-lost:
			lostAt.Store(time.Now().UnixNano())
		case <-stop:
		}
	}()

	record := storeRecord(w.cfg.Registry, key)
	ev := event{E: "exit", G: g}
	var value int64
	ev.Read.Sent = time.Now().UnixNano()
	value, ev.Read.Outcome = storeRead(ctx, w.store, record, token)
	ev.Read.Done = time.Now().UnixNano()
	if ev.Read.Outcome == storeAccepted {
		switch {
		case rng.Float64() < w.cfg.Long:
			time.Sleep(w.cfg.Lease/2 + time.Duration(rng.Int64N(int64(w.cfg.Lease))))
		case w.cfg.Work > 0:
			time.Sleep(time.Duration(rng.Int64N(int64(2 * w.cfg.Work))))
		}
		ev.Value = value + 1
		ev.Write.Sent = time.Now().UnixNano()
		ev.Write.Outcome = storeWrite(ctx, w.store, record, token, ev.Value)
		ev.Write.Done = time.Now().UnixNano()
	}
	ev.At = time.Now().UnixNano()
	ev.Lost = lostAt.Load()
	w.out.emit(ev)

	// Lost may still fire while the unlock runs: the hold learns of the
	// loss then, which counts for an overlap as much as before.
	unlocked := w.unlock(ctx, lock)
	returned := time.Now().UnixNano()
	close(stop)
	<-watched
	late, cause := int64(0), ""
	if ev.Lost == 0 {
		late = lostAt.Load()
	}
	if lostAt.Load() != 0 {
		cause = w.losses.since(key, acq)
	}
	w.out.emit(event{E: "unlock", G: g, Unlock: unlocked, At: returned, Lost: late, Cause: cause})
}

// pathKey is the context key of an acquisition's *lockreg.Path, which
// tellPath, a registry hook, sets as the acquisition ends.
type pathKey struct{}

// tellPath records how an acquisition took its key, in the *lockreg.Path
// of its context. The registry calls it on the acquiring goroutine before
// LockContext returns.
func tellPath(ctx context.Context, e lockreg.AcquireEvent) {
	if p, ok := ctx.Value(pathKey{}).(*lockreg.Path); ok {
		*p = e.Path
	}
}

// lossLog keeps, by key, the last loss the registry's Lost hook reported.
// The hook runs right after the hold's Lost channel closed, on the
// goroutine that found the loss out.
type lossLog struct {
	mu   sync.Mutex
	last map[string]lossNote
}

type lossNote struct {
	cause string
	at    int64
}

func (l *lossLog) record(e lockreg.LossEvent) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.last[e.Key] = lossNote{cause: e.Cause.String(), at: time.Now().UnixNano()}
}

// since returns the cause of the last loss of key reported after from (a
// hold's LockContext call), waiting a little for the hook of a Lost that
// fired just now; "" if none came. Holds of a key in one registry follow
// one another, and a hold asks once it knows its Lost fired, by when the
// hook has run as a rule: the last loss reported is its own, or that of
// the hold it was handed off from, lost with it for the same cause.
func (l *lossLog) since(key string, from int64) string {
	for range 50 {
		l.mu.Lock()
		n := l.last[key]
		l.mu.Unlock()
		if n.at >= from {
			return n.cause
		}
		time.Sleep(time.Millisecond)
	}
	return ""
}

// unlock unlocks lock and tells how it went.
func (w *worker) unlock(ctx context.Context, lock *lockreg.Lock) unlocked {
	switch err := lock.UnlockContext(ctx); {
	case err == nil:
		return unlockOK
	case errors.Is(err, lockreg.ErrLockLost):
		w.lostUnlocks.Add(1)
		return unlockLost
	default:
		return unlockFailed
	}
}

// emitter writes events to the parent, one line each, flushed at once.
type emitter struct {
	mu sync.Mutex
	w  *bufio.Writer
}

func (e *emitter) emit(ev event) {
	line, err := json.Marshal(ev)
	if err != nil {
		panic(err) // every field is a plain value
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	_, _ = e.w.Write(append(line, '\n'))
	_ = e.w.Flush()
}
