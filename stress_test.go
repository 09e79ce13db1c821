//go:build stress

package lockreg_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/lockreg/lockreg"
	"github.com/lockreg/lockreg/internal/redistest"
)

// TestStress takes keys every way the public API offers, from several
// registries on one real redis-server, while a disturber deletes,
// overwrites and forces open held keys, cancels waits, flushes and
// restarts the server, and closes registries and starts new ones; the
// checker (stress_check_test.go) judges mutual exclusion, the loss news
// and fencing tokens. `make stress` runs it; STRESS_SEED replays a run's
// choices (not its interleaving, which is the scheduler's), STRESS_DUR,
// STRESS_WORKERS, STRESS_KEYS and STRESS_REGISTRIES size it.
func TestStress(t *testing.T) {
	cfg := stressConfigFromEnv(t)
	t.Logf("seed %d (STRESS_SEED=%d to replay its choices), %v, %d workers, %d keys, %d registries",
		cfg.seed, cfg.seed, cfg.dur, cfg.workers, cfg.keys, cfg.registries)
	// Registered first, so that it runs last: after the registries, their
	// clients and the server are gone.
	leaks := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, leaks) })

	e := &stressEnv{t: t, cfg: cfg, srv: redistest.Start(t), ns: fmt.Sprintf("stress-%d", cfg.seed),
		counts: make(map[string]int), cancels: make([]atomic.Pointer[context.CancelFunc], cfg.workers)}
	e.admin = e.srv.Client(t)
	for i := range cfg.keys {
		e.keys = append(e.keys, fmt.Sprintf("k%d", i))
	}
	e.chk = newChecker(cfg.seed, e.keys)
	setup := rand.New(rand.NewPCG(cfg.seed, 0))
	for range cfg.registries {
		e.slots = append(e.slots, e.newRegistry(setup))
	}
	e.until = time.Now().Add(cfg.dur)
	var wg sync.WaitGroup
	for w := range cfg.workers {
		wg.Go(func() { e.work(w, rand.New(rand.NewPCG(cfg.seed, uint64(w)+1))) })
	}
	e.disturb(rand.New(rand.NewPCG(cfg.seed, 1<<32)))
	wg.Wait()
	for _, r := range e.slots { // the others were checked as they were replaced
		e.checkTracking(r)
	}
	for _, r := range e.made {
		e.checkErr("Close", r.r.Close())
	}
	e.report(e.chk.finish())
}

type stressConfig struct {
	seed                      uint64
	dur                       time.Duration
	workers, keys, registries int
}

func stressConfigFromEnv(t *testing.T) stressConfig {
	cfg := stressConfig{seed: rand.Uint64(), dur: time.Minute, workers: 24, keys: 6, registries: 4}
	env := func(name string, parse func(string) error) {
		if v := os.Getenv(name); v != "" {
			if err := parse(v); err != nil {
				t.Fatalf("%s=%q: %v", name, v, err)
			}
		}
	}
	positive := func(n *int) func(string) error {
		return func(v string) (err error) {
			if *n, err = strconv.Atoi(v); err == nil && *n < 1 {
				err = errors.New("not positive")
			}
			return err
		}
	}
	env("STRESS_SEED", func(v string) (err error) { cfg.seed, err = strconv.ParseUint(v, 10, 64); return err })
	env("STRESS_DUR", func(v string) (err error) { cfg.dur, err = time.ParseDuration(v); return err })
	env("STRESS_WORKERS", positive(&cfg.workers))
	env("STRESS_KEYS", positive(&cfg.keys))
	env("STRESS_REGISTRIES", positive(&cfg.registries))
	// DoAll takes two or three distinct keys.
	cfg.keys = max(cfg.keys, 3)
	return cfg
}

// stressRegistry is one registry, as one process would have it, on a
// client of its own.
type stressRegistry struct {
	id    int
	r     *lockreg.Registry
	lease time.Duration
	made  time.Time
}

type stressEnv struct {
	t     *testing.T
	cfg   stressConfig
	srv   *redistest.Server
	admin *redis.Client
	ns    string
	keys  []string
	chk   *stressChecker
	until time.Time
	// cancels holds each worker's current acquisition's cancel, for the
	// disturber to call.
	cancels []atomic.Pointer[context.CancelFunc]

	mu     sync.Mutex
	slots  []*stressRegistry // the registries in use; slot 0 is never replaced
	made   []*stressRegistry
	counts map[string]int
}

func (e *stressEnv) count(what string) {
	e.mu.Lock()
	e.counts[what]++
	e.mu.Unlock()
}

