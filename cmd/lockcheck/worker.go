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
	"strconv"
	"strings"
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

type workerConfig struct {
	ID         int
	LockAddr   string
	StoreAddr  string
	Registry   string
	Keys       []string
	Goroutines int
	Until      time.Time // the run ends
	Lease      time.Duration
	Retry      time.Duration
	Wait       time.Duration
	Work       time.Duration
	Seed       uint64
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
	out := &emitter{w: bufio.NewWriter(os.Stdout)}
	leases := newLeaseTracker(cfg.Registry, cfg.Keys, out)
	// Odd workers' clients end their calls at the context's deadline
	// (ContextTimeoutEnabled), so that a run covers both ways an
	// acquisition waits for Redis: in a goroutine of its own, and, for a
	// first attempt that can, on the calling goroutine.
	lockClient := redis.NewClient(&redis.Options{Addr: cfg.LockAddr, ContextTimeoutEnabled: cfg.ID%2 == 1})
	lockClient.AddHook(leases)
	defer lockClient.Close()
	storeClient := redis.NewClient(&redis.Options{Addr: cfg.StoreAddr})
	defer storeClient.Close()
	// Faults make the library log every retry; the history says more.
	reg, err := lockreg.New(lockClient, cfg.Registry,
		lockreg.WithExpireAfter(cfg.Lease), lockreg.WithRetryInterval(cfg.Retry),
		lockreg.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		fmt.Fprintln(os.Stderr, "lockcheck worker:", err)
		return 2
	}
	stopWatching, err := leases.watchGrants(lockClient, cfg.Registry)
	if err != nil {
		fmt.Fprintln(os.Stderr, "lockcheck worker:", err)
		return 2
	}
	defer stopWatching()
	w := &worker{cfg: cfg, reg: reg, store: storeClient, leases: leases, out: out}
	runs := make([]GoroutineRun, cfg.Goroutines)
	var wg sync.WaitGroup
	for g := range runs {
		wg.Go(func() { runs[g] = w.loop(g) })
	}
	wg.Wait()
	_ = reg.Close()
	out.emit(event{E: "done", Goroutines: runs, LostUnlocks: int(w.lostUnlocks.Load()), NoTokens: int(w.noTokens.Load())})
	return 0
}

type worker struct {
	cfg         workerConfig
	reg         *lockreg.Registry
	store       *redis.Client
	leases      *leaseTracker
	out         *emitter
	lostUnlocks atomic.Int64
	noTokens    atomic.Int64
}

