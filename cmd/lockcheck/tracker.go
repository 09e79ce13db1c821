//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// leaseTracker is a go-redis hook on the lock client that watches for the
// calls a hold's lease rests on, as the library counts it: the obtain
// call that took the key, the draw of its fencing token, and the renewals
// that extended it, each from when it was sent. Seeing them on
// the wire, rather than asking the library, keeps the checker independent
// of the library's own bookkeeping. The renewals the library sends on
// its tracking connections, which no hook reaches, the wiretap on the
// lock client's connections reports (wiretap.go).
//
// A grant, a release that passed the key to this registry, is seen on the
// tracker's own subscription to the registries' grant channels. The tracker
// credits it only as the library's argument allows: it must carry a
// larger token than the last one the registry's latest failed attempt on
// the key reported, and its lease (the grant lease the attempt's mark
// asked for) counts from when that attempt was sent.
type leaseTracker struct {
	mu     sync.Mutex
	roots  map[string]root          // by key: the last obtain or grant that took it
	failed map[string]failedAttempt // by key: the latest failed attempt
	// granted is, by key, the token of the latest grant to this registry:
	// its message may come before the reply of the attempt it followed.
	granted map[string]int64
	// early holds, by grantee and key, the latest grants seen while the
	// registry's client id is still unknown: the message of a grant after
	// its first marked attempt can come before that attempt's reply, which
	// tells the client id.
	early map[string]map[string]int64
	keyOf map[string]string // Redis key → key
	// clientID and grantLease are the registry's, read off its attempts.
	clientID   string
	grantLease time.Duration
	// resubscribed is when the tracker's subscription last came back
	// after its connection was lost (unix ns), 0 if never.
	resubscribed int64
	// history is, by key, what the tracker saw last, oldest first, for
	// the report of a hold it cannot explain.
	history map[string][]string
	out     *emitter
}

// historyLength is how many of its latest observations per key the
// tracker keeps.
const historyLength = 16

// saw records an observation about key. Called with mu held.
func (t *leaseTracker) saw(key, format string, args ...any) {
	h := append(t.history[key], time.Now().Format("15:04:05.000000 ")+fmt.Sprintf(format, args...))
	if len(h) > historyLength {
		h = h[len(h)-historyLength:]
	}
	t.history[key] = h
}

// note records something the worker saw about key.
func (t *leaseTracker) note(key, format string, args ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.saw(key, format, args...)
}

// historyOf reports what the tracker saw last about key, and when its
// subscription last came back.
func (t *leaseTracker) historyOf(key string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	resubscribed := "never"
	if t.resubscribed != 0 {
		resubscribed = time.Unix(0, t.resubscribed).Format("15:04:05.000000")
	}
	return fmt.Sprintf("tracker resubscribed: %s; its latest observations of %s: [%s]", resubscribed, key, strings.Join(t.history[key], "; "))
}

// root is what a hold rests on: the token its obtain or grant drew, when
// the call its lease counts from was sent, and that lease (0: the run's).
type root struct {
	token, sent int64
	lease       time.Duration
	// renewedFrom, for a grant, is when the reply of the call that marked
	// the registry was read (failedAttempt.answered).
	renewedFrom int64
}

// failedAttempt is an obtain call that found the key taken, or a release
// that passed it on, which marked the registry as waiting, and the last
// token its reply carried (0: none). answered is when its reply was read:
// the registry's renewals of the key sent before then are not of the
// tenure a grant that follows begins. After a release that passed the key
// on, a renewal of the tenure it ended can be sent after it, on another
// connection, and still run before it in Redis: it succeeds, and carries
// nothing for the grant.
type failedAttempt struct{ sent, answered, lastToken int64 }

// explained is what rootOf tells about a hold.
type explained struct {
	sent, renewedFrom int64
	lease             time.Duration
	fresh             bool // the hold has the root's own token: not a local hand-off
	// after is, for a hold rootOf could not explain, the latest failed
	// attempt on its key then: missedGrant judges the hold against it.
	after failedAttempt
}

