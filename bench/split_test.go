package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/lockreg/lockreg/bench/contenders"
)

// TestSplitHandoffsCutsEachHandoffAtItsMoments: only hand-offs between
// processes count; one whose release made no call, or whose next process
// heard the grant outside the window from that call to its hold, is
// counted but not split; the parts of the others are read off the
// releaser's and the next holder's moments.
func TestSplitHandoffsCutsEachHandoffAtItsMoments(t *testing.T) {
	holds := []turn{
		{Seq: 2, Proc: 1, Acquired: 400, Heard: 350, Path: "grant", Released: 500, Sent: 510, Replied: 600, Returned: 605},
		{Seq: 1, Proc: 0, Acquired: 0, Released: 100, Sent: 120, Replied: 380, Returned: 390},
		{Seq: 3, Proc: 1, Acquired: 610, Path: "handoff", Released: 700, Returned: 701},         // within process 1: not counted
		{Seq: 4, Proc: 2, Acquired: 900, Heard: 350, Path: "redis", Released: 1000, Sent: 1010}, // heard before the call: not split
		{Seq: 5, Proc: 0, Acquired: 1300, Heard: 1200, Path: "grant"},                           // the release made no call: not split
	}
	p := splitHandoffs(holds)
	if p.handoffs != 3 || p.split != 1 || p.grants != 2 || p.heardFirst != 1 {
		t.Fatalf("handoffs %d, split %d, grants %d, heard first %d; want 3, 1, 2, 1", p.handoffs, p.split, p.grants, p.heardFirst)
	}
	want := []time.Duration{20, 260, 10, 230, 50, 300}
	for k, w := range want {
		if len(p.parts[k]) != 1 || p.parts[k][0] != w {
			t.Errorf("%s: %v, want [%v]", splitPartNames[k], p.parts[k], w)
		}
	}
	s := p.summary()
	if s.Parts[1].P50 != 260 || s.Parts[len(s.Parts)-1].P99 != 300 {
		t.Errorf("summary: %+v", s.Parts)
	}
}

// TestSplitMarkdownGivesMultiplesOfTheFloor: each part's p50 and p99 over
// the floor's whole hand-off's, beside the floor's own part; an error is
// said; a split without the floor's figures says so.
func TestSplitMarkdownGivesMultiplesOfTheFloor(t *testing.T) {
	parts := func(scale float64) SplitParts {
		var ps []SplitPart
		for k, name := range splitPartNames {
			ps = append(ps, SplitPart{Name: name, P50: scale * float64(k+1) * 1e3, P99: 2 * scale * float64(k+1) * 1e3})
		}
		return SplitParts{Handoffs: 10, Split: 8, Grants: 9, HeardFirst: 0.25, PingP50: 80e3, Parts: ps, Command: "cmd", ServerP50: scale * 10e3, ServerP99: scale * 24e3}
	}
	md := splitMarkdown(&HandoffSplit{Rounds: 3, Pass: float64(3 * time.Second), LockReg: parts(2), Floor: parts(1)})
	containsAll(t, md,
		"| call sent → reply (the releaser's round trip) | 4 / 8 | 0.67 / 0.67 | 2 / 4 |",
		"| hand-off: release begun → next held | 12 / 24 | 2.00 / 2.00 | 6 / 12 |",
		"- lockreg: 10 hand-offs between processes, 8 split (80%), the grant heard before the releaser's reply in 25% of those; PING p50 80 µs; 9 of the hand-offs (90%) were grants",
		"3 passes each of lockreg and of the floor, 3s each",
		"| … of the call, the releasing command's own time in Redis (cmd; the floor: cmd) | 20 / 48 | 3.33 / 4.00 | 10 / 24 |")
	if md := splitMarkdown(&HandoffSplit{Err: "lockreg: worker 1: exit status 1"}); !strings.Contains(md, "error: lockreg: worker 1: exit status 1") {
		t.Errorf("an error is not said:\n%s", md)
	}
	if md := splitMarkdown(&HandoffSplit{LockReg: parts(1)}); !strings.Contains(md, "nothing split") {
		t.Errorf("a split without the floor's figures:\n%s", md)
	}
	if splitMarkdown(nil) != "" {
		t.Errorf("no split, yet words")
	}
}

// TestSplitPassesSplitLockRegsHandoffs runs the split's passes, briefly,
// with two processes: lockreg's hand-offs between them are grants, heard
// and split, and so are the floor's.
func TestSplitPassesSplitLockRegsHandoffs(t *testing.T) {
	addr, admin := launchRedis(t)
	env := &benchEnv{addr: addr, admin: admin}
	sc := scenario{id: "T", workers: &workerShape{processes: 2, goroutines: 4, split: true}}
	run := &contenderRun{f: contenders.LockReg, res: Result{Scenario: "T", Contender: "lockreg"}}
	env.splitPasses(context.Background(), sc, []*contenderRun{run}, 400*time.Millisecond)
	s := run.res.Split
	if s == nil || s.Err != "" {
		t.Fatalf("split: %+v", s)
	}
	for name, p := range map[string]SplitParts{"lockreg": s.LockReg, "the floor": s.Floor} {
		if p.Handoffs < 5 || p.Split < p.Handoffs/2 {
			t.Errorf("%s: %d hand-offs between processes, %d split; want 5 or more, most split", name, p.Handoffs, p.Split)
		}
		if whole := p.Parts[len(p.Parts)-1]; whole.P50 <= 0 || whole.P99 < whole.P50 {
			t.Errorf("%s: the whole hand-off %+v", name, whole)
		}
		if p.ServerP50 <= 0 || p.ServerP99 < p.ServerP50 {
			t.Errorf("%s: the releasing command's time in Redis: p50 %v, p99 %v", name, p.ServerP50, p.ServerP99)
		}
	}
	if s.LockReg.Grants < s.LockReg.Handoffs/2 {
		t.Errorf("lockreg: %d grants of %d hand-offs between processes", s.LockReg.Grants, s.LockReg.Handoffs)
	}
}