func (w *worker) loop(g int) GoroutineRun {
	run := GoroutineRun{G: g}
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
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		err := lock.LockContext(ctx)
		cancel()
		switch {
		case err == nil:
			run.Acquisitions++
			w.critical(g, lock, acq, rng)
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
func (w *worker) critical(g int, lock *lockreg.Lock, acq time.Time, rng *rand.Rand) {
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
		if err := lock.UnlockContext(ctx); errors.Is(err, lockreg.ErrLockLost) {
			w.lostUnlocks.Add(1)
		}
		return
	}
	root, ok := w.leases.rootOf(key, token)
	if !ok {
		w.out.emit(event{E: "error", Msg: fmt.Sprintf("goroutine %d holds %s with token %d, which no obtain call or grant the worker saw explains (last: %d); %s", g, key, token, w.leases.lastToken(key), w.leases.historyOf(key))})
	}
	w.out.emit(event{E: "enter", G: g, Key: key, Token: token, Fresh: root.fresh, Acq: acq.UnixNano(), At: enter, Root: root.sent, RootLease: root.lease})

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
	if ev.Read.Outcome == Accepted {
		if w.cfg.Work > 0 {
			time.Sleep(time.Duration(rng.Int64N(int64(2 * w.cfg.Work))))
		}
		ev.Value = value + 1
		ev.Write.Sent = time.Now().UnixNano()
		ev.Write.Outcome = storeWrite(ctx, w.store, record, token, ev.Value)
		ev.Write.Done = time.Now().UnixNano()
	}
	ev.At = time.Now().UnixNano()
	close(stop)
	<-watched
	ev.Lost = lostAt.Load()
	w.out.emit(ev)

	if err := lock.UnlockContext(ctx); errors.Is(err, lockreg.ErrLockLost) {
		w.lostUnlocks.Add(1)
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

// leaseTracker is a go-redis hook on the lock client that watches for the
// calls a hold's lease rests on, as the library counts it: the obtain
// call that took the key, the draw of its fencing token, and the renewals
// that extended it, each from when it was sent. Seeing them on
// the wire, rather than asking the library, keeps the checker independent
// of the library's own bookkeeping.
//
// A grant, a release that passed the key to this registry, is seen on the
// tracker's own subscription to the registries' grant channels. The tracker
// credits it only as the library's argument allows: it must carry a
// larger token than the last one the registry's latest failed attempt on
// the key reported, and its lease (the grant lease the attempt's mark
// asked for) counts from when that attempt was sent.
type leaseTracker struct {
	mu     sync.Mutex
	roots  map[string]root          // by key: the last obtain or grant that took it
	failed map[string]failedAttempt // by key: the latest failed attempt
	// granted is, by key, the token of the latest grant to this registry:
	// its message may come before the reply of the attempt it followed.
	granted map[string]int64
	keyOf   map[string]string // Redis key → key
	// clientID and grantLease are the registry's, read off its attempts.
	clientID   string
	grantLease time.Duration
	// resubscribed is when the tracker's subscription last came back
	// after its connection was lost (unix ns), 0 if never.
	resubscribed int64
	// history is, by key, what the tracker saw last, oldest first, for
	// the report of a hold it cannot explain.
	history map[string][]string
	out     *emitter
}

// historyLength is how many of its latest observations per key the
// tracker keeps.
const historyLength = 16

// saw records an observation about key. Called with mu held.
func (t *leaseTracker) saw(key, format string, args ...any) {
	h := append(t.history[key], time.Now().Format("15:04:05.000000 ")+fmt.Sprintf(format, args...))
	if len(h) > historyLength {
		h = h[len(h)-historyLength:]
	}
	t.history[key] = h
}

// historyOf reports what the tracker saw last about key, and when its
// subscription last came back.
func (t *leaseTracker) historyOf(key string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	resubscribed := "never"
	if t.resubscribed != 0 {
		resubscribed = time.Unix(0, t.resubscribed).Format("15:04:05.000000")
	}
	return fmt.Sprintf("tracker resubscribed: %s; its latest observations of %s: [%s]", resubscribed, key, strings.Join(t.history[key], "; "))
}

// root is what a hold rests on: the token its obtain or grant drew, when
// the call its lease counts from was sent, and that lease (0: the run's).
type root struct {
	token, sent int64
	lease       time.Duration
}

// failedAttempt is an obtain call that found the key taken, and the last
// token its reply carried (0: none).
type failedAttempt struct{ sent, lastToken int64 }

// explained is what rootOf tells about a hold.
type explained struct {
	sent  int64
	lease time.Duration
	fresh bool // the hold has the root's own token: not a local hand-off
}

func newLeaseTracker(registry string, keys []string, out *emitter) *leaseTracker {
	t := &leaseTracker{
		roots: make(map[string]root), failed: make(map[string]failedAttempt), granted: make(map[string]int64),
		keyOf: make(map[string]string), history: make(map[string][]string), out: out,
	}
	for _, k := range keys {
		// The library's key scheme for keys without braces or '%'.
		t.keyOf[registry+":{"+k+"}"] = k
	}
	return t
}

// rootOf returns the obtain or grant a hold with token rests on: its own,
// or, for a local hand-off (token one higher per hand-off), its registry's
// last. The library may hear of a grant before the tracker's subscription
// does, so an unexplained hold is looked at again for a second.
//
// A fault that kills connections can make the tracker's subscription miss
// a grant the library's received. So if the subscription came back after
// the latest failed attempt was sent, a hold whose token exceeds the last
// token that attempt reported is credited as that missed grant: it is what
// the message would have said (the fenced store checks the token anyway).
//
// The second is of the worker's running time: a stop fault that freezes
// the worker freezes the tracker's goroutine too, and the grant it has not
// read yet must not count as missed when the worker resumes.
func (t *leaseTracker) rootOf(key string, token int64) (explained, bool) {
	wait := newRunningWait(time.Second, time.Now())
	for ; ; time.Sleep(time.Millisecond) {
		over := wait.over(time.Now())
		t.mu.Lock()
		if f := t.failed[key]; over && t.resubscribed > f.sent {
			t.saw(key, "hold with token %d credited as a grant missed in a subscription gap", token)
			t.granted[key] = max(t.granted[key], token)
			t.credit(key)
		}
		r, d := t.roots[key], token-t.roots[key].token
		t.mu.Unlock()
		if r.token != 0 && d >= 0 && d <= maxHandoffs {
			return explained{sent: r.sent, lease: r.lease, fresh: d == 0}, true
		}
		if over {
			return explained{}, false
		}
	}
}

// stall is the longest step of a polling loop that counts as running time:
// a longer one means the process was stopped (or starved) meanwhile.
const stall = 100 * time.Millisecond

// runningWait is a wait of a given length counted in the process's running
// time, as far as a loop that checks it every millisecond or so can tell:
// steps longer than stall are left out.
type runningWait struct {
	left time.Duration
	last time.Time
}

func newRunningWait(d time.Duration, now time.Time) *runningWait {
	return &runningWait{left: d, last: now}
}

// over reports, at now, whether the wait is over.
func (w *runningWait) over(now time.Time) bool {
	if step := now.Sub(w.last); step < stall {
		w.left -= step
	}
	w.last = now
	return w.left <= 0
}

// watchGrants subscribes to the grant channels of registry's registries
// (<registry>:released:<client id>) and credits the grants they carry
// until stop is called. It returns once the subscription is open,
// so that it is open before the registry's first attempt.
func (t *leaseTracker) watchGrants(client *redis.Client, registry string) (stop func(), err error) {
	sub := client.PSubscribe(context.Background(), registry+":released:*")
	if _, err := sub.Receive(context.Background()); err != nil {
		_ = sub.Close()
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		// The first subscription was confirmed above: any later one is
		// go-redis resubscribing on a new connection.
		for msg := range sub.ChannelWithSubscriptions() {
			switch msg := msg.(type) {
			case *redis.Message:
				t.grant(msg.Payload)
			case *redis.Subscription:
				t.mu.Lock()
				t.resubscribed = time.Now().UnixNano()
				t.mu.Unlock()
			}
		}
	}()
	return func() { _ = sub.Close(); <-done }, nil
}

// grant credits a notification 'g<token>:<client id>:<key>' on a grant
// channel, if it grants a key to this registry after its latest
// failed attempt.
func (t *leaseTracker) grant(note string) {
	body, ok := strings.CutPrefix(note, "g")
	if !ok {
		return
	}
	tokenText, rest, _ := strings.Cut(body, ":")
	grantee, key, _ := strings.Cut(rest, ":")
	token, err := strconv.ParseInt(tokenText, 10, 64)
	if err != nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if grantee == "" || grantee != t.clientID {
		return
	}
	t.saw(key, "grant with token %d", token)
	t.granted[key] = max(t.granted[key], token)
	t.credit(key)
}

// credit makes the latest grant of key the root of its holds if it
// followed the latest failed attempt, whichever of the two was seen last,
// and no obtain took the key since that attempt: a grant whose message
// came late may have found the key taken by the registry's next attempt
// already, and the hold rests on that attempt. Called with mu held.
func (t *leaseTracker) credit(key string) {
	f, token, r := t.failed[key], t.granted[key], t.roots[key]
	if f.lastToken <= 0 || token <= f.lastToken || token < r.token || r.sent > f.sent || t.grantLease <= 0 {
		return
	}
	t.roots[key] = root{token: token, sent: f.sent, lease: t.grantLease}
	t.saw(key, "credited the grant with token %d", token)
}

// sawMark records the call that marked the registry as waiting for key
// (a failed attempt, or a release that passed the key on), with the
// registry's client id and mark ('<client id>:<grant lease ms>'), and
// credits a grant already seen. Called with mu held.
func (t *leaseTracker) sawMark(key string, f failedAttempt, clientID, mark string) {
	t.failed[key] = f
	t.clientID = clientID
	if _, ms, ok := strings.Cut(mark, ":"); ok {
		if n, err := strconv.Atoi(ms); err == nil {
			t.grantLease = time.Duration(n) * time.Millisecond
		}
	}
	t.credit(key)
}

func (t *leaseTracker) lastToken(key string) int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.roots[key].token
}

func (t *leaseTracker) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessPipelineHook sees the calls the library pipelines (concurrent
// acquisitions and releases beyond a few in flight, and each tick's
// renewals). Every call in a pipeline is sent no earlier than the pipeline.
func (t *leaseTracker) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		sent := time.Now().UnixNano()
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			if cmd.Err() == nil {
				t.observe(cmd, sent)
			}
		}
		return err
	}
}

