//go:build linux

package main

import (
	"fmt"
	"sync"
	"time"
)

// Times are wall-clock unix nanoseconds: every process on one machine reads
// the same clock, so times from the workers, the injector and Redis (whose
// TTLs run on it too) compare directly.

// hold is one critical section: from the return of LockContext (enter) to
// the last act under the lock (exit), which the worker records before it
// unlocks.
type hold struct {
	worker, g int
	key       string
	token     int64
	// fresh: the token came from obtain.lua; otherwise the hold was a
	// local hand-off within its registry, which rests on the same obtain.
	fresh bool
	acq   int64 // LockContext was called
	enter int64
	// root is when the obtain call the hold rests on was sent: the lease
	// is counted from there, as the library counts it. For a grant (a
	// release that passed the key to the hold's registry), it is when the
	// failed attempt the grant followed was sent, and rootLease is the
	// grant's lease; otherwise rootLease is 0 (the run's lease).
	root      int64
	rootLease time.Duration
	// renewedFrom, for a grant, is the earliest a renewal that carries its
	// lease can have been sent (failedAttempt.answered).
	renewedFrom int64
	exit        int64 // 0: the worker died inside (kill -9)
	// lost is when Lost() fired, before exit or while the unlock ran
	// (0: it did not); only a Lost before exit ends the live interval.
	lost int64
	// unlock is what the hold's unlock returned; 0 if the worker died
	// before it did. unlocked is when it returned.
	unlock   unlocked
	unlocked int64
	// cause is the LossCause the library named when Lost fired ("" if it
	// did not, or the worker did not hear it).
	cause string
	read  storeCall
	// write is only tried after an accepted read; writeValue is the value
	// it wrote (the read's value + 1).
	write      storeCall
	writeValue int64
}

// storeCall is one call to the fenced store: sent, answered, and the answer.
// Its fields stay exported: the workers' events carry it as JSON.
type storeCall struct {
	Sent    int64   `json:"s,omitempty"`
	Done    int64   `json:"d,omitempty"`
	Outcome outcome `json:"o,omitempty"`
}

// unlocked is what an unlock returned.
type unlocked int8

const (
	unlockOK     unlocked = iota + 1
	unlockLost            // ErrLockLost: the hold was told it may have lost the key
	unlockFailed          // another error (Redis failing)
)

// renewal is a renewal call that extended a worker's lease on key, sent
// at sent and answered at done.
type renewal struct {
	worker     int
	key        string
	sent, done int64
}

// timeout is an acquisition that waited the full -wait without the lock.
type timeout struct {
	worker, g int
	key       string
	acq, at   int64
}

// goroutineRun is what a worker goroutine did over the run.
type goroutineRun struct {
	worker       int   // filled in by the collector, not sent
	G            int   `json:"g"`
	First        int64 `json:"first"` // its first attempt; 0: none
	Acquisitions int   `json:"n"`
}

// workerRun is one worker process's life.
type workerRun struct {
	id     int
	start  int64
	killed int64 // 0: not killed
	done   bool  // it finished the run and reported its goroutines
}

// Fault kinds. The first six fault a single lock Redis; stop and kill-9
// fault a worker, and the net- kinds its connections, on any topology.
// The key faults (keyfaults.go) change held keys behind their holders'
// backs: del and overwrite on any topology, flush and evict on a single
// server and on a Cluster (the primary that holds the key).
const (
	faultStop            = "stop"
	faultClientKill      = "client-kill"
	faultRestart         = "restart"
	faultPause           = "pause"
	faultSleep           = "debug-sleep"
	faultKill            = "kill-9"
	faultNetStall        = "net-stall"
	faultNetDelay        = "net-delay"
	faultNetReset        = "net-reset"
	faultFailover        = "failover"
	faultClusterFailover = "cluster-failover"
	faultMigrate         = "migrate"
	faultDel             = "del"
	faultOverwrite       = "overwrite"
	faultFlush           = "flush"
	faultEvict           = "evict"
)

// faultKinds are all the kinds, in the order the report lists them.
var faultKinds = []string{
	faultStop, faultClientKill, faultRestart, faultPause, faultSleep, faultKill,
	faultNetStall, faultNetDelay, faultNetReset, faultFailover, faultClusterFailover, faultMigrate,
	faultDel, faultOverwrite, faultFlush, faultEvict,
}

// faultTitles name the kinds in the report.
var faultTitles = map[string]string{
	faultStop:            "SIGSTOP a holder past its lease, SIGCONT",
	faultClientKill:      "CLIENT KILL the workers' connections",
	faultRestart:         "restart the lock Redis (crash, empty)",
	faultPause:           "CLIENT PAUSE past the lease",
	faultSleep:           "DEBUG SLEEP within the lease",
	faultKill:            "kill -9 a holder, start a replacement",
	faultNetStall:        "stall a holder's connections past its lease",
	faultNetDelay:        "delay a holder's connections 5-50 ms",
	faultNetReset:        "reset a holder's connections",
	faultFailover:        "kill -9 the primary; Sentinel fails over",
	faultClusterFailover: "kill -9 a key's primary; replica takes over",
	faultMigrate:         "move a held key's slot to another primary",
	faultDel:             "DEL a held key",
	faultOverwrite:       "SET a held key to a foreign value, TTL lease/2",
	faultFlush:           "FLUSHALL or FLUSHDB the lock Redis",
	faultEvict:           "fill the lock Redis until it evicts a held key",
}

