package contenders

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockreg/lockreg/internal/redistest"
)

// redissonTestServer starts a private redis-server (internal/redistest) and
// returns its address; it stops when the test ends.
func redissonTestServer(t *testing.T) string {
	t.Helper()
	return redistest.Start(t).Addr()
}

// redissonTestClient is a plain client to look at the keys.
func redissonTestClient(t *testing.T, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { c.Close() })
	return c
}

func newTestRedisson(t *testing.T, addr string) Contender {
	t.Helper()
	c, err := Redisson.New(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestRedissonAcquireRelease(t *testing.T) {
	addr := redissonTestServer(t)
	rc := redissonTestClient(t, addr)
	c := newTestRedisson(t, addr)
	ctx := context.Background()

	if !c.Reentrant() {
		t.Fatal("Reentrant() = false")
	}
	release, err := c.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	fields, err := rc.HGetAll(ctx, "k").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(fields) != 1 {
		t.Fatalf("hash while held = %v, want one field", fields)
	}
	for f, v := range fields {
		if v != "1" {
			t.Fatalf("field %s = %s, want 1", f, v)
		}
	}
	pttl, err := rc.PTTL(ctx, "k").Result()
	if err != nil {
		t.Fatal(err)
	}
	if pttl <= 25*time.Second || pttl > 30*time.Second {
		t.Fatalf("PTTL while held = %v, want about 30s", pttl)
	}
	if err := release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := rc.Exists(ctx, "k").Val(); n != 0 {
		t.Fatalf("key exists after release")
	}
	if err := release(ctx); err == nil {
		t.Fatal("second release of one hold: no error")
	}
}

func TestRedissonReleaseNotHeld(t *testing.T) {
	addr := redissonTestServer(t)
	rc := redissonTestClient(t, addr)
	c := newTestRedisson(t, addr)
	ctx := context.Background()

	release, err := c.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	rc.Del(ctx, "k") // as if the lease had run out
	if err := release(ctx); !errors.Is(err, errRedissonNotHeld) {
		t.Fatalf("release of a lock gone: %v, want errRedissonNotHeld", err)
	}
}

func TestRedissonReentrant(t *testing.T) {
	addr := redissonTestServer(t)
	rc := redissonTestClient(t, addr)
	c := newTestRedisson(t, addr)
	ctx := context.Background()

	r1, err := c.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	r2, err := c.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	vals, err := rc.HVals(ctx, "k").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(vals) != 1 || vals[0] != "2" {
		t.Fatalf("hash values after two acquires = %v, want [2]", vals)
	}
	if err := r2(ctx); err != nil {
		t.Fatal(err)
	}
	vals = rc.HVals(ctx, "k").Val()
	if len(vals) != 1 || vals[0] != "1" {
		t.Fatalf("hash values after one release = %v, want [1]", vals)
	}
	if err := r1(ctx); err != nil {
		t.Fatal(err)
	}
	if n := rc.Exists(ctx, "k").Val(); n != 0 {
		t.Fatal("key exists after both releases")
	}
}

func TestRedissonMutualExclusion(t *testing.T) {
	addr := redissonTestServer(t)
	a := newTestRedisson(t, addr)
	b := newTestRedisson(t, addr)

	const goroutines, increments = 4, 50
	var (
		count   int // guarded by the Redis lock only
		inside  atomic.Int32
		overlap atomic.Int32
		wg      sync.WaitGroup
		errs    = make(chan error, 2*goroutines)
	)
	for _, c := range []Contender{a, b} {
		for range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range increments {
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					release, err := c.Acquire(ctx, "shared")
					if err != nil {
						cancel()
						errs <- err
						return
					}
					if inside.Add(1) > 1 {
						overlap.Add(1)
					}
					count++
					inside.Add(-1)
					err = release(ctx)
					cancel()
					if err != nil {
						errs <- err
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := overlap.Load(); n != 0 {
		t.Errorf("%d overlapping critical sections", n)
	}
	if want := 2 * goroutines * increments; count != want {
		t.Errorf("count = %d, want %d", count, want)
	}
}

// redissonWaitSubscribers waits until channel has n subscribers.
func redissonWaitSubscribers(t *testing.T, rc *redis.Client, channel string, n int64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := rc.PubSubNumSub(context.Background(), channel).Val()[channel]
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s has %d subscribers, want %d", channel, got, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// redissonPair starts a private server and returns a plain client of it and
// two contender instances, standing for two processes.
func redissonPair(t *testing.T) (*redis.Client, Contender, Contender) {
	t.Helper()
	addr := redissonTestServer(t)
	return redissonTestClient(t, addr), newTestRedisson(t, addr), newTestRedisson(t, addr)
}

func TestRedissonWaiterWakesOnPublish(t *testing.T) {
	rc, a, b := redissonPair(t)
	ctx := context.Background()

	releaseA, err := a.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		at      time.Time
		release func(context.Context) error
		err     error
	}
	done := make(chan result, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		release, err := b.Acquire(wctx, "k")
		done <- result{time.Now(), release, err}
	}()
	// B is waiting once it has subscribed.
	redissonWaitSubscribers(t, rc, redissonChannel("k"), 1)

	released := time.Now()
	if err := releaseA(ctx); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if res.err != nil {
		t.Fatalf("waiter: %v", res.err)
	}
	if d := res.at.Sub(released); d >= time.Second {
		t.Fatalf("waiter took %v after release, want well under the lease", d)
	}
	t.Logf("waiter acquired %v after release", res.at.Sub(released))
	if err := res.release(ctx); err != nil {
		t.Fatal(err)
	}
	// The last waiter gone, the subscription is closed.
	redissonWaitSubscribers(t, rc, redissonChannel("k"), 0)
}

func TestRedissonSharedSubscription(t *testing.T) {
	rc, a, b := redissonPair(t)
	ctx := context.Background()

	releaseA, err := a.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	const waiters = 5
	var wg sync.WaitGroup
	errs := make(chan error, waiters)
	for range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			release, err := b.Acquire(wctx, "k")
			if err == nil {
				time.Sleep(time.Millisecond)
				err = release(wctx)
			}
			errs <- err
		}()
	}
	// All of B's waiters share one subscription.
	redissonWaitSubscribers(t, rc, redissonChannel("k"), 1)
	time.Sleep(50 * time.Millisecond)
	if got := rc.PubSubNumSub(ctx, redissonChannel("k")).Val()[redissonChannel("k")]; got != 1 {
		t.Fatalf("%d subscriptions for %d waiters of one contender, want 1", got, waiters)
	}
	start := time.Now()
	if err := releaseA(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if d := time.Since(start); d >= 2*time.Second {
		t.Errorf("%d waiters took %v, want each woken by the previous release", waiters, d)
	}
	redissonWaitSubscribers(t, rc, redissonChannel("k"), 0)
}

func TestRedissonContextTimeout(t *testing.T) {
	addr := redissonTestServer(t)
	a := newTestRedisson(t, addr)
	b := newTestRedisson(t, addr)
	ctx := context.Background()

	releaseA, err := a.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer releaseA(ctx)

	wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	release, err := b.Acquire(wctx, "k")
	d := time.Since(start)
	if err == nil {
		release(ctx)
		t.Fatal("acquired a lock held elsewhere")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want context.DeadlineExceeded", err)
	}
	if d > time.Second {
		t.Fatalf("Acquire returned %v after start, want about 200ms", d)
	}

	// A done ctx fails at once.
	cctx, ccancel := context.WithCancel(ctx)
	ccancel()
	if _, err := b.Acquire(cctx, "other"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire with a cancelled ctx: %v", err)
	}
}

func TestRedissonWatchdogRenews(t *testing.T) {
	addr := redissonTestServer(t)
	rc := redissonTestClient(t, addr)
	r := newRedisson(addr, 300*time.Millisecond) // renewed every 100ms
	defer r.Close()
	ctx := context.Background()

	release, err := r.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // over three leases
	if n := rc.Exists(ctx, "k").Val(); n != 1 {
		t.Fatal("lock expired although held: the watchdog did not renew it")
	}
	if err := release(ctx); err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	held := len(r.held)
	r.mu.Unlock()
	if held != 0 {
		t.Fatalf("%d locks in the renewal set after release", held)
	}

	// A lock that vanished leaves the renewal set at the next renewal.
	if _, err := r.Acquire(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	rc.Del(ctx, "gone")
	deadline := time.Now().Add(2 * time.Second)
	for {
		r.mu.Lock()
		held = len(r.held)
		r.mu.Unlock()
		if held == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a vanished lock stays in the renewal set")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestRedissonNoGoroutineLeak(t *testing.T) {
	addr := redissonTestServer(t)
	ctx := context.Background()
	start := runtime.NumGoroutine()

	a, err := NewRedisson(addr)
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewRedisson(addr)
	if err != nil {
		t.Fatal(err)
	}
	// Contention on several keys, so that subscriptions come and go.
	var wg sync.WaitGroup
	for i := range 8 {
		c := a
		if i%2 == 1 {
			c = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 20 {
				actx, cancel := context.WithTimeout(ctx, 10*time.Second)
				release, err := c.Acquire(actx, fmt.Sprintf("k%d", j%3))
				if err == nil {
					err = release(actx)
				}
				cancel()
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	// One waiter still waiting at Close.
	hold, err := a.Acquire(ctx, "held")
	if err != nil {
		t.Fatal(err)
	}
	waiting := make(chan error, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		_, err := b.Acquire(wctx, "held")
		waiting <- err
	}()
	if err := <-waiting; err == nil {
		t.Fatal("acquired a lock held elsewhere")
	}
	_ = hold(ctx)

	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}

	deadline := time.Now().Add(5 * time.Second)
	for {
		n := runtime.NumGoroutine()
		if n <= start+2 {
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			t.Fatalf("%d goroutines after Close, %d before:\n%s", n, start, buf)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
