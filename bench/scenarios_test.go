package main

import (
	"slices"
	"testing"
	"time"
)

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