// newRegistry makes a registry with options drawn from rng: a lease of 1
// to 3s (renewed every third of it), local hand-offs as by default, fewer
// or none, and now and then no pub/sub.
func (e *stressEnv) newRegistry(rng *rand.Rand) *stressRegistry {
	e.mu.Lock()
	s := &stressRegistry{id: len(e.made), made: time.Now(), lease: []time.Duration{time.Second, 1500 * time.Millisecond, 2 * time.Second, 3 * time.Second}[rng.IntN(4)]}
	e.made = append(e.made, s)
	e.mu.Unlock()
	opts := []lockreg.Option{
		lockreg.WithLogger(slog.New(slog.DiscardHandler)), lockreg.WithExpireAfter(s.lease),
		lockreg.WithRetryInterval(time.Duration(10+rng.IntN(90)) * time.Millisecond), lockreg.WithOwner(fmt.Sprintf("stress-%d", s.id)),
	}
	switch rng.IntN(3) {
	case 1:
		opts = append(opts, lockreg.WithLocalHandoff(0, 0))
	case 2:
		opts = append(opts, lockreg.WithLocalHandoff(4, 50*time.Millisecond))
	}
	if rng.IntN(5) == 0 {
		opts = append(opts, lockreg.WithPubSub(false))
	}
	r, err := lockreg.New(e.srv.Client(e.t), e.ns, opts...)
	if err != nil {
		e.t.Fatalf("seed %d: New: %v", e.cfg.seed, err)
	}
	r.AddHooks(e.chk.hooks(s.id))
	s.r = r
	return s
}

func (e *stressEnv) pick(rng *rand.Rand) *stressRegistry {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.slots[rng.IntN(len(e.slots))]
}

// The package's sentinels: those a run may meet, and those it cannot, as
// it passes no bad input, waits for no replica, and its server does not
// evict.
var (
	sentinels  = []error{lockreg.ErrNotObtained, lockreg.ErrNotHeld, lockreg.ErrLockLost, lockreg.ErrClosed, lockreg.ErrRedis}
	impossible = []error{lockreg.ErrInvalidOption, lockreg.ErrInvalidKey, lockreg.ErrInvalidArgument, lockreg.ErrNotReplicated, lockreg.ErrServerEvicts}
)

// checkErr checks that err is nil or wraps a sentinel the run may meet.
func (e *stressEnv) checkErr(op string, err error) {
	if err == nil {
		return
	}
	is := func(s error) bool { return errors.Is(err, s) }
	i := slices.IndexFunc(sentinels, is)
	switch {
	case slices.ContainsFunc(impossible, is):
		e.chk.violation("%s returned an error this test cannot cause: %v", op, err)
	case i >= 0:
		e.count("error " + op + ": " + strings.TrimPrefix(sentinels[i].Error(), "lockreg: "))
	default:
		e.chk.violation("%s returned an error that wraps none of the package's sentinels: %v", op, err)
	}
}

func (e *stressEnv) work(w int, rng *rand.Rand) {
	defer func() {
		if p := recover(); p != nil {
			e.chk.violation("worker %d panicked: %v\n%s", w, p, debug.Stack())
		}
	}()
	for time.Now().Before(e.until) {
		reg, key := e.pick(rng), e.keys[rng.IntN(len(e.keys))]
		switch x := rng.IntN(100); {
		case x < 18:
			e.viaAcquire(w, rng, reg, key)
		case x < 28:
			e.slots[0].viaLocker(e, w, rng, key, "Lock") // slot 0 never closes: Lock would block for good
		case x < 40:
			reg.viaLocker(e, w, rng, key, "TryLock")
		case x < 58:
			reg.viaLocker(e, w, rng, key, "LockContext")
		case x < 80:
			e.viaDo(w, rng, reg, []string{key})
		default:
			keys := slices.Clone(e.keys)
			rng.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
			e.viaDo(w, rng, reg, keys[:2+rng.IntN(2)])
		}
		if rng.IntN(4) == 0 {
			time.Sleep(time.Duration(rng.Int64N(int64(2 * time.Millisecond))))
		}
	}
}

// opCtx is an acquisition's context: mostly a deadline long enough to
// wait out a holder, sometimes one of a few ms; the disturber may cancel
// it.
func (e *stressEnv) opCtx(w int, rng *rand.Rand) (context.Context, context.CancelFunc) {
	d := time.Duration(50+rng.IntN(1500)) * time.Millisecond
	if rng.IntN(10) < 3 {
		d = time.Duration(2+rng.IntN(30)) * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	e.cancels[w].Store(&cancel)
	return ctx, func() { e.cancels[w].Store(nil); cancel() }
}

// releaseCtx is a release's context: now and then one that has ended
// already, which must not stop the release.
func releaseCtx(rng *rand.Rand) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	if rng.IntN(10) == 0 {
		cancel()
	}
	return ctx, cancel
}

