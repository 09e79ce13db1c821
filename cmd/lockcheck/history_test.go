//go:build linux

package main

import (
	"strings"
	"testing"
)

// An unlock event completes the hold its goroutine exited last: what the
// unlock returned, and a Lost that fired only while it ran.
func TestCollectorFilesUnlocks(t *testing.T) {
	c := newCollector(History{}, []string{"k"})
	c.add(0, event{E: "enter", G: 1, Key: "k", Token: 7, At: 10})
	c.add(0, event{E: "exit", G: 1, At: 20})
	c.add(0, event{E: "unlock", G: 1, Unlock: UnlockLost, Lost: 25})
	c.add(0, event{E: "enter", G: 1, Key: "k", Token: 8, At: 30})
	c.add(0, event{E: "exit", G: 1, At: 40, Lost: 35})
	c.add(0, event{E: "unlock", G: 1, Unlock: UnlockOK})
	c.add(0, event{E: "unlock", G: 2, Unlock: UnlockOK})
	h := c.history()
	if got := h.Holds[0]; got.Unlock != UnlockLost || got.Lost != 25 {
		t.Errorf("first hold: unlock %d, lost %d; want %d, 25", got.Unlock, got.Lost, UnlockLost)
	}
	if got := h.Holds[1]; got.Unlock != UnlockOK || got.Lost != 35 {
		t.Errorf("second hold: unlock %d, lost %d; want %d and the Lost before its exit, 35", got.Unlock, got.Lost, UnlockOK)
	}
	if len(h.Errors) != 1 || !strings.Contains(h.Errors[0], "goroutine 2 unlocked a hold it never exited") {
		t.Errorf("errors %q; want the unlock of a hold never exited", h.Errors)
	}
}
