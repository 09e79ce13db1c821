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
