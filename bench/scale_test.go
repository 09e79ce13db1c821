package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/lockreg/lockreg/bench/contenders"
)

// TestS8HoldsRenewsAndReleases runs S8 small: lockreg takes the keys,
// holds them through renewal rounds (each key renewed once a round, none
// lost), its keys and holds weigh something in Redis and in the heap,
// the unrelated client PINGs at rest and while they are held, and all are
// released; bsm/redislock gives its memory only.
func TestS8HoldsRenewsAndReleases(t *testing.T) {
	addr, admin := launchRedis(t)
	const keys = 300
	shape := scaleShape{keys: keys, leases: []time.Duration{600 * time.Millisecond}, rounds: 3, rest: 100 * time.Millisecond, goroutines: 8}
	ctx := context.Background()
	s, err := holdLockReg(ctx, addr, admin, shape, shape.leases[0])
	if err != nil {
		t.Fatal(err)
	}
	if s.Keys != keys || s.AcqPerSec <= 0 || s.ReleaseAll <= 0 || s.Lost != 0 {
		t.Errorf("keys %d, %.0f acq/s, released in %v, %d lost", s.Keys, s.AcqPerSec, time.Duration(s.ReleaseAll), s.Lost)
	}
	// Three rounds of 200ms over about 600ms: each key renewed about 5 times a second.
	if renewed := s.ServerCmdsByName["pexpire"]; renewed < 2*keys || renewed > 8*keys {
		t.Errorf("%.0f PEXPIREs/s for %d keys renewed every 200ms", renewed, keys)
	}
	if s.RenewCallsPerSec <= 0 || s.ServerCmdsPerSec <= 0 || s.ServerCPU <= 0 {
		t.Errorf("renewal: %.0f calls/s, %.0f server cmds/s, CPU %.1f%%", s.RenewCallsPerSec, s.ServerCmdsPerSec, s.ServerCPU)
	}
	if s.RedisBytesLessClients < 30 || s.HeapBytesPerLock < 30 || s.HeapObjectsPerLock < 1 {
		t.Errorf("per lock: Redis %.0f bytes, heap %.0f bytes and %.1f objects", s.RedisBytesPerLock, s.HeapBytesPerLock, s.HeapObjectsPerLock)
	}
	for name, p := range map[string]*PingFigures{"at rest": s.PingRest, "held": s.PingHold} {
		if p == nil || p.N < 20 || p.P50 <= 0 || p.P99 < p.P50 || p.Max < p.P99 {
			t.Errorf("PINGs %s: %+v", name, p)
		}
	}
	b, err := holdRedisLock(ctx, addr, admin, shape)
	if err != nil {
		t.Fatal(err)
	}
	if !b.MemoryOnly || b.RedisBytesLessClients < 30 || b.HeapObjectsPerLock < 1 {
		t.Errorf("bsm/redislock: %+v", b)
	}
	if n := admin.DBSize(ctx).Val(); n > 5 {
		t.Errorf("%d keys left after both released theirs", n)
	}
}

// TestS8SectionShowsRowsAndLeavesMemoryOnlyBlank: lockreg's rows give
// every figure and the commands by name, bsm/redislock's its memory; a
// run without S8 has no section.
func TestS8SectionShowsRowsAndLeavesMemoryOnlyBlank(t *testing.T) {
	results := []Result{
		{Scenario: "S8", Contender: "lockreg", Scale: &ScaleResult{Keys: 100000, Lease: float64(3 * time.Second), AcqPerSec: 50000, RedisBytesPerLock: 250, RedisBytesLessClients: 240, HeapBytesPerLock: 800, HeapObjectsPerLock: 11.5,
			RenewCallsPerSec: 1000, ServerCmdsPerSec: 300000, ServerCPU: 40, ServerCPURest: 2, ScriptBusy: 30, ServerCmdsByName: map[string]float64{"get": 200000, "pexpire": 100000},
			ServerUsecByName: map[string]float64{"get": 150000, "pexpire": 90000},
			PingRest:         &PingFigures{N: 100, P50: 50e3, P99: 90e3, Max: 200e3}, PingHold: &PingFigures{N: 100, P50: 60e3, P99: 900e3, Max: 5e6}, ReleaseAll: 2e9}},
		{Scenario: "S8", Contender: "bsm/redislock-linear", Scale: &ScaleResult{Keys: 100000, MemoryOnly: true, RedisBytesPerLock: 120, RedisBytesLessClients: 118, HeapBytesPerLock: 60, HeapObjectsPerLock: 2}},
		{Scenario: "S8", Contender: "lockreg", Err: "dial: refused"},
	}
	md := markdown(time.Now(), "test machine", false, results)
	containsAll(t, md,
		"## S8: one registry holding 100,000 keys",
		"| lockreg | 3s | 100000 | 50000 | 250 (240) | 800 / 11.5 | 0 | 1000 | 300000 | 40.0 (2.0) | 30.0 | 90 / 200 | 900 / 5000 | 2000 | 0 |",
		"| bsm/redislock-linear | none (memory only) | 100000 | | 120 (118) | 60 / 2.0 | 0 |",
		"get 200000 (150000 µs), pexpire 100000 (90000 µs)",
		"| lockreg | error: dial: refused |")
	header := strings.Count(strings.Split(strings.Split(md, "## S8")[1], "\n")[4], "|")
	for _, line := range strings.Split(strings.Split(md, "## S8")[1], "\n") {
		if strings.HasPrefix(line, "| ") && strings.Count(line, "|") != header {
			t.Errorf("a row of %d cells' bars against the header's %d: %s", strings.Count(line, "|"), header, line)
		}
	}
	if md := markdown(time.Now(), "test machine", false, results[:0]); strings.Contains(md, "S8") {
		t.Errorf("a run without S8 shows it")
	}
	if strings.Contains(md, "real-time priority") {
		t.Errorf("a run without -realtime says it ran at real-time priority")
	}
	results[0].Scale.Realtime = true
	containsAll(t, markdown(time.Now(), "test machine", false, results), "ran at real-time priority (-realtime")
}

