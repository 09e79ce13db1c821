package main

import (
	"context"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that run closes every client, registry and server it
// starts.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRunKeepsCounterConsistent(t *testing.T) {
	var stdout, stderr strings.Builder
	code := run(context.Background(), []string{"-services", "3", "-workers", "4", "-increments", "10"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("run exited %d\nstdout:\n%s\nstderr:\n%s", code, &stdout, &stderr)
	}
	for _, want := range []string{"3 x 4", "expected 120, actual 120", "lost updates:        0\n"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, &stdout)
		}
	}
}

func TestRunRejectsBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-services", "0"}, "-services must be at least 1"},
		{[]string{"-increments", "-1"}, "-increments must be at least 1"},
		{[]string{"-redis", "http://example.com"}, "pass a URL like redis://"},
		{[]string{"-keep-serving"}, "-keep-serving needs -metrics"},
		{[]string{"-expire", "100000h"}, "WithExpireAfter(100000h0m0s): above 10 years"},
	} {
		var stdout, stderr strings.Builder
		if code := run(context.Background(), tc.args, &stdout, &stderr); code != 2 {
			t.Errorf("run(%q) exited %d, want 2, a usage error", tc.args, code)
		}
		if !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("run(%q) stderr = %q, want it to contain %q", tc.args, &stderr, tc.want)
		}
	}
}
