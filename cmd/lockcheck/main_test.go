//go:build linux

package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/lockreg/lockreg/internal/redistest"
)

// TestMain makes the test binary a worker when the end-to-end test starts
// it as one, and checks that runs leave no goroutine behind.
func TestMain(m *testing.M) {
	if spec, ok := os.LookupEnv(workerEnv); ok {
		os.Exit(runWorker(spec))
	}
	goleak.VerifyTestMain(redistest.M(m))
}

func TestStoreFencesStaleTokens(t *testing.T) {
	ctx := context.Background()
	c := redistest.Start(t).Client(t)
	step := func(name string, got, want outcome) {
		t.Helper()
		if got != want {
			t.Fatalf("%s: outcome %d, want %d", name, got, want)
		}
	}
	v, o := storeRead(ctx, c, "r", 5)
	step("first read", o, storeAccepted)
	step("its write", storeWrite(ctx, c, "r", 5, v+1), storeAccepted)
	_, o = storeRead(ctx, c, "r", 3)
	step("a read with a lower token", o, storeRejected)
	step("a write with a lower token", storeWrite(ctx, c, "r", 3, 9), storeRejected)
	v, o = storeRead(ctx, c, "r", 7)
	step("a newer holder's read", o, storeAccepted)
	step("the old holder's write after the newer read", storeWrite(ctx, c, "r", 5, 9), storeRejected)
	step("the newer holder's write", storeWrite(ctx, c, "r", 7, v+1), storeAccepted)
	rec, err := readRecord(ctx, c, "r")
	if err != nil {
		t.Fatal(err)
	}
	if want := (recordState{Value: 2, Accepted: 2, RejectedReads: 1, RejectedWrites: 2}); rec != want {
		t.Errorf("record %+v, want %+v", rec, want)
	}
}

// TestRunUnderFaults runs the whole checker briefly on each topology, with
// every kind of fault that applies to it by default (and the network
// faults on a single server), and checks that it passes and leaves no
// process behind.
func TestRunUnderFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for a minute")
	}
	short := []string{"-keys", "4", "-lease", "400ms", "-every", "800ms", "-json"}
	for _, tc := range []struct {
		name   string
		args   []string
		faults []string
		// known: violations the library is known to commit under these
		// faults, logged rather than failed (matched by substring).
		known string
	}{
		{"single", []string{"-d", "7s", "-wait", "5s"}, defaultFaults[topoSingle], ""},
		{"network", []string{"-d", "9s", "-wait", "5s", "-faults", strings.Join(networkFaults, ",")}, networkFaults, ""},
		{"keys", []string{"-d", "9s", "-wait", "5s", "-faults", strings.Join(keyFaults, ",")}, keyFaults, ""},
		// A failover detected by timeout, the second, keeps waiters a few
		// seconds.
		{"sentinel", []string{"-topology", "sentinel", "-d", "20s", "-wait", "8s"}, defaultFaults[topoSentinel], ""},
		{"cluster", []string{"-topology", "cluster", "-d", "20s", "-wait", "8s"}, defaultFaults[topoCluster], ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr strings.Builder
			code := run(append(tc.args, short...), &stdout, &stderr)
			var out struct {
				OK    bool
				Total result
			}
			if err := json.Unmarshal([]byte(stdout.String()), &out); err != nil || code != 0 && !onlyKnown(out.Total, tc.known) {
				t.Fatalf("run exited %d (%v)\nstdout:\n%s\nstderr:\n%s", code, err, &stdout, &stderr)
			}
			if code != 0 {
				t.Logf("known violations: %q", out.Total.Violations)
			} else if !out.OK {
				t.Errorf("exit status 0, but not ok\n%s", &stdout)
			}
			if out.Total.Acquisitions == 0 {
				t.Errorf("no acquisitions\n%s", &stdout)
			}
			for _, kind := range tc.faults {
				if out.Total.Faults[kind] == 0 {
					t.Errorf("no %s fault was injected\nstderr:\n%s", kind, &stderr)
				}
			}
			if slices.Contains(tc.faults, faultEvict) && (out.Total.EvictionRefused == nil || !*out.Total.EvictionRefused) {
				t.Errorf("a registry without WithEvictionAllowed was not seen to refuse the evicting server: %v", out.Total.EvictionRefused)
			}
			for _, kind := range tc.faults {
				if isKeyFault(kind) && out.Total.KeyFaults[kind].Injections != out.Total.Faults[kind] {
					t.Errorf("%d %s faults, %d in the blind time's count", out.Total.Faults[kind], kind, out.Total.KeyFaults[kind].Injections)
				}
			}
			if failovers := out.Total.Faults[faultFailover] + out.Total.Faults[faultClusterFailover]; out.Total.Switches < failovers {
				t.Errorf("the watcher saw %d failovers of the %d injected\nstderr:\n%s", out.Total.Switches, failovers, &stderr)
			}
			if children := childProcesses(t); len(children) > 0 {
				t.Errorf("processes left behind: %v", children)
			}
		})
	}
}

// onlyKnown reports whether every violation of r is a silent overlap
// whose message contains known (and r lists them all).
func onlyKnown(r result, known string) bool {
	if known == "" || r.ViolationCount != len(r.Violations) || r.ViolationCount != r.OverlapsSilent {
		return false
	}
	for _, v := range r.Violations {
		if !strings.Contains(v, "silent overlap on key") || !strings.Contains(v, known) {
			return false
		}
	}
	return true
}

func TestRunRejectsBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-keys", "1,x"}, "-keys"},
		{[]string{"-faults", "flood"}, "unknown fault"},
		{[]string{"-topology", "ring"}, "unknown topology"},
		{[]string{"-faults", "failover"}, "does not apply to -topology single"},
		{[]string{"-topology", "cluster", "-faults", "restart"}, "does not apply to -topology cluster"},
		{[]string{"-topology", "sentinel", "-faults", "del,evict"}, "evict does not apply to -topology sentinel"},
		{[]string{"-wait-replicas", "1"}, "needs replicas"},
		{[]string{"-retry", "2s"}, "shorter than -lease"},
		{[]string{"-every", "1s"}, "at least two leases"},
		{[]string{"-d", "2s"}, "per key count"},
	} {
		var stdout, stderr strings.Builder
		if code := run(tc.args, &stdout, &stderr); code != 2 {
			t.Errorf("run(%q) exited %d, want 2", tc.args, code)
		}
		if !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("run(%q) said %q, want it to mention %q", tc.args, stderr.String(), tc.want)
		}
	}
}

// childProcesses lists this process's live children.
func childProcesses(t *testing.T) []string {
	t.Helper()
	tasks, err := filepath.Glob("/proc/self/task/*/children")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, pid := range strings.Fields(string(b)) {
			cmdline, _ := os.ReadFile("/proc/" + pid + "/cmdline")
			out = append(out, pid+" "+strings.ReplaceAll(string(cmdline), "\x00", " "))
		}
	}
	return out
}
