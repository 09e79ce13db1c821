//go:build linux

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockreg/lockreg"
	"github.com/lockreg/lockreg/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestLeaseTrackerExplainsEveryHold runs the library as a worker does, with
// enough goroutines that it pipelines their calls, and checks that the
// tracker sees the obtain behind every hold and the renewals of a hold that
// outlasts a renewal interval. A change in how the library talks to Redis
// that hid them would blind the checker; this fails first.
func TestLeaseTrackerExplainsEveryHold(t *testing.T) {
	const registry, lease = "tracker", 300 * time.Millisecond
	keys := make([]string, 16)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", i)
	}
	var buf bytes.Buffer
	out := &emitter{w: bufio.NewWriter(&buf)}
	tracker := newLeaseTracker(registry, append([]string{"long"}, keys...), out)
	// The workers' client: the renewals on the tracking connection reach
	// the tracker through the wiretap, the other calls through the hook.
	client := newLockClient(workerConfig{Topology: topoSingle, LockAddrs: []string{redistest.Start(t).Addr()}}, "", tracker)
	defer client.Close()
	addHook(client, tracker)
	reg, err := lockreg.New(client, registry, lockreg.WithExpireAfter(lease), lockreg.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()

	var wg sync.WaitGroup
	wg.Go(func() {
		lock := reg.Obtain("long")
		lock.Lock()
		time.Sleep(2 * lease)
		lock.Unlock()
	})
	for g := range 32 {
		wg.Go(func() {
			for i := range 50 {
				lock := reg.Obtain(keys[(g+i)%len(keys)])
				lock.Lock()
				if _, ok := tracker.rootOf(lock.Key(), token(t, lock)); !ok {
					t.Errorf("no observed obtain explains %s with token %d (last %d)", lock.Key(), token(t, lock), tracker.lastToken(lock.Key()))
				}
				lock.Unlock()
			}
		})
	}
	wg.Wait()
	_ = reg.Close() // no more events

	renewed := false
	for line := range bytes.Lines(buf.Bytes()) {
		var ev event
		if err := json.Unmarshal(line, &ev); err != nil {
			t.Fatal(err)
		}
		renewed = renewed || (ev.E == "renew" && ev.Key == "long")
	}
	if !renewed {
		t.Errorf("no renewal seen of a key held for two leases:\n%s", buf.String())
	}
}

