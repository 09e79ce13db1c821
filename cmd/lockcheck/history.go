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

// Hold is one critical section: from the return of LockContext (Enter) to
// the last act under the lock (Exit), which the worker records before it
// unlocks.
type Hold struct {
	Worker, G int
	Key       string
	Token     int64
	// Fresh: the token came from obtain.lua; otherwise the hold was a
	// local hand-off within its registry, which rests on the same obtain.
	Fresh bool
	Acq   int64 // LockContext was called
	Enter int64
	// Root is when the obtain call the hold rests on was sent: the lease
	// is counted from there, as the library counts it. For a grant (a
	// release that passed the key to the hold's registry), it is when the
	// failed attempt the grant followed was sent, and RootLease is the
	// grant's lease; otherwise RootLease is 0 (the run's lease).
	Root      int64
	RootLease time.Duration
	Exit      int64 // 0: the worker died inside (kill -9)
	// Lost is when Lost() fired, before Exit or while the unlock ran
	// (0: it did not); only a Lost before Exit ends the live interval.
	Lost int64
	// Unlock is what the hold's unlock returned; 0 if the worker died
	// before it did.
	Unlock Unlocked
	Read   Op
	// Write is only tried after an accepted read; WriteValue is the value
	// it wrote (the read's value + 1).
	Write      Op
	WriteValue int64
}

// Op is one call to the fenced store: sent, answered, and the answer.
type Op struct {
	Sent    int64   `json:"s,omitempty"`
	Done    int64   `json:"d,omitempty"`
	Outcome Outcome `json:"o,omitempty"`
}

// Unlocked is what an unlock returned.
type Unlocked int8

const (
	UnlockOK     Unlocked = iota + 1
	UnlockLost            // ErrLockLost: the hold was told it may have lost the key
	UnlockFailed          // another error (Redis failing)
)

// Renewal is a renewal call that extended a worker's lease on key, sent
// at Sent and answered at Done.
type Renewal struct {
	Worker     int
	Key        string
	Sent, Done int64
}

// Timeout is an acquisition that waited the full -wait without the lock.
type Timeout struct {
	Worker, G int
	Key       string
	Acq, At   int64
}

// GoroutineRun is what a worker goroutine did over the run.
type GoroutineRun struct {
	Worker       int   `json:"-"`
	G            int   `json:"g"`
	First        int64 `json:"first"` // its first attempt; 0: none
	Acquisitions int   `json:"n"`
}

// WorkerRun is one worker process's life.
type WorkerRun struct {
	ID     int
	Start  int64
	Killed int64 // 0: not killed
	Done   bool  // it finished the run and reported its goroutines
}

// Fault kinds. The first six fault a single lock Redis; stop and kill-9
// fault a worker, and the net- kinds its connections, on any topology.
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
)

// faultKinds are all the kinds, in the order the report lists them.
var faultKinds = []string{
	faultStop, faultClientKill, faultRestart, faultPause, faultSleep, faultKill,
	faultNetStall, faultNetDelay, faultNetReset, faultFailover, faultClusterFailover, faultMigrate,
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

// Fault is one injected fault. Worker and Keys name the victim and the keys
// it held when the fault began (victim faults only; Worker is -1
// otherwise); a failover's Keys are those the killed primary served, and a
// migration's the key whose slot moved. A failover's Start is the kill,
// its End the promotion.
type Fault struct {
	Kind       string   `json:"kind"`
	Start, End int64    `json:"-"`
	Worker     int      `json:"worker"`
	Keys       []string `json:"keys,omitempty"`
	Note       string   `json:"note,omitempty"`
	// Variant is a failover's: forced or detected (see failover.go).
	Variant string `json:"variant,omitempty"`
}

// Switch is a replica that became a primary, injected or not, as the
// checker's watcher saw it: at At, and not yet at Since, its previous look.
// Until is when the primary it replaced was last seen as one: a write that
// primary took until then may be lost. Keys are the run's keys the new
// primary serves.
type Switch struct {
	Server           string   `json:"server"`
	Since, At, Until int64    `json:"-"`
	Keys             []string `json:"keys"`
}

// History is everything one phase of a run recorded.
type History struct {
	Keys       int // how many lock keys the workers chose from
	Lease      time.Duration
	Wait       time.Duration
	Start, End int64
	Workers    []WorkerRun
	Holds      []Hold
	Renewals   []Renewal
	Timeouts   []Timeout
	Goroutines []GoroutineRun
	Faults     []Fault
	Switches   []Switch
	// Acknowledged: every hold's acquisition waited for a replica's
	// acknowledgement (-wait-replicas).
	Acknowledged bool
	Records      map[string]Record // the fenced store's final state, by key
	// Errors are what workers found impossible (a token no observed obtain
	// explains, a failed acquisition other than a timeout): each is a
	// violation, as the history cannot be trusted around it.
	Errors []string
	// LostUnlocks counts the unlocks that reported ErrLockLost.
	LostUnlocks int
	// NoTokens counts the holds that got no fencing token (lost, or Redis
	// failing, when it was drawn), which skip the store and are not in
	// Holds.
	NoTokens int
}

// event is one line a worker writes to its stdout.
type event struct {
	E         string        `json:"e"` // enter, exit, unlock, renew, timeout, done, error
	G         int           `json:"g,omitempty"`
	Key       string        `json:"k,omitempty"`
	Token     int64         `json:"t,omitempty"`
	Fresh     bool          `json:"f,omitempty"`
	Acq       int64         `json:"acq,omitempty"`
	At        int64         `json:"at,omitempty"`   // enter, exit, the renewal's sending, the timeout
	Done      int64         `json:"done,omitempty"` // renew: when its reply came back
	Root      int64         `json:"root,omitempty"`
	RootLease time.Duration `json:"rl,omitempty"`
	Lost      int64         `json:"lost,omitempty"`
	Read      Op            `json:"r,omitzero"`
	Write     Op            `json:"w,omitzero"`
	Value     int64         `json:"v,omitempty"`
	Unlock    Unlocked      `json:"u,omitempty"`
	// done: each goroutine's run, how many unlocks reported ErrLockLost
	// and how many holds got no token.
	Goroutines  []GoroutineRun `json:"gs,omitempty"`
	LostUnlocks int            `json:"lu,omitempty"`
	NoTokens    int            `json:"nt,omitempty"`
	Msg         string         `json:"msg,omitempty"`
}

// collector builds a phase's History from its workers' events, and knows
// who holds what now, for the injector.
type collector struct {
	mu     sync.Mutex
	h      History
	open   map[[2]int]int // (worker, goroutine) → index of its open hold
	exited map[[2]int]int // (worker, goroutine) → index of its last hold, once it exited
	keys   map[string]string
}

func newCollector(h History, keys []string) *collector {
	c := &collector{h: h, open: make(map[[2]int]int), exited: make(map[[2]int]int), keys: make(map[string]string)}
	for _, k := range keys {
		c.keys[k] = k
	}
	return c
}

func (c *collector) workerStarted(id int, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.h.Workers = append(c.h.Workers, WorkerRun{ID: id, Start: at.UnixNano()})
}

func (c *collector) workerKilled(id int, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range c.h.Workers {
		if c.h.Workers[i].ID == id {
			c.h.Workers[i].Killed = at.UnixNano()
		}
	}
	for wg := range c.open {
		if wg[0] == id {
			delete(c.open, wg)
		}
	}
}

func (c *collector) fault(f Fault) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.h.Faults = append(c.h.Faults, f)
}

