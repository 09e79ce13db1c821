//go:build linux

package main

import (
	"strings"
	"testing"
)

// An unlock event completes the hold its goroutine exited last: what the
// unlock returned, and a Lost that fired only while it ran.
func TestCollectorFilesUnlocks(t *testing.T) {
	c := newCollector(history{}, []string{"k"})
	c.add(0, event{E: "enter", G: 1, Key: "k", Token: 7, At: 10})
	c.add(0, event{E: "exit", G: 1, At: 20})
	c.add(0, event{E: "unlock", G: 1, Unlock: unlockLost, Lost: 25})
	c.add(0, event{E: "enter", G: 1, Key: "k", Token: 8, At: 30})
	c.add(0, event{E: "exit", G: 1, At: 40, Lost: 35})
	c.add(0, event{E: "unlock", G: 1, Unlock: unlockOK})
	c.add(0, event{E: "unlock", G: 2, Unlock: unlockOK})
	h := c.history()
	if got := h.holds[0]; got.unlock != unlockLost || got.lost != 25 {
		t.Errorf("first hold: unlock %d, lost %d; want %d, 25", got.unlock, got.lost, unlockLost)
	}
	if got := h.holds[1]; got.unlock != unlockOK || got.lost != 35 {
		t.Errorf("second hold: unlock %d, lost %d; want %d and the Lost before its exit, 35", got.unlock, got.lost, unlockOK)
	}
	if len(h.errors) != 1 || !strings.Contains(h.errors[0], "goroutine 2 unlocked a hold it never exited") {
		t.Errorf("errors %q; want the unlock of a hold never exited", h.errors)
	}
}

// The workers' done events add up: the unlocks that reported ErrLockLost,
// the holds that got no token, and those credited late (missedGrant).
func TestCollectorSumsWhatWorkersCounted(t *testing.T) {
	c := newCollector(history{}, []string{"k"})
	c.add(0, event{E: "done", LostUnlocks: 1, NoTokens: 2, LateCredits: 3})
	c.add(1, event{E: "done", LostUnlocks: 4, NoTokens: 5, LateCredits: 6})
	h := c.history()
	if h.lostUnlocks != 5 || h.noTokens != 7 || h.lateCredits != 9 {
		t.Errorf("lost unlocks %d, no tokens %d, late credits %d; want 5, 7, 9", h.lostUnlocks, h.noTokens, h.lateCredits)
	}
}
