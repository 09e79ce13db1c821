package lockreg

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/lockreg/lockreg/internal/protocol"
)

// A registry's owner name tells operators who holds a lock: Inspect and
// Locks read it from the registry's owner hash (internal/protocol), which
// lives two leases past its last refresh, so that a dead registry's name
// vanishes soon after its locks. The registry writes it when it first
// acquires, and again while it waits if need be; the watchdog's renewal
// round keeps it fresh while it holds keys, in the round's own pipeline.

// ownerTTL is how long an owner's name outlives its last refresh.
func (c *config) ownerTTL() time.Duration { return 2 * c.expireAfter }

// defaultOwner names this process: its program, host and process id.
func defaultOwner() string {
	host, err := os.Hostname()
	if err != nil {
		host = "unknown-host"
	}
	program := "unknown"
	if exe, err := os.Executable(); err == nil {
		program = filepath.Base(exe)
	}
	return fmt.Sprintf("%s@%s:%d", program, host, os.Getpid())
}

// ownerRecord is the registry's side of its owner hash.
type ownerRecord struct {
	// freshUntil (unix ns) is until when the hash is known to live, as
	// the registry counts it; publishing says that publishSoon writes it.
	freshUntil atomic.Int64
	publishing atomic.Bool
}

// refreshed records a refresh of the owner hash, calls, sent at sent. A
// failed one (an ACL without HSET, say) is not tried again at every hold
// either: the next renewal round tries.
func (r *Registry) refreshed(calls []*protocol.Call, sent time.Time) {
	for _, c := range calls {
		if err := c.Cmd.Err(); err != nil {
			r.cfg.logger.Debug("lockreg: could not publish the owner name; inspectors see none", "error", err)
			break
		}
	}
	r.owner.freshUntil.Store(sent.Add(r.cfg.ownerTTL()).UnixNano())
}

// publishSoon writes the owner hash in the background when an acquisition
// begins or waits, unless it is known to live for another lease: the
// renewal round, which refreshes it, may be a lease/3 away, or off.
func (r *Registry) publishSoon() {
	if time.Now().Add(r.cfg.expireAfter).UnixNano() < r.owner.freshUntil.Load() ||
		!r.owner.publishing.CompareAndSwap(false, true) {
		return
	}
	if !r.goBackground(func(ctx context.Context) {
		defer r.owner.publishing.Store(false)
		calls := r.peer.RefreshOwner()
		sent := time.Now()
		protocol.RunPipeline(ctx, r.client, calls)
		r.refreshed(calls, sent)
	}) {
		r.owner.publishing.Store(false)
	}
}