// isFailover reports whether kind kills a primary for its replica to
// take over.
func isFailover(kind string) bool { return kind == faultFailover || kind == faultClusterFailover }

// victimFault reports whether kind strikes one worker, picked while it
// holds a lock.
func victimFault(kind string) bool {
	switch kind {
	case faultStop, faultKill, faultNetStall, faultNetDelay, faultNetReset:
		return true
	}
	return false
}

// fault is one injected fault. worker and keys name the victim and the keys
// it held when the fault began (victim faults only; worker is -1
// otherwise); a failover's keys are those the killed primary served, and a
// migration's the key whose slot moved. A failover's start is the kill,
// its end the promotion.
type fault struct {
	kind       string
	start, end int64
	worker     int
	keys       []string
	note       string
	// variant is a failover's: forced or detected (see failover.go).
	variant string
	// changes are a key fault's changes of run keys (keyfaults.go).
	changes []keyChange
}

// keyChange is a change of key behind its holders' backs, made between lo
// and hi (unix ns): hi is when the injector knew it was made, the reply of
// its DEL, SET or FLUSHALL, or the notification of an eviction; lo is when
// that command was sent, or for an eviction, when the filler before the
// last one sent by then was (a worker's call may trigger the eviction a
// filler made due).
type keyChange struct {
	key    string
	lo, hi int64
}

// primarySwitch is a replica that became a primary, injected or not, as
// the checker's watcher saw it: at time at, and not yet at since, its
// previous look. until is when the primary it replaced was last seen as
// one: a write that primary took until then may be lost. keys are the
// run's keys the new primary serves.
type primarySwitch struct {
	server           string
	since, at, until int64
	keys             []string
}

// history is everything one phase of a run recorded.
type history struct {
	keys       int // how many lock keys the workers chose from
	lease      time.Duration
	wait       time.Duration
	start, end int64
	workers    []workerRun
	holds      []hold
	renewals   []renewal
	timeouts   []timeout
	goroutines []goroutineRun
	faults     []fault
	switches   []primarySwitch
	// acknowledged: every hold's acquisition waited for a replica's
	// acknowledgement (-wait-replicas).
	acknowledged bool
	// refusal, if set, is what a registry without WithEvictionAllowed did
	// on the evicting lock Redis (checked once a run, before its first
	// phase).
	refusal *refusal
	records map[string]recordState // the fenced store's final state, by key
	// errors are what workers found impossible (a token no observed obtain
	// explains, a failed acquisition other than a timeout): each is a
	// violation, as the history cannot be trusted around it.
	errors []string
	// lostUnlocks counts the unlocks that reported ErrLockLost.
	lostUnlocks int
	// noTokens counts the holds that got no fencing token (lost, or Redis
	// failing, when it was drawn), which skip the store and are not in
	// holds; tokenless are those of them that were lost.
	noTokens  int
	tokenless []tokenless
	// lateCredits counts the holds the tracker credited only after them,
	// as grants a subscription gap that closed late hid (missedGrant).
	lateCredits int
}

// tokenless is a hold that got no fencing token, as it was lost already:
// its Token returned ErrLockLost at told. A key fault's analysis needs
// the local hand-offs among them: they may be the first of a tenure to be
// told (blindtime.go).
type tokenless struct {
	worker, g   int
	key         string
	enter, told int64
	cause       string
	handoff     bool
}

// event is one line a worker writes to its stdout.
type event struct {
	E         string        `json:"e"` // enter, exit, unlock, notoken, renew, timeout, done, error
	G         int           `json:"g,omitempty"`
	Key       string        `json:"k,omitempty"`
	Token     int64         `json:"t,omitempty"`
	Fresh     bool          `json:"f,omitempty"`
	Acq       int64         `json:"acq,omitempty"`
	At        int64         `json:"at,omitempty"`   // enter, exit, the renewal's sending, the timeout, the unlock's return
	Done      int64         `json:"done,omitempty"` // renew: when its reply came back
	Root      int64         `json:"root,omitempty"`
	RootLease time.Duration `json:"rl,omitempty"`
	// RenewedFrom: for a grant, the renewals of the key sent before it
	// carry nothing (failedAttempt.answered).
	RenewedFrom int64     `json:"rf,omitempty"`
	Lost        int64     `json:"lost,omitempty"`
	Read        storeCall `json:"r,omitzero"`
	Write       storeCall `json:"w,omitzero"`
	Value       int64     `json:"v,omitempty"`
	Unlock      unlocked  `json:"u,omitempty"`
	Cause       string    `json:"c,omitempty"` // unlock, notoken: the LossCause Lost named
	Handoff     bool      `json:"h,omitempty"` // notoken: the hold was a local hand-off
	// done: each goroutine's run, how many unlocks reported ErrLockLost,
	// how many holds got no token, and how many were credited late.
	Goroutines  []goroutineRun `json:"gs,omitempty"`
	LostUnlocks int            `json:"lu,omitempty"`
	NoTokens    int            `json:"nt,omitempty"`
	LateCredits int            `json:"lc,omitempty"`
	Msg         string         `json:"msg,omitempty"`
}