// hold works under h: a token now and then, and a while, mostly short,
// now and then past the lease so that renewal must keep it.
func (e *stressEnv) hold(rng *rand.Rand, h *stressHold, lost <-chan struct{}, token func(context.Context) (int64, error)) {
	if rng.IntN(5) < 2 {
		e.drawToken(h, token)
	}
	var d time.Duration
	switch x := rng.IntN(1000); {
	case x < 600:
		d = time.Duration(rng.Int64N(int64(time.Millisecond)))
	case x < 900:
		d = time.Duration(1+rng.IntN(9)) * time.Millisecond
	case x < 997:
		d = time.Duration(10+rng.IntN(40)) * time.Millisecond
	default:
		d = h.lease/2 + time.Duration(rng.Int64N(int64(h.lease)))
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-lost:
		if rng.IntN(2) == 0 { // a holder that stops at once, or one that finishes blind
			<-timer.C
		}
	}
	if rng.IntN(10) == 0 {
		e.drawToken(h, token)
	}
}

func (e *stressEnv) drawToken(h *stressHold, token func(context.Context) (int64, error)) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	t, err := token(ctx)
	switch {
	case err == nil:
		e.chk.tokenDrawn(h, t)
	case errors.Is(err, lockreg.ErrLockLost):
		e.chk.told(h, time.Now(), "token")
	}
	e.checkErr("Token", err)
}

func (e *stressEnv) viaAcquire(w int, rng *rand.Rand, reg *stressRegistry, key string) {
	h := e.chk.begin(key, reg.id, "Acquire", reg.lease)
	ctx, cancel := e.opCtx(w, rng)
	held, err := reg.r.Obtain(key).Acquire(ctx)
	cancel()
	e.checkErr("Acquire", err)
	if err != nil {
		return
	}
	e.count("acquired Acquire")
	e.chk.enter(h, held.Lost())
	e.hold(rng, h, held.Lost(), held.Token)
	e.chk.exit(h)
	rctx, rcancel := releaseCtx(rng)
	defer rcancel()
	if rng.IntN(4) == 0 { // any goroutine may release a Hold
		inGoroutine(func() { err = held.Release(rctx) })
	} else {
		err = held.Release(rctx)
	}
	e.checkErr("Release", err)
	e.chk.released(h, err, held.Err())
	if !isClosedChan(held.Done()) || held.Err() == nil {
		e.chk.violation("hold %d of key %s: Done open or Err nil after its Release returned %v", h.id, key, err)
	}
	if err := held.Release(rctx); !errors.Is(err, lockreg.ErrNotHeld) {
		e.chk.violation("hold %d of key %s: a second Release returned %v, not ErrNotHeld", h.id, key, err)
	}
}

// viaLocker holds key for the calling goroutine, by Lock, TryLock or
// LockContext, now and then reentrantly.
func (reg *stressRegistry) viaLocker(e *stressEnv, w int, rng *rand.Rand, key, way string) {
	l := reg.r.Obtain(key)
	h := e.chk.begin(key, reg.id, way, reg.lease)
	switch way {
	case "Lock":
		l.Lock()
	case "TryLock":
		if !l.TryLock() {
			e.count("busy TryLock")
			return
		}
	default:
		ctx, cancel := e.opCtx(w, rng)
		err := l.LockContext(ctx)
		cancel()
		e.checkErr("LockContext", err)
		if err != nil {
			return
		}
	}
	e.count("acquired " + way)
	lost := l.Lost()
	e.chk.enter(h, lost)
	if rng.IntN(3) == 0 {
		ctx, cancel := e.opCtx(w, rng)
		err := l.LockContext(ctx) // the goroutine's own hold: at once
		cancel()
		if err == nil {
			e.count("reentrant " + way)
			e.hold(rng, h, lost, l.Token)
			l.Unlock() // the inner level: no Redis, no error to see
		} else if !errors.Is(err, lockreg.ErrNotObtained) || !errors.Is(err, lockreg.ErrLockLost) {
			e.chk.violation("hold %d of key %s: a reentrant LockContext failed with %v, not ErrNotObtained and ErrLockLost", h.id, key, err)
		}
	}
	e.hold(rng, h, lost, l.Token)
	e.chk.exit(h)
	rctx, rcancel := releaseCtx(rng)
	defer rcancel()
	err := l.UnlockContext(rctx)
	e.checkErr("UnlockContext", err)
	e.chk.released(h, err, nil)
}