func newLeaseTracker(registry string, keys []string, out *emitter) *leaseTracker {
	t := &leaseTracker{
		roots: make(map[string]root), failed: make(map[string]failedAttempt), granted: make(map[string]int64), early: make(map[string]map[string]int64),
		keyOf: make(map[string]string), history: make(map[string][]string), out: out,
	}
	for _, k := range keys {
		// The library's key scheme for keys without braces or '%'.
		t.keyOf[registry+":{"+k+"}"] = k
	}
	return t
}

// rootOf returns the obtain or grant a hold with token rests on: its own,
// or, for a local hand-off (token one higher per hand-off), its registry's
// last. The library may hear of a grant before the tracker's subscription
// does, so an unexplained hold is looked at again for a second.
//
// A fault that kills connections can make the tracker's subscription miss
// a grant the library's received. So if the subscription came back after
// the latest failed attempt was sent, a hold whose token exceeds the last
// token that attempt reported is credited as that missed grant: it is what
// the message would have said (the fenced store checks the token anyway).
//
// The second is of the worker's running time: a stop fault that freezes
// the worker freezes the tracker's goroutine too, and the grant it has not
// read yet must not count as missed when the worker resumes.
func (t *leaseTracker) rootOf(key string, token int64) (explained, bool) {
	wait := newRunningWait(time.Second, time.Now())
	for ; ; time.Sleep(time.Millisecond) {
		over := wait.over(time.Now())
		t.mu.Lock()
		if f := t.failed[key]; over && t.resubscribed > f.sent {
			t.saw(key, "hold with token %d credited as a grant missed in a subscription gap", token)
			t.granted[key] = max(t.granted[key], token)
			t.credit(key)
		}
		r, d := t.roots[key], token-t.roots[key].token
		t.mu.Unlock()
		if r.token != 0 && d >= 0 && d <= maxHandoffs {
			return explained{sent: r.sent, renewedFrom: r.renewedFrom, lease: r.lease, fresh: d == 0}, true
		}
		if over {
			t.mu.Lock()
			defer t.mu.Unlock()
			return explained{after: t.failed[key]}, false
		}
	}
}

// gapWait bounds, in running time, how long missedGrant waits for a
// subscription to come back: longer than a Cluster failover fault keeps
// its killed node down (about 4s).
const gapWait = 8 * time.Second

// missedGrant reports whether a hold of key with token, which rootOf could
// not explain, rests on a grant that the tracker's subscriptions missed in
// a gap that closed only later: a node killed right after it published the
// grant comes back seconds afterwards, and only then does the subscription
// that would have carried it. It waits, in running time, up to wait for a
// subscription to come back after f, the failed attempt the hold came
// after, and then judges as rootOf's credit rule does. The worker calls it
// in the background, after the hold: a goroutine holding the key must not
// wait for a node to come back, since the others' waits are bounded.
func (t *leaseTracker) missedGrant(key string, token int64, f failedAttempt, wait time.Duration) bool {
	running := newRunningWait(wait, time.Now())
	for ; ; time.Sleep(10 * time.Millisecond) {
		over := running.over(time.Now())
		t.mu.Lock()
		if f.lastToken > 0 && token > f.lastToken && t.resubscribed > f.sent {
			t.saw(key, "hold with token %d credited, after it, as a grant missed in a subscription gap", token)
			t.mu.Unlock()
			return true
		}
		t.mu.Unlock()
		if over {
			return false
		}
	}
}

// stall is the longest step of a polling loop that counts as running time:
// a longer one means the process was stopped (or starved) meanwhile.
const stall = 100 * time.Millisecond

// runningWait is a wait of a given length counted in the process's running
// time, as far as a loop that checks it every millisecond or so can tell:
// steps longer than stall are left out.
type runningWait struct {
	left time.Duration
	last time.Time
}

func newRunningWait(d time.Duration, now time.Time) *runningWait {
	return &runningWait{left: d, last: now}
}