// collector builds a phase's history from its workers' events, and knows
// who holds what now, for the injector.
type collector struct {
	mu     sync.Mutex
	h      history
	open   map[[2]int]int // (worker, goroutine) → index of its open hold
	exited map[[2]int]int // (worker, goroutine) → index of its last hold, once it exited
	keys   map[string]string
}

func newCollector(h history, keys []string) *collector {
	c := &collector{h: h, open: make(map[[2]int]int), exited: make(map[[2]int]int), keys: make(map[string]string)}
	for _, k := range keys {
		c.keys[k] = k
	}
	return c
}

func (c *collector) workerStarted(id int, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.h.workers = append(c.h.workers, workerRun{id: id, start: at.UnixNano()})
}

func (c *collector) workerKilled(id int, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range c.h.workers {
		if c.h.workers[i].id == id {
			c.h.workers[i].killed = at.UnixNano()
		}
	}
	for wg := range c.open {
		if wg[0] == id {
			delete(c.open, wg)
		}
	}
}

func (c *collector) fault(f fault) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.h.faults = append(c.h.faults, f)
}

func (c *collector) switched(s primarySwitch) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.h.switches = append(c.h.switches, s)
}

func (c *collector) failed(format string, a ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.h.errors = append(c.h.errors, fmt.Sprintf(format, a...))
}

// add files one event of worker w.
func (c *collector) add(w int, ev event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	// Holds are many; share one string per key instead of one per event.
	key, known := c.keys[ev.Key]
	if ev.Key != "" && !known {
		c.h.errors = append(c.h.errors, fmt.Sprintf("worker %d reported unknown key %q", w, ev.Key))
		return
	}
	switch ev.E {
	case "enter":
		c.open[[2]int{w, ev.G}] = len(c.h.holds)
		c.h.holds = append(c.h.holds, hold{
			worker: w, g: ev.G, key: key, token: ev.Token, fresh: ev.Fresh,
			acq: ev.Acq, enter: ev.At, root: ev.Root, rootLease: ev.RootLease, renewedFrom: ev.RenewedFrom,
		})
	case "exit":
		i, ok := c.take(c.open, w, ev.G, "exited a hold it never entered")
		if !ok {
			return
		}
		c.exited[[2]int{w, ev.G}] = i
		hd := &c.h.holds[i]
		hd.exit, hd.lost, hd.read, hd.write, hd.writeValue = ev.At, ev.Lost, ev.Read, ev.Write, ev.Value
	case "unlock":
		i, ok := c.take(c.exited, w, ev.G, "unlocked a hold it never exited")
		if !ok {
			return
		}
		hd := &c.h.holds[i]
		hd.unlock, hd.unlocked, hd.cause = ev.Unlock, ev.At, ev.Cause
		if hd.lost == 0 {
			hd.lost = ev.Lost
		}
	case "notoken":
		c.h.tokenless = append(c.h.tokenless, tokenless{worker: w, g: ev.G, key: key, enter: ev.At, told: ev.Lost, cause: ev.Cause, handoff: ev.Handoff})
	case "renew":
		c.h.renewals = append(c.h.renewals, renewal{worker: w, key: key, sent: ev.At, done: ev.Done})
	case "timeout":
		c.h.timeouts = append(c.h.timeouts, timeout{worker: w, g: ev.G, key: key, acq: ev.Acq, at: ev.At})
	case "done":
		for _, g := range ev.Goroutines {
			g.worker = w
			c.h.goroutines = append(c.h.goroutines, g)
		}
		c.h.lostUnlocks += ev.LostUnlocks
		c.h.noTokens += ev.NoTokens
		c.h.lateCredits += ev.LateCredits
		for i := range c.h.workers {
			if c.h.workers[i].id == w {
				c.h.workers[i].done = true
			}
		}
	case "error":
		c.h.errors = append(c.h.errors, fmt.Sprintf("worker %d: %s", w, ev.Msg))
	default:
		c.h.errors = append(c.h.errors, fmt.Sprintf("worker %d sent an unknown event %q", w, ev.E))
	}
}

// take removes and returns worker w's goroutine g's hold from holds, or
// files the error that it did what the event says without one. Called
// with mu held.
func (c *collector) take(holds map[[2]int]int, w, g int, what string) (int, bool) {
	i, ok := holds[[2]int{w, g}]
	if !ok {
		c.h.errors = append(c.h.errors, fmt.Sprintf("worker %d goroutine %d %s", w, g, what))
		return 0, false
	}
	delete(holds, [2]int{w, g})
	return i, true
}

// holders returns, for every worker that holds a lock now, the keys it
// holds.
func (c *collector) holders() map[int][]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[int][]string)
	for wg, i := range c.open {
		out[wg[0]] = append(out[wg[0]], c.h.holds[i].key)
	}
	return out
}

func (c *collector) history() *history {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.h
	return &h
}