func (c *collector) switched(s Switch) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.h.Switches = append(c.h.Switches, s)
}

func (c *collector) failed(format string, a ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.h.Errors = append(c.h.Errors, fmt.Sprintf(format, a...))
}

// add files one event of worker w.
func (c *collector) add(w int, ev event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	// Holds are many; share one string per key instead of one per event.
	key, known := c.keys[ev.Key]
	if ev.Key != "" && !known {
		c.h.Errors = append(c.h.Errors, fmt.Sprintf("worker %d reported unknown key %q", w, ev.Key))
		return
	}
	switch ev.E {
	case "enter":
		c.open[[2]int{w, ev.G}] = len(c.h.Holds)
		c.h.Holds = append(c.h.Holds, Hold{
			Worker: w, G: ev.G, Key: key, Token: ev.Token, Fresh: ev.Fresh,
			Acq: ev.Acq, Enter: ev.At, Root: ev.Root, RootLease: ev.RootLease,
		})
	case "exit":
		i, ok := c.take(c.open, w, ev.G, "exited a hold it never entered")
		if !ok {
			return
		}
		c.exited[[2]int{w, ev.G}] = i
		hd := &c.h.Holds[i]
		hd.Exit, hd.Lost, hd.Read, hd.Write, hd.WriteValue = ev.At, ev.Lost, ev.Read, ev.Write, ev.Value
	case "unlock":
		i, ok := c.take(c.exited, w, ev.G, "unlocked a hold it never exited")
		if !ok {
			return
		}
		hd := &c.h.Holds[i]
		hd.Unlock = ev.Unlock
		if hd.Lost == 0 {
			hd.Lost = ev.Lost
		}
	case "renew":
		c.h.Renewals = append(c.h.Renewals, Renewal{Worker: w, Key: key, Sent: ev.At, Done: ev.Done})
	case "timeout":
		c.h.Timeouts = append(c.h.Timeouts, Timeout{Worker: w, G: ev.G, Key: key, Acq: ev.Acq, At: ev.At})
	case "done":
		for _, g := range ev.Goroutines {
			g.Worker = w
			c.h.Goroutines = append(c.h.Goroutines, g)
		}
		c.h.LostUnlocks += ev.LostUnlocks
		c.h.NoTokens += ev.NoTokens
		for i := range c.h.Workers {
			if c.h.Workers[i].ID == w {
				c.h.Workers[i].Done = true
			}
		}
	case "error":
		c.h.Errors = append(c.h.Errors, fmt.Sprintf("worker %d: %s", w, ev.Msg))
	default:
		c.h.Errors = append(c.h.Errors, fmt.Sprintf("worker %d sent an unknown event %q", w, ev.E))
	}
}

// take removes and returns worker w's goroutine g's hold from holds, or
// files the error that it did what the event says without one. Called
// with mu held.
func (c *collector) take(holds map[[2]int]int, w, g int, what string) (int, bool) {
	i, ok := holds[[2]int{w, g}]
	if !ok {
		c.h.Errors = append(c.h.Errors, fmt.Sprintf("worker %d goroutine %d %s", w, g, what))
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
		out[wg[0]] = append(out[wg[0]], c.h.Holds[i].Key)
	}
	return out
}

func (c *collector) history() *History {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.h
	return &h
}