// over reports, at now, whether the wait is over.
func (w *runningWait) over(now time.Time) bool {
	if step := now.Sub(w.last); step < stall {
		w.left -= step
	}
	w.last = now
	return w.left <= 0
}

// watchGrants subscribes to the grant channels of registry's registries
// (<registry>:released:<client id>) on each of the lock Redis's servers,
// addrs, and credits the grants they carry until stop is called. Every
// server gets every message (a replica by replication, a cluster node by
// the cluster bus), so that a grant is missed only if every subscription
// misses it: one alone could sit on a replica that a failover fault
// freezes while the primary publishes. It returns once a subscription is
// open, so that one is open before the registry's first attempt; any
// server that answers later counts as a resubscription.
func (t *leaseTracker) watchGrants(addrs []string, registry string) (stop func(), err error) {
	var subs []*redis.PubSub
	var wg sync.WaitGroup
	stop = func() {
		for _, sub := range subs {
			_ = sub.Close()
		}
		wg.Wait()
	}
	open := 0
	for _, addr := range addrs {
		c := redis.NewClient(&redis.Options{Addr: addr})
		sub := c.PSubscribe(context.Background(), registry+":released:*")
		subs = append(subs, sub)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		if _, err := sub.Receive(ctx); err == nil {
			open++
		}
		cancel()
		wg.Go(func() {
			defer c.Close()
			// Any subscription after the one confirmed above is go-redis
			// resubscribing on a new connection.
			for msg := range sub.ChannelWithSubscriptions() {
				switch msg := msg.(type) {
				case *redis.Message:
					t.grant(msg.Payload)
				case *redis.Subscription:
					t.mu.Lock()
					t.resubscribed = time.Now().UnixNano()
					t.mu.Unlock()
				}
			}
		})
	}
	if open == 0 {
		stop()
		return nil, fmt.Errorf("subscribe to the grants on %v: no server answered", addrs)
	}
	return stop, nil
}

// grant credits a notification 'g<token>:<client id>:<key>' on a grant
// channel, if it grants a key to this registry after its latest
// failed attempt.
func (t *leaseTracker) grant(note string) {
	body, ok := strings.CutPrefix(note, "g")
	if !ok {
		return
	}
	tokenText, rest, _ := strings.Cut(body, ":")
	grantee, key, _ := strings.Cut(rest, ":")
	token, err := strconv.ParseInt(tokenText, 10, 64)
	if err != nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.clientID == "" && grantee != "" {
		if t.early[grantee] == nil {
			t.early[grantee] = make(map[string]int64)
		}
		t.early[grantee][key] = max(t.early[grantee][key], token)
		return
	}
	// Each server delivers the message: a copy adds nothing.
	if grantee == "" || grantee != t.clientID || token <= t.granted[key] {
		return
	}
	t.saw(key, "grant with token %d", token)
	t.granted[key] = max(t.granted[key], token)
	t.credit(key)
}

// credit makes the latest grant of key the root of its holds if it
// followed the latest failed attempt, whichever of the two was seen last,
// and no obtain took the key since that attempt: a grant whose message
// came late may have found the key taken by the registry's next attempt
// already, and the hold rests on that attempt. Called with mu held.
func (t *leaseTracker) credit(key string) {
	f, token, r := t.failed[key], t.granted[key], t.roots[key]
	if f.lastToken <= 0 || token <= f.lastToken || token < r.token || r.sent > f.sent || t.grantLease <= 0 {
		return
	}
	t.roots[key] = root{token: token, sent: f.sent, lease: t.grantLease, renewedFrom: f.answered}
	t.saw(key, "credited the grant with token %d", token)
}

