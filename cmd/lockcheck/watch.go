//go:build linux

package main

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/redis/go-redis/v9"
)

// watchEvery is how often the watcher asks each server its role.
const watchEvery = 50 * time.Millisecond

// watcher follows the roles of the lock Redis's servers and files every
// promotion of a replica, injected or not: a Sentinel group or a cluster
// may fail over by itself on a loaded machine, and an overlap across such
// a failover is the replication hazard as much as across an injected one.
type watcher struct {
	topo    topology
	keys    []string
	col     *collector
	clients map[string]*redis.Client // by address
	seen    map[string]role          // the last role each server answered
	pending []primarySwitch          // promotions whose old primary was still one
	olds    []string                 // and those primaries, in step with pending
	last    time.Time                // the previous look
}

// role is what ROLE answered: "master", or "slave" and its primary.
type role struct{ name, primary string }

func newWatcher(topo topology, keys []string, col *collector) *watcher {
	w := &watcher{topo: topo, keys: keys, col: col, clients: make(map[string]*redis.Client), seen: make(map[string]role)}
	for _, s := range topo.servers() {
		w.clients[s.Addr()] = redis.NewClient(&redis.Options{
			Addr: s.Addr(), MaxRetries: -1, PoolSize: 1,
			DialTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond,
		})
	}
	return w
}

// run looks every watchEvery until ctx ends, then files what is pending.
func (w *watcher) run(ctx context.Context) {
	defer func() {
		for _, c := range w.clients {
			_ = c.Close()
		}
	}()
	if len(w.clients) == 0 {
		return
	}
	w.look(ctx, time.Now())
	t := time.NewTicker(watchEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			now := time.Now().UnixNano()
			for _, s := range w.pending {
				s.until = now
				w.col.switched(s)
			}
			return
		case now := <-t.C:
			w.look(ctx, now)
		}
	}
}

// look asks every server its role, files a promotion when a replica turned
// primary, and closes a pending one when its old primary stopped being one.
func (w *watcher) look(ctx context.Context, now time.Time) {
	roles := make(map[string]role)
	for addr, c := range w.clients {
		if r, ok := askRole(ctx, c); ok {
			roles[addr] = r
		}
	}
	at := time.Now()
	for addr, r := range roles {
		before, known := w.seen[addr]
		w.seen[addr] = r
		if !known || before.name != "slave" || r.name != "master" {
			continue
		}
		keys, err := w.topo.serves(ctx, addr, w.keys)
		if err != nil {
			w.col.failed("watcher: what %s serves after its promotion: %v", addr, err)
		}
		w.pending = append(w.pending, primarySwitch{server: addr, since: w.last.UnixNano(), at: at.UnixNano(), keys: keys})
		w.olds = append(w.olds, before.primary)
	}
	for i := 0; i < len(w.pending); {
		if roles[w.olds[i]].name == "master" {
			i++
			continue
		}
		s := w.pending[i]
		s.until = max(s.at, at.UnixNano())
		if _, alive := roles[w.olds[i]]; !alive {
			// Dead at the last look already, or since: writes it took
			// before are the ones at risk.
			s.until = s.at
		}
		w.col.switched(s)
		w.pending = append(w.pending[:i], w.pending[i+1:]...)
		w.olds = append(w.olds[:i], w.olds[i+1:]...)
	}
	w.last = now
}

// askRole asks c's server its role; false if it did not answer.
func askRole(ctx context.Context, c *redis.Client) (role, bool) {
	reply, err := c.Do(ctx, "ROLE").Slice()
	if err != nil || len(reply) == 0 {
		return role{}, false
	}
	r := role{name: fmt.Sprint(reply[0])}
	if r.name == "slave" && len(reply) >= 3 {
		r.primary = net.JoinHostPort(fmt.Sprint(reply[1]), fmt.Sprint(reply[2]))
	}
	return r, true
}