// viaDo holds keys by Do (one key) or DoAll, now and then with a Do nested
// in fn through its context.
func (e *stressEnv) viaDo(w int, rng *rand.Rand, reg *stressRegistry, keys []string) {
	way := "Do"
	if len(keys) > 1 {
		way = "DoAll"
	}
	holds := make(map[string]*stressHold)
	for _, k := range keys {
		holds[k] = e.chk.begin(k, reg.id, way, reg.lease)
	}
	held := make(map[string]*lockreg.Hold)
	fn := func(ctx context.Context) error {
		for _, k := range keys {
			held[k] = reg.r.HoldFor(ctx, k)
			e.chk.enter(holds[k], held[k].Lost())
		}
		first := keys[0]
		if rng.IntN(4) == 0 {
			err := reg.r.Do(ctx, first, func(context.Context) error { return nil })
			e.checkErr("nested Do", err)
			if err == nil {
				e.count("reentrant " + way)
			}
		}
		for _, k := range keys[1:] {
			if rng.IntN(3) == 0 {
				e.drawToken(holds[k], held[k].Token)
			}
		}
		e.hold(rng, holds[first], ctx.Done(), held[first].Token)
		for _, k := range keys {
			e.chk.exit(holds[k])
		}
		return nil
	}
	ctx, cancel := e.opCtx(w, rng)
	var err error
	if way == "Do" {
		err = reg.r.Do(ctx, keys[0], fn)
	} else {
		err = reg.r.DoAll(ctx, keys, fn)
	}
	cancel()
	e.checkErr(way, err)
	if len(held) == 0 {
		return // fn did not run
	}
	e.count("acquired " + way)
	for _, k := range keys {
		e.chk.released(holds[k], err, held[k].Err())
	}
}

// disturb injects disturbances at random moments until the run ends.
func (e *stressEnv) disturb(rng *rand.Rand) {
	ctx := context.Background()
	var lastReplace, lastRestart, lastFlush, lastPause time.Time
	for time.Now().Before(e.until) {
		time.Sleep(time.Duration(10+rng.IntN(140)) * time.Millisecond)
		key := e.chk.heldKey(rng, e.keys)
		lk := e.ns + ":{" + key + "}" // the library's key scheme, for keys without braces or '%'
		switch x := rng.IntN(100); {
		case x < 22:
			d := e.chk.disturb("del", key, -1)
			n, err := e.admin.Del(ctx, lk).Result()
			e.adminDone(d, "del", err, n > 0)
		case x < 38:
			d := e.chk.disturb("overwrite", key, -1)
			was, err := e.admin.SetArgs(ctx, lk, "stress-admin", redis.SetArgs{TTL: time.Duration(50+rng.IntN(250)) * time.Millisecond, Get: true}).Result()
			if errors.Is(err, redis.Nil) {
				err = nil
			}
			e.adminDone(d, "overwrite", err, was != "" && was != "stress-admin")
		case x < 58:
			e.force(ctx, rng, key)
		case x < 85:
			if c := e.cancels[rng.IntN(len(e.cancels))].Load(); c != nil {
				(*c)()
				e.count("disturbance cancel")
			}
		case x < 88 && time.Since(lastFlush) > 5*time.Second:
			lastFlush = time.Now()
			d := e.chk.disturb("flush", "", -1)
			e.adminDone(d, "flush", e.admin.FlushAll(ctx).Err(), true)
		case x < 91 && time.Since(lastPause) > 3*time.Second:
			// A stall shorter than a renewal interval changes no key: every
			// hold must survive it, and any overlap across it is a
			// violation. Calls whose callers left meanwhile land late.
			lastPause = time.Now()
			e.srv.Pause(e.t)
			time.Sleep(time.Duration(20+rng.IntN(230)) * time.Millisecond)
			e.srv.Resume(e.t)
			e.count("disturbance pause")
		case x < 97 && time.Since(lastReplace) > 2*time.Second && len(e.slots) > 1:
			lastReplace = time.Now()
			e.replace(rng)
		case x >= 97 && time.Since(lastRestart) > 10*time.Second:
			lastRestart = time.Now()
			d := e.chk.disturb("restart", "", -1)
			e.srv.Stop(e.t)
			time.Sleep(time.Duration(rng.IntN(200)) * time.Millisecond)
			err := e.srv.Relaunch()
			e.chk.done(d, true, true)
			e.count("disturbance restart")
			if err != nil {
				e.chk.violation("the server did not come back: %v", err)
				return
			}
		}
	}
}