// sawMark records the call that marked the registry as waiting for key
// (a failed attempt, or a release that passed the key on), with the
// registry's client id and mark ('<client id>:<grant lease ms>'), and
// credits a grant already seen. Called with mu held.
func (t *leaseTracker) sawMark(key string, f failedAttempt, clientID, mark string) {
	t.failed[key] = f
	if t.clientID == "" {
		for k, token := range t.early[clientID] {
			t.saw(k, "grant with token %d, before the client id was known", token)
			t.granted[k] = max(t.granted[k], token)
		}
		t.early = nil
	}
	t.clientID = clientID
	if _, ms, ok := strings.Cut(mark, ":"); ok {
		if n, err := strconv.Atoi(ms); err == nil {
			t.grantLease = time.Duration(n) * time.Millisecond
		}
	}
	t.credit(key)
}

func (t *leaseTracker) lastToken(key string) int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.roots[key].token
}

func (t *leaseTracker) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessPipelineHook sees the calls the library pipelines (concurrent
// acquisitions and releases beyond a few in flight, and each tick's
// renewals). Every call in a pipeline is sent no earlier than the pipeline.
func (t *leaseTracker) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		sent := time.Now().UnixNano()
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			if cmd.Err() == nil {
				t.observe(cmd, sent)
			} else {
				t.failedCall(cmd, cmd.Err())
			}
		}
		return err
	}
}

func (t *leaseTracker) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		sent := time.Now().UnixNano()
		err := next(ctx, cmd)
		if err != nil {
			t.failedCall(cmd, err)
			return err
		}
		// go-redis sets a command's error from the hooks' result only once
		// they return: a command a Redis Cluster redirection (MOVED, ASK)
		// sends again still carries the error of the node before.
		cmd.SetErr(nil)
		t.observe(cmd, sent)
		return nil
	}
}

// failedCall notes a call on a lock key that failed, for the report of a
// hold the tracker cannot explain: it may have run in Redis all the same.
func (t *leaseTracker) failedCall(cmd redis.Cmder, err error) {
	args := cmd.Args()
	if len(args) < 2 || redis.HasErrorPrefix(err, "NOSCRIPT") {
		return // a script not loaded yet did not run: EVAL follows
	}
	name := cmd.Name()
	lock := args[1]
	if name == "evalsha" || name == "eval" {
		if len(args) < 4 {
			return
		}
		lock = args[3]
	}
	if key, known := t.keyOf[fmt.Sprint(lock)]; known {
		t.mu.Lock()
		t.saw(key, "%s with %d arguments failed: %v", name, len(args), err)
		t.mu.Unlock()
	}
}