func (t *leaseTracker) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		sent := time.Now().UnixNano()
		err := next(ctx, cmd)
		if err == nil {
			t.observe(cmd, sent)
		}
		return err
	}
}

// observe recognizes the library's calls by their shape: a plain SET of a
// lock key with NX takes it; obtain.lua takes four keys (lock, fence,
// waiting marker, queue) and five arguments (client id, lease, mark time,
// unmark, mark), the mark starting with the client id, and answers 1 when
// it took the key, or minus the last token when the key was taken
// (release.lua takes as many, and its fifth is the key; when it also
// takes the registry's mark, seventh of eight, and answers below zero, it
// passed the key on and marked the registry, as a failed attempt sent
// with it would have, with minus the grant's token); draw.lua takes
// two keys (lock, fence) and two arguments (client id, lease) and answers
// the hold's token; renew.lua takes the keys to renew and two arguments
// (client id, lease) and answers 1 or 0 per key. Were the calls to change
// shape, holds would go unexplained and the run would fail loudly.
func (t *leaseTracker) observe(cmd redis.Cmder, sent int64) {
	args := cmd.Args()
	if cmd.Name() == "set" && len(args) == 6 && fmt.Sprint(args[5]) == "nx" {
		if key, known := t.keyOf[fmt.Sprint(args[1])]; known {
			t.mu.Lock()
			t.roots[key] = root{sent: sent}
			t.saw(key, "SET NX took it")
			t.mu.Unlock()
		}
		return
	}
	if name := cmd.Name(); name != "evalsha" && name != "eval" {
		return
	}
	c, ok := cmd.(*redis.Cmd)
	// args: name, script, number of keys, keys..., arguments...
	if !ok || len(args) < 3 {
		return
	}
	n, ok := args[2].(int)
	if !ok || len(args) < 3+n {
		return
	}
	keys, argv := args[3:3+n], args[3+n:]
	switch {
	case n == 4 && len(argv) == 5 && strings.HasSuffix(fmt.Sprint(keys[1]), ":fence") &&
		strings.HasPrefix(fmt.Sprint(argv[4]), fmt.Sprint(argv[0])):
		reply, err := c.Int64()
		key, known := t.keyOf[fmt.Sprint(keys[0])]
		if err != nil || !known {
			return
		}
		t.mu.Lock()
		defer t.mu.Unlock()
		if reply > 0 {
			t.roots[key] = root{sent: sent}
			t.saw(key, "obtain.lua took it")
			return
		}
		t.saw(key, "obtain.lua failed and marked, last token %d", -reply)
		t.sawMark(key, failedAttempt{sent: sent, lastToken: -reply}, fmt.Sprint(argv[0]), fmt.Sprint(argv[4]))
	case n == 4 && len(argv) == 8 && strings.HasSuffix(fmt.Sprint(keys[1]), ":fence") &&
		strings.HasPrefix(fmt.Sprint(argv[6]), fmt.Sprint(argv[0])):
		reply, err := c.Int64()
		key, known := t.keyOf[fmt.Sprint(keys[0])]
		if err != nil || !known || reply >= 0 {
			return
		}
		t.mu.Lock()
		defer t.mu.Unlock()
		t.saw(key, "release granted it away with token %d and marked", -reply)
		t.sawMark(key, failedAttempt{sent: sent, lastToken: -reply}, fmt.Sprint(argv[0]), fmt.Sprint(argv[6]))
	case n == 2 && len(argv) == 2 && strings.HasSuffix(fmt.Sprint(keys[1]), ":fence"):
		// A token drawn for the hold the latest obtain began: only the
		// first draw of a hold, or of a run of local hand-offs, may come
		// from Redis. A draw for a hold whose root has a token already is
		// left unexplained.
		token, err := c.Int64()
		key, known := t.keyOf[fmt.Sprint(keys[0])]
		if err != nil || !known || token <= 0 {
			return
		}
		t.mu.Lock()
		if r := t.roots[key]; r.token == 0 && r.sent != 0 {
			r.token = token
			t.roots[key] = r
			t.saw(key, "drew token %d", token)
		} else {
			t.saw(key, "drew token %d for a root with token %d: unexplained", token, r.token)
		}
		t.mu.Unlock()
	case len(argv) == 2:
		renewed, err := c.Int64Slice()
		if err != nil || len(renewed) != n {
			return
		}
		done := time.Now().UnixNano() // observe runs once the reply is in
		for i, k := range keys {
			if key, known := t.keyOf[fmt.Sprint(k)]; known && renewed[i] == 1 {
				t.out.emit(event{E: "renew", Key: key, At: sent, Done: done})
			}
		}
	}
}