// force forces key open as an operator would: whoever holds it, or only
// the holder Inspect showed.
func (e *stressEnv) force(ctx context.Context, rng *rand.Rand, key string) {
	reg := e.pick(rng).r
	if rng.IntN(2) == 0 {
		d := e.chk.disturb("force", key, -1)
		freed, err := reg.ForceUnlock(ctx, key)
		e.checkErr("ForceUnlock", err)
		e.adminDone(d, "force", err, freed)
		return
	}
	info, err := reg.Inspect(ctx, key)
	e.checkErr("Inspect", err)
	if err != nil || !info.Held {
		return
	}
	d := e.chk.disturb("force", key, -1)
	freed, err := reg.ForceUnlockHeldBy(ctx, key, info.OwnerID)
	e.checkErr("ForceUnlockHeldBy", err)
	e.adminDone(d, "force", err, freed)
}

// adminDone ends disturbance d: changed says that it freed or took a
// held key. A command that failed may have run or not: it explains
// overlaps, but strikes no holder.
func (e *stressEnv) adminDone(d *disturbance, kind string, err error, changed bool) {
	e.chk.done(d, changed || err != nil, err == nil)
	if err != nil {
		e.t.Logf("seed %d: the %s of key %q failed: %v", e.cfg.seed, kind, d.key, err)
	}
	e.count(fmt.Sprintf("disturbance %s (changed %v)", kind, changed))
}

// replace closes or shuts down a registry in use and puts a new one in
// its place, as a redeployed process would.
func (e *stressEnv) replace(rng *rand.Rand) {
	fresh := e.newRegistry(rng)
	e.mu.Lock()
	slot := 1 + rng.IntN(len(e.slots)-1)
	old := e.slots[slot]
	e.slots[slot] = fresh
	e.mu.Unlock()
	e.checkTracking(old)
	if rng.IntN(2) == 0 {
		d := e.chk.disturb("close", "", old.id)
		e.checkErr("Close", old.r.Close())
		e.chk.done(d, true, true)
		e.count("disturbance close")
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(10+rng.IntN(300))*time.Millisecond)
	defer cancel()
	d := e.chk.disturb("shutdown", "", old.id)
	e.checkErr("Shutdown", old.r.Shutdown(ctx))
	e.chk.done(d, true, true)
	e.count("disturbance shutdown")
}

func (e *stressEnv) report(j judgement) {
	t := e.t
	names := make([]string, 0, len(e.counts))
	for name := range e.counts {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		t.Logf("%-52s %8d", name, e.counts[name])
	}
	t.Logf("holds taken by their own attempt %d, by a grant %d, by a local hand-off %d",
		e.chk.pathCount[lockreg.PathRedis], e.chk.pathCount[lockreg.PathGrant], e.chk.pathCount[lockreg.PathHandoff])
	t.Logf("tokens drawn %d; overlaps %d: %d after a disturbance, %d after a lease ran out, %d whose holder's release failed in Redis",
		e.chk.tokens, j.overlaps, j.explained, j.expired, j.cutShort)
	t.Logf("blind overlap (a disturbance freed the key, another took it, the stale holder not told yet): %s", spread(j.blindOverlap))
	kinds := make([]string, 0, len(j.blind))
	for kind := range j.blind {
		kinds = append(kinds, kind)
	}
	slices.Sort(kinds)
	for _, kind := range kinds {
		t.Logf("holders struck by a %s, told after: %s", kind, spread(j.blind[kind]))
	}
	t.Logf("how they were told (disturbance:cause/by): %v", j.causes)
	t.Logf("violations: %d (seed %d)", len(e.chk.violations), e.cfg.seed)
	for i, v := range e.chk.violations {
		if i == 20 {
			t.Errorf("... and %d more", len(e.chk.violations)-i)
			break
		}
		t.Error(v)
	}
}

// spread summarizes durations: how many, their median and their maximum.
func spread(d []time.Duration) string {
	if len(d) == 0 {
		return "none"
	}
	s := slices.Sorted(slices.Values(d))
	return fmt.Sprintf("n %d, p50 %v, max %v", len(s), s[(len(s)-1)/2].Round(time.Microsecond), s[len(s)-1].Round(time.Microsecond))
}

func inGoroutine(fn func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	<-done
}