// TestLeaseTrackerCreditsGrants has a second registry's releases pass a key
// to a waiting registry, and checks that the tracker explains the granted
// holds by the grant, with the grant lease counted from the failed attempt
// before it: the lease the library counts.
func TestLeaseTrackerCreditsGrants(t *testing.T) {
	const registry = "grants"
	var buf bytes.Buffer
	tracker := newLeaseTracker(registry, []string{"k"}, &emitter{w: bufio.NewWriter(&buf)})
	srv := redistest.Start(t)
	client := srv.Client(t, tracker)
	stop, err := tracker.watchGrants([]string{srv.Addr()}, registry)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	waiter, err := lockreg.New(client, registry, lockreg.WithRetryInterval(time.Second), lockreg.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	defer waiter.Close()
	holder, err := lockreg.New(srv.Client(t), registry)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()

	for range 5 {
		held := holder.Obtain("k")
		held.Lock()
		failed, grants := waiter.Stats().FailedAttempts, waiter.Stats().Grants
		tokens, release := make(chan int64), make(chan struct{})
		go func() {
			lock := waiter.Obtain("k")
			if err := lock.LockContext(context.Background()); err != nil {
				close(tokens)
				return
			}
			tokens <- token(t, lock)
			<-release
			lock.Unlock()
		}()
		for waiter.Stats().FailedAttempts == failed {
			time.Sleep(time.Millisecond)
		}
		time.Sleep(20 * time.Millisecond) // the waiter subscribes after its failed attempt
		held.Unlock()
		token, ok := <-tokens
		if !ok {
			t.Fatal("the waiter did not acquire")
		}
		root, ok := tracker.rootOf("k", token)
		granted := waiter.Stats().Grants > grants
		switch {
		case !ok:
			t.Fatalf("no observed obtain or grant explains token %d", token)
		case granted && root.lease != 2*time.Second:
			t.Fatalf("a granted hold rests on lease %v, not the grant lease (two retry intervals)", root.lease)
		case !granted && root.lease != 0:
			t.Fatalf("an obtained hold rests on lease %v, not the registry's", root.lease)
		}
		close(release)
	}
	if waiter.Stats().Grants == 0 {
		t.Fatal("no release granted the key; the test proves nothing")
	}
}

// TestLeaseTrackerCreditsGrantsMissedInASubscriptionGap: when a fault
// dropped the tracker's subscription after the latest failed attempt, a
// hold whose token is above what that attempt reported rests on the grant
// the tracker missed; without such a gap, or with a token not above it,
// the hold stays unexplained.
func TestLeaseTrackerCreditsGrantsMissedInASubscriptionGap(t *testing.T) {
	for _, tc := range []struct {
		gap       bool
		token     int64
		explained bool
	}{{true, 101, true}, {false, 101, false}, {true, 100, false}} {
		tracker := newLeaseTracker("gap", []string{"k"}, &emitter{w: bufio.NewWriter(&bytes.Buffer{})})
		sent := time.Now().UnixNano()
		tracker.grantLease = 200 * time.Millisecond
		tracker.failed["k"] = failedAttempt{sent: sent, lastToken: 100}
		if tc.gap {
			tracker.resubscribed = sent + 1
		}
		root, ok := tracker.rootOf("k", tc.token)
		if ok != tc.explained || ok && (root.sent != sent || root.lease != tracker.grantLease || !root.fresh) {
			t.Errorf("gap %v, token %d: got %+v, %v; want explained %v, by the grant lease from the failed attempt",
				tc.gap, tc.token, root, ok, tc.explained)
		}
	}
}

// TestLeaseTrackerCreditsAGrantWhoseGapClosesLater: a hold rootOf could
// not explain, because the subscription that would have carried its grant
// came back only after rootOf gave up (a node killed right after it
// published), is credited once that subscription comes back after the
// failed attempt the hold came after; it stays unexplained if none comes
// back within the wait, or if its token is not above what that attempt
// reported.
func TestLeaseTrackerCreditsAGrantWhoseGapClosesLater(t *testing.T) {
	for _, tc := range []struct {
		comesBack bool
		token     int64
		explained bool
	}{{true, 101, true}, {false, 101, false}, {true, 100, false}} {
		tracker := newLeaseTracker("later", []string{"k"}, &emitter{w: bufio.NewWriter(&bytes.Buffer{})})
		sent := time.Now().UnixNano()
		tracker.grantLease = 200 * time.Millisecond
		tracker.failed["k"] = failedAttempt{sent: sent, lastToken: 100}
		root, ok := tracker.rootOf("k", tc.token)
		if ok || root.after.sent != sent || root.after.lastToken != 100 {
			t.Fatalf("token %d with no gap: got %+v, %v; want unexplained, after the failed attempt", tc.token, root, ok)
		}
		if tc.comesBack {
			time.AfterFunc(100*time.Millisecond, func() {
				tracker.mu.Lock()
				tracker.resubscribed = time.Now().UnixNano()
				tracker.mu.Unlock()
			})
		}
		if got := tracker.missedGrant("k", tc.token, root.after, time.Second); got != tc.explained {
			t.Errorf("subscription back %v, token %d: missedGrant = %v, want %v", tc.comesBack, tc.token, got, tc.explained)
		}
	}
}

// token returns the calling goroutine's fencing token for lock, failing the
// test, without stopping it, if there is none.
func token(t *testing.T, lock *lockreg.Lock) int64 {
	t.Helper()
	token, err := lock.Token(context.Background())
	if err != nil {
		t.Errorf("token of %q: %v", lock.Key(), err)
	}
	return token
}

// TestLeaseTrackerIgnoresAGrantAnObtainOvertook: a grant whose message
// comes after the registry's next attempt found the key its own leaves the
// hold on that attempt, whose token the hold then draws.
func TestLeaseTrackerIgnoresAGrantAnObtainOvertook(t *testing.T) {
	ctx := context.Background()
	tracker := newLeaseTracker("late", []string{"k"}, &emitter{w: bufio.NewWriter(&bytes.Buffer{})})
	failed := time.Now().UnixNano()
	tracker.grantLease = 200 * time.Millisecond
	tracker.clientID = "me"
	tracker.failed["k"] = failedAttempt{sent: failed, lastToken: 100}
	set := redis.NewCmd(ctx, "set", "late:{k}", "me", "px", "30000", "nx")
	set.SetVal("OK")
	tracker.observe(set, failed+1) // the next attempt took the key
	tracker.grant("g101:me:k")
	draw := redis.NewCmd(ctx, "evalsha", "sha", 2, "late:{k}", "late:{k}:fence", "me", "30000")
	draw.SetVal(int64(150))
	tracker.observe(draw, failed+2)
	if r, ok := tracker.rootOf("k", 150); !ok || r.sent != failed+1 || r.lease != 0 || !r.fresh {
		t.Errorf("got %+v, %v; want the hold on the SET sent at %d, with the registry's lease", r, ok, failed+1)
	}
}

// TestLeaseTrackerCreditsAGrantHeardBeforeTheClientID: the registry's
// first marked attempt tells the tracker its client id, but the message of
// the grant that answers it can come before its reply; the grant counts
// once the reply comes. (A make test-servers run reported such a hold as
// unexplained: a new worker's first contended key, 5 ms after it started
// waiting.)
func TestLeaseTrackerCreditsAGrantHeardBeforeTheClientID(t *testing.T) {
	tracker := newLeaseTracker("early", []string{"k"}, &emitter{w: bufio.NewWriter(&bytes.Buffer{})})
	sent := time.Now().UnixNano()
	tracker.grant("g5000:other:k") // another registry's, far above
	tracker.grant("g101:me:k")
	tracker.mu.Lock()
	tracker.sawMark("k", failedAttempt{sent: sent, lastToken: 100}, "me", "me:200")
	tracker.mu.Unlock()
	if r, ok := tracker.rootOf("k", 101); !ok || r.sent != sent || r.lease != 200*time.Millisecond || !r.fresh {
		t.Errorf("got %+v, %v; want the grant, its lease of 200ms from the attempt sent at %d", r, ok, sent)
	}
	if _, ok := tracker.rootOf("k", 5000); ok {
		t.Error("another registry's grant explained a hold")
	}
}

// TestLeaseTrackerCreditsAGrantToAReleaseMark: a release that passed the
// key on and marked its registry for a goroutine waiting behind it stands
// for that goroutine's failed attempt, so a grant that answers the mark
// rests on the grant lease from when the release was sent.
func TestLeaseTrackerCreditsAGrantToAReleaseMark(t *testing.T) {
	ctx := context.Background()
	tracker := newLeaseTracker("marks", []string{"k"}, &emitter{w: bufio.NewWriter(&bytes.Buffer{})})
	sent := time.Now().UnixNano()
	release := redis.NewCmd(ctx, "evalsha", "sha", 4, "marks:{k}", "marks:{k}:fence", "marks:{k}:waiting", "marks:{k}:queue",
		"me", 0, "30000", "marks:released", "k", "", "me:200", "200")
	release.SetVal(int64(-100))
	tracker.observe(release, sent)
	answered := time.Now().UnixNano()
	tracker.grant("g101:me:k")
	if r, ok := tracker.rootOf("k", 101); !ok || r.sent != sent || r.lease != 200*time.Millisecond || !r.fresh {
		t.Errorf("got %+v, %v; want the grant, its lease of 200ms from the release sent at %d", r, ok, sent)
	} else if r.renewedFrom <= sent || r.renewedFrom > answered {
		// A renewal of the tenure the release ended, sent after it, may
		// have run before it in Redis: it carries nothing for the grant.
		t.Errorf("renewals carry the grant's lease from %d; want from when the release's reply was read, after %d and by %d", r.renewedFrom, sent, answered)
	}
}

// TestLeaseTrackerReportsWhatItSawOfAKey checks the history an unexplained
// hold is reported with: the key's latest observations, in order, at most
// historyLength of them.
func TestLeaseTrackerReportsWhatItSawOfAKey(t *testing.T) {
	const registry = "tracker"
	tracker := newLeaseTracker(registry, []string{"k"}, &emitter{w: bufio.NewWriter(io.Discard)})
	client := redistest.Start(t).Client(t, tracker)
	reg, err := lockreg.New(client, registry, lockreg.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	lock := reg.Obtain("k")
	lock.Lock()
	drawn := token(t, lock)
	lock.Unlock()

	got := tracker.historyOf("k")
	if !strings.Contains(got, "resubscribed: never") || !strings.Contains(got, "SET NX took it; ") ||
		!strings.HasSuffix(got, fmt.Sprintf(" drew token %d]", drawn)) {
		t.Fatalf("history of k = %q, want the SET NX, then the draw of token %d", got, drawn)
	}
	for range historyLength + 5 {
		lock.Lock()
		lock.Unlock()
	}
	if n := strings.Count(tracker.historyOf("k"), "SET NX took it"); n != historyLength {
		t.Errorf("history keeps %d observations, want the latest %d", n, historyLength)
	}
}

// TestRunningWaitLeavesOutStops: a stop of the worker (one long step)
// does not use up the tracker's wait; steady steps do.
func TestRunningWaitLeavesOutStops(t *testing.T) {
	start := time.Now()
	w := newRunningWait(time.Second, start)
	now := start
	step := func(d time.Duration) bool { now = now.Add(d); return w.over(now) }
	for range 500 {
		if step(time.Millisecond) {
			t.Fatal("over after half of its running time")
		}
	}
	if step(1500 * time.Millisecond) {
		t.Fatal("a 1.5s stop used up the wait")
	}
	for range 499 {
		if step(time.Millisecond) {
			t.Fatal("over before its running time")
		}
	}
	if !step(time.Millisecond) {
		t.Error("not over after a second of running time")
	}
}

// A command a Redis Cluster redirection (MOVED, ASK) sent again reaches
// the next node's hooks still carrying the error from the node before:
// go-redis sets its outcome once the hooks return. The tracker must see
// it succeed all the same.
func TestLeaseTrackerSeesRedirectedCalls(t *testing.T) {
	ctx := context.Background()
	tracker := newLeaseTracker("moved", []string{"k"}, &emitter{w: bufio.NewWriter(&bytes.Buffer{})})
	obtain := redis.NewCmd(ctx, "evalsha", "sha", 4, "moved:{k}", "moved:{k}:fence", "moved:{k}:waiting", "moved:{k}:queue",
		"me", "30000", "200", "0", "me:200")
	obtain.SetErr(errors.New("MOVED 866 127.0.0.1:7001"))
	process := tracker.ProcessHook(func(context.Context, redis.Cmder) error {
		obtain.SetVal(int64(1)) // the next node's reply
		return nil
	})
	if err := process(ctx, obtain); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(tracker.historyOf("k"), "obtain.lua took it") {
		t.Errorf("the redirected obtain went unseen: %s", tracker.historyOf("k"))
	}
}

// While a slot migrates, obtain.lua and token.lua run on the lock's key
// alone; the tracker explains the hold they make.
func TestLeaseTrackerReadsCallsOnTheLockKeyAlone(t *testing.T) {
	ctx := context.Background()
	tracker := newLeaseTracker("alone", []string{"k"}, &emitter{w: bufio.NewWriter(&bytes.Buffer{})})
	sent := time.Now().UnixNano()
	obtain := redis.NewCmd(ctx, "evalsha", "sha", 1, "alone:{k}", "me", "30000", "200", "0", "me:200")
	obtain.SetVal(int64(1))
	tracker.observe(obtain, sent)
	draw := redis.NewCmd(ctx, "evalsha", "sha", 1, "alone:{k}", "me", "30000")
	draw.SetVal(int64(1795000000000000))
	tracker.observe(draw, sent+1)
	renew := redis.NewCmd(ctx, "evalsha", "sha", 1, "alone:{k}", "me", "30000")
	renew.SetVal([]any{int64(1)}) // a renewal of one key has the draw's shape, and answers an array
	tracker.observe(renew, sent+2)
	if r, ok := tracker.rootOf("k", 1795000000000000); !ok || r.sent != sent || !r.fresh {
		t.Errorf("got %+v, %v; want the hold on the obtain sent at %d", r, ok, sent)
	}
}