// TestS1SessionsTimeTheLockFloor: a short S1 session of lockreg and a
// peer times the lock floor beside them, and gives both over it.
func TestS1SessionsTimeTheLockFloor(t *testing.T) {
	addr, admin := launchRedis(t)
	env := &benchEnv{addr: addr, admin: admin, d: 300 * time.Millisecond}
	base := &contenderRun{f: contenders.LockReg, res: Result{Scenario: "S1", Contender: "lockreg"}}
	peer := &contenderRun{f: contenders.RedisLockLinear, res: Result{Scenario: "S1", Contender: contenders.RedisLockLinear.Name}}
	env.sessions(context.Background(), []*contenderRun{base, peer})
	for _, r := range []Result{base.res, peer.res} {
		if r.Err != "" || r.LockFloorNsPerOp <= 0 || r.VsLockFloor < 0.3 || r.VsLockFloor > 3 {
			t.Errorf("%s: error %q, floor %.0f ns, %.2fx of it", r.Contender, r.Err, r.LockFloorNsPerOp, r.VsLockFloor)
		}
	}
	if r := peer.res; r.LockRegVsLockFloor < 0.3 || r.LockRegVsLockFloor > 3 || r.VsLockReg <= 0 {
		t.Errorf("the peer's session: lockreg %.2fx of the floor, the peer %.2fx of lockreg", r.LockRegVsLockFloor, r.VsLockReg)
	}
	md := lockFloorMarkdown([]Result{base.res, peer.res})
	if !strings.Contains(md, "| all sessions | ") || !strings.Contains(md, "| bsm/redislock-linear | ") {
		t.Errorf("the lock floor's table:\n%s", md)
	}
}

// TestLockFloorTableSetsLockregAndThePeerSideBySide: each peer's session
// gives lockreg's and the peer's time over the floor, with their
// intervals; lockreg's row pools its sessions; without the floor, nothing.
func TestLockFloorTableSetsLockregAndThePeerSideBySide(t *testing.T) {
	results := []Result{
		{Scenario: "S1", Contender: "lockreg", LockFloorNsPerOp: 90000, VsLockFloor: 1.05, VsLockFloorLo: 1.04, VsLockFloorHi: 1.06},
		{Scenario: "S1", Contender: "bsm/redislock-linear", LockFloorNsPerOp: 91000, VsLockFloor: 1.03, VsLockFloorLo: 1.02, VsLockFloorHi: 1.04,
			LockRegVsLockFloor: 1.051, LockRegVsLockFloorLo: 1.041, LockRegVsLockFloorHi: 1.061},
		{Scenario: "S1", Contender: "redsync", Err: "refused"},
	}
	md := markdown(time.Now(), "test machine", false, results)
	containsAll(t, md,
		"| all sessions | 1.050x (1.040x-1.060x) | | 90000 |",
		"| bsm/redislock-linear | 1.051x (1.041x-1.061x) | 1.030x (1.020x-1.040x) | 91000 |")
	if strings.Contains(md, "| redsync | ") && strings.Count(md, "| redsync |") > 1 {
		t.Errorf("a failed session has a floor row")
	}
	if lockFloorMarkdown(results[2:]) != "" {
		t.Errorf("no floor timed, yet a table")
	}
}

// containsAll reports each of wants that text lacks.
func containsAll(t *testing.T, text string, wants ...string) {
	t.Helper()
	for _, want := range wants {
		if !strings.Contains(text, want) {
			t.Errorf("lacks %q:\n%s", want, text)
		}
	}
}
