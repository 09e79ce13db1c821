//go:build linux

package main

import (
	"time"
)

// outlivedUntold checks that every hold whose lease ran out while it was
// inside was told so: by Lost, or by its unlock's ErrLockLost. That is
// the library's promise beside exclusion (a release that begins after the
// lease ran out, as the registry counts it, reports ErrLockLost), and
// without this check a library that stayed silent would pass: the stale
// hold's live interval ended with its lease, so no overlap shows it, and
// the fenced store rejects its calls. The lease counted here takes the
// renewals answered before the unlock returned, not only before the exit,
// as the release may have begun after one; and a hold must outlive it by
// a twentieth of a lease, beyond any difference between the checker's
// and the library's instants of sending. A worker killed inside, or an
// unlock that failed, tells nothing either way.
func (a *analysis) outlivedUntold() {
	margin := a.lease / 20
	for i := range a.h.holds {
		hd := &a.h.holds[i]
		// The live interval ends no later than the lease counted here.
		if !a.isLive(i) || hd.exit-a.live[i] <= margin || hd.lost > 0 || hd.unlock != unlockOK || hd.root == 0 {
			continue
		}
		end := a.leaseUntil(hd, hd.exit, hd.unlocked)
		if hd.exit-end <= margin {
			continue
		}
		a.res.OutlivedUntold++
		a.res.violation("%s outlived its lease by %v and was never told: no Lost, and its unlock returned nil",
			a.describe(i), time.Duration(hd.exit-end).Round(time.Microsecond))
	}
}
