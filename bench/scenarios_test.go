package main

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockreg/lockreg/bench/contenders"
	"github.com/lockreg/lockreg/internal/redisstat"
	"github.com/lockreg/lockreg/internal/redistest"
)

// TestMain lets the test binary serve as the worker processes that
// processes starts, and as S8's unrelated client (os.Executable).
func TestMain(m *testing.M) {
	if spec := os.Getenv(workerEnv); spec != "" {
		os.Exit(runWorker(spec))
	}
	if spec := os.Getenv(pingerEnv); spec != "" {
		os.Exit(runPinger(spec))
	}
	os.Exit(m.Run())
}

// launchRedis starts a redis-server for the test, shut down with it, and
// returns its address and a client to it.
func launchRedis(t *testing.T) (addr string, admin *redis.Client) {
	t.Helper()
	srv, err := redistest.Launch()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	admin = redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = admin.Close() })
	return srv.Addr(), admin
}

// TestWorkersHoldAndTheHarnessCountsItsOwnCommands runs a worker shape with
// the hand-off floor, which sends neither PING nor INCR: the server ran
// exactly the PINGs and INCRs the harness says it sent (the yardstick's,
// the workers' bookkeeping), which a contender's server commands leave
// out; S7's PINGs, at 20 acquisitions/s, once made up 40 of lockreg's 70
// commands per acquisition. Every hold lasts the shape's hold, and each
// process takes turns.
func TestWorkersHoldAndTheHarnessCountsItsOwnCommands(t *testing.T) {
	addr, admin := launchRedis(t)
	ctx := context.Background()
	env := &benchEnv{addr: addr, admin: admin}
	const hold = 5 * time.Millisecond
	sc := scenario{id: "T", workers: &workerShape{processes: 2, goroutines: 1, hold: hold}}
	before, err := redisstat.CommandStats(ctx, admin)
	if err != nil {
		t.Fatal(err)
	}
	l, err := env.processes(ctx, sc, contenders.Factory{Name: contenders.HandoffFloorName}, addr, 400*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	after, err := redisstat.CommandStats(ctx, admin)
	if err != nil {
		t.Fatal(err)
	}
	ran := redisstat.Delta(before, after)
	if l.pings < 100 || ran["ping"] != l.pings {
		t.Errorf("the server ran %d PINGs, the harness counted %d (want the same, and 100 or more in 400ms)", ran["ping"], l.pings)
	}
	if l.acquisitions < 10 || ran["incr"] != l.acquisitions {
		t.Errorf("the server ran %d INCRs for %d acquisitions (want one each, and 10 or more)", ran["incr"], l.acquisitions)
	}
	for _, h := range l.holds {
		if h.Released-h.Acquired < int64(hold) {
			t.Fatalf("a hold lasted %v, want %v or more", time.Duration(h.Released-h.Acquired), hold)
		}
	}
	if turns := takingTurns(l.holds, 2); turns.fewest == 0 {
		t.Errorf("a process never held the key: %+v", turns)
	}
}

// TestHandoffsSplitAtTheReleaseCall numbers holds out of order across
// processes: only a hold that follows another process's counts, and its
// hand-off splits where the releaser's call returned.
func TestHandoffsSplitAtTheReleaseCall(t *testing.T) {
	holds := []turn{
		{Seq: 3, Proc: 1, Acquired: 400, Released: 450, Returned: 600},
		{Seq: 1, Proc: 0, Acquired: 0, Released: 100, Returned: 150},
		{Seq: 2, Proc: 0, Acquired: 160, Released: 200, Returned: 420}, // passed to process 1 before returning
		{Seq: 4, Proc: 2, Acquired: 700, Released: 800, Returned: 900},
	}
	p := handoffs(holds)
	want := passes{
		handoffs:    []time.Duration{200, 250},
		releases:    []time.Duration{150, 220},
		afterReturn: []time.Duration{-20, 100},
	}
	for name, got := range map[string][2][]time.Duration{
		"handoffs":    {p.handoffs, want.handoffs},
		"releases":    {p.releases, want.releases},
		"afterReturn": {p.afterReturn, want.afterReturn},
	} {
		if !slices.Equal(got[0], got[1]) {
			t.Errorf("%s: got %v, want %v", name, got[0], got[1])
		}
	}
}

// TestRatioIntervalSpansTheBlocksNoise: blocks whose peer/lockreg ratios
// scatter around 1.4 give an interval around 1.4, narrower than the
// blocks' own spread; identical blocks give a point; too few, none.
func TestRatioIntervalSpansTheBlocksNoise(t *testing.T) {
	var blocks [][2]time.Duration
	for i := range 40 {
		peer := 1000 + 200*time.Duration(i%5) // ratios 1.0 to 1.8 of 1000, mean 1.4
		blocks = append(blocks, [2]time.Duration{1000, peer})
	}
	lo, hi := ratioInterval(blocks)
	if !(1.0 < lo && lo < 1.4 && 1.4 < hi && hi < 1.8) {
		t.Errorf("interval %.3f-%.3f, want inside 1.0-1.8 around 1.4", lo, hi)
	}
	same := make([][2]time.Duration, 20)
	for i := range same {
		same[i] = [2]time.Duration{1000, 1100}
	}
	if lo, hi := ratioInterval(same); lo != 1.1 || hi != 1.1 {
		t.Errorf("identical blocks: %v-%v, want 1.1-1.1", lo, hi)
	}
	if lo, hi := ratioInterval(blocks[:9]); lo != 0 || hi != 0 {
		t.Errorf("9 blocks: %v-%v, want none", lo, hi)
	}
}

// TestS1TurnsFollowEachOtherEquallyOften: in an S1 session, a client's
// cycle is timed right after another client's turn, and what ran just
// before moves it (two identical lockregs measured 0.5% apart when one
// always followed the PINGs more often). Every client must follow every
// other equally often.
func TestS1TurnsFollowEachOtherEquallyOften(t *testing.T) {
	const clients, cycles = 3, 30000
	turns := newTurnOrder(clients)
	follows := make(map[[2]int]int)
	prev := -1
	for range cycles {
		for _, k := range turns.next() {
			if prev >= 0 && prev != k {
				follows[[2]int{prev, k}]++
			}
			prev = k
		}
	}
	total := 0
	for _, n := range follows {
		total += n
	}
	mean := float64(total) / (clients * (clients - 1))
	for a := range clients {
		for b := range clients {
			if a != b {
				if n := float64(follows[[2]int{a, b}]); n < 0.95*mean || n > 1.05*mean {
					t.Errorf("client %d followed client %d %v times, against %.0f on average", b, a, n, mean)
				}
			}
		}
	}
}

// TestTakingTurnsCountsWhoWentFirst: three processes, given out of order;
// process 2 asks at 250 and waits while processes 0 and 1 take two turns
// each, which counts 4 holds that overtook it; a hold of the asker's own
// process never counts.
func TestTakingTurnsCountsWhoWentFirst(t *testing.T) {
	holds := []turn{
		{Seq: 8, Proc: 2, Asked: 250, Acquired: 700},
		{Seq: 1, Proc: 0, Asked: 0, Acquired: 0},
		{Seq: 2, Proc: 1, Asked: 0, Acquired: 100},
		{Seq: 3, Proc: 2, Asked: 0, Acquired: 200},
		{Seq: 4, Proc: 0, Asked: 50, Acquired: 300},
		{Seq: 5, Proc: 1, Asked: 150, Acquired: 400},
		{Seq: 6, Proc: 0, Asked: 350, Acquired: 500},
		{Seq: 7, Proc: 1, Asked: 450, Acquired: 600},
		{Seq: 9, Proc: 1, Asked: 450, Acquired: 800}, // a second goroutine of process 1: seq 7 does not count
	}
	got := takingTurns(holds, 3)
	if want := []int{0, 0, 1, 1, 1, 2, 2, 2, 4}; !slices.Equal(got.overtaken, want) {
		t.Errorf("overtaken %v, want %v", got.overtaken, want)
	}
	if got.fewest != 2 || got.most != 4 {
		t.Errorf("holds per process: fewest %d, most %d; want 2 and 4", got.fewest, got.most)
	}
}