// observe recognizes the library's calls by their shape: a plain SET of a
// lock key with NX takes it; obtain.lua takes four keys (lock, fence,
// waiting marker, queue) and five arguments (client id, lease, mark time,
// unmark, mark), the mark starting with the client id, and answers 1 when
// it took the key, or minus the last token when the key was taken
// (release.lua takes as many, and its fifth is the key; when it also
// takes the registry's mark, seventh of eight, and answers below zero, it
// passed the key on and marked the registry, as a failed attempt sent
// with it would have, with minus the grant's token); token.lua takes
// two keys (lock, fence) and two arguments (client id, lease) and answers
// the hold's token; renew.lua takes the keys to renew and two arguments
// (client id, lease) and answers 1 or 0 per key. While a key's slot
// migrates between cluster nodes, obtain.lua and token.lua run on the lock's
// key alone (see their comments): obtain.lua then answers 1 or 0 and
// marks nothing, token.lua the clock's token. Were the calls to change
// shape, holds would go unexplained and the run would fail loudly.
func (t *leaseTracker) observe(cmd redis.Cmder, sent int64) {
	args := cmd.Args()
	if cmd.Name() == "set" && len(args) == 6 && fmt.Sprint(args[5]) == "nx" {
		if key, known := t.keyOf[fmt.Sprint(args[1])]; known {
			t.mu.Lock()
			t.roots[key] = root{sent: sent}
			t.saw(key, "SET NX took it")
			t.mu.Unlock()
		}
		return
	}
	// A native renewal, where the server has it: SET <key> <id> IFEQ <id>
	// PX <lease>, OK when renewed, nil when the key is not the registry's.
	if cmd.Name() == "set" && len(args) == 7 && fmt.Sprint(args[3]) == "ifeq" {
		if err := cmd.Err(); err == nil || errors.Is(err, redis.Nil) {
			renewed := int64(0)
			if err == nil {
				renewed = 1
			}
			t.renewed(args[1:2], []int64{renewed}, sent)
		}
		return
	}
	if name := cmd.Name(); name != "evalsha" && name != "eval" {
		return
	}
	c, ok := cmd.(*redis.Cmd)
	// args: name, script, number of keys, keys..., arguments...
	if !ok || len(args) < 3 {
		return
	}
	n, ok := args[2].(int)
	if !ok || len(args) < 3+n {
		return
	}
	keys, argv := args[3:3+n], args[3+n:]
	if n == 0 {
		return
	}
	if renewed, err := c.Int64Slice(); err == nil {
		if len(argv) == 2 && len(renewed) == n {
			t.renewed(keys, renewed, sent)
		}
		return
	}
	answered := time.Now().UnixNano() // the library reads the reply after the hooks return
	reply, err := c.Int64()
	key, known := t.keyOf[fmt.Sprint(keys[0])]
	if err != nil || !known {
		return
	}
	// marks reports whether argument i is the registry's mark, which
	// starts with its client id, the first argument.
	marks := func(i int) bool { return len(argv) > i && strings.HasPrefix(fmt.Sprint(argv[i]), fmt.Sprint(argv[0])) }
	fenced := n > 1 && strings.HasSuffix(fmt.Sprint(keys[1]), ":fence")
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case n == 1 && len(argv) == 5 && marks(4):
		if reply != 1 {
			t.saw(key, "obtain.lua on the lock's key alone found it taken")
			return
		}
		t.roots[key] = root{sent: sent}
		t.saw(key, "obtain.lua on the lock's key alone took it")
	case n == 4 && fenced && len(argv) == 5 && marks(4):
		if reply > 0 {
			t.roots[key] = root{sent: sent}
			t.saw(key, "obtain.lua took it")
			return
		}
		t.saw(key, "obtain.lua failed and marked, last token %d", -reply)
		t.sawMark(key, failedAttempt{sent: sent, answered: answered, lastToken: -reply}, fmt.Sprint(argv[0]), fmt.Sprint(argv[4]))
	case n == 1 && len(argv) == 8:
		t.saw(key, "release on the lock's key alone answered %d", reply)
	case n == 4 && fenced && len(argv) == 8 && marks(6):
		if reply >= 0 {
			t.saw(key, "release answered %d", reply)
			return
		}
		t.saw(key, "release granted it away with token %d and marked", -reply)
		t.sawMark(key, failedAttempt{sent: sent, answered: answered, lastToken: -reply}, fmt.Sprint(argv[0]), fmt.Sprint(argv[6]))
	case len(argv) == 2 && (n == 2 && fenced || n == 1) && reply > 0:
		// A token drawn for the hold the latest obtain began: only the
		// first draw of a hold, or of a run of local hand-offs, may come
		// from Redis. A draw for a hold whose root has a token already is
		// left unexplained.
		if r := t.roots[key]; r.token == 0 && r.sent != 0 {
			r.token = reply
			t.roots[key] = r
			t.saw(key, "drew token %d", reply)
		} else {
			t.saw(key, "drew token %d for a root with token %d: unexplained", reply, r.token)
		}
	}
}

// renewed emits the renewals a renew.lua call of keys, sent at sent,
// made: those whose reply is 1. The wiretap calls it too, on the
// goroutines that read the connections: it only reads keyOf, fixed once
// made, and emit locks.
func (t *leaseTracker) renewed(keys []any, replies []int64, sent int64) {
	done := time.Now().UnixNano() // observe runs once the reply is in
	for i, k := range keys {
		if key, known := t.keyOf[fmt.Sprint(k)]; known && replies[i] == 1 {
			t.out.emit(event{E: "renew", Key: key, At: sent, Done: done})
		}
	}
}
