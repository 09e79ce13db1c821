//go:build stress

package lockreg_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/lockreg/lockreg"
)

// The checker keeps, per key, the holds inside now and the disturbances
// that struck the key, and judges them as cmd/lockcheck does (overlaps.go,
// blindtime.go), in one process:
//
//   - A hold is live from the return of its acquisition until its holder
//     lets go (its release begins) or its Lost channel closes. Both ends
//     are inside the hold's true interval, so an overlap of live holds is
//     an overlap of true ones.
//   - A tenure is the run of holds that rest on one taking of the key in
//     Redis: a hold taken by its own attempt or a grant, and the local
//     hand-offs after it. Its start is a lower bound of when the call that
//     took the key was sent.
//   - An overlap (a hold entering while another is live) is explained by a
//     disturbance of the key that ended after the older tenure began and
//     began before the newer hold entered: it freed the key for one while
//     the other held it from before. The holder of the older tenure must
//     then be told (Lost, or its release's or token's ErrLockLost), at any
//     time, within lockTold of the disturbance. An overlap that no
//     disturbance explains is a violation, as is one whose stale holder is
//     never told; one whose stale holder was told its lease ran out
//     unrenewed is what a stall on this loaded machine may do, and is
//     counted apart.
//   - A hold inside across a disturbance that took its key (struck) must be
//     told, however the key moved on afterwards.
//   - A token must be above every token of the key returned before the
//     hold's acquisition began; one below a token returned since is a
//     stale holder's, which must be told.

// lockTold bounds how long a struck holder may stay blind, beyond its
// lease: without tracking or pub/sub it would learn at its lease's end,
// at the latest, and this machine is shared.
const lockTold = 2 * time.Second

// stressHold is one hold as the test saw it.
type stressHold struct {
	id     int64
	key    string
	reg    int // the registry's number, in the order they were made
	way    string
	lease  time.Duration
	start  time.Time // the acquisition began
	enter  time.Time // the hold began: the acquisition returned
	exit   time.Time // its holder let go: the release began
	tenure time.Time // the start of its tenure (see above)
	lost   <-chan struct{}
	floor  int64 // the highest token of the key returned before start
	token  int64
	// above: a hold whose higher token was returned before this one's.
	above    *stressHold
	told     time.Time // the first notice that the hold may be lost
	toldBy   string
	cause    string
	cutShort bool // its release failed in Redis, which told nothing
	// released is when its release returned, and releaseErr what.
	released   time.Time
	releaseErr error
	stop       chan struct{}
	watched    chan struct{}
}

// disturbance is an injected change: of one key, or of every key ("");
// of the keys of one registry (reg >= 0), or of any.
type disturbance struct {
	kind    string
	key     string
	reg     int
	lo, hi  time.Time     // the change fell in between
	inside  []*stressHold // the holds live when it began
	history map[string]string
}

type overlap struct {
	older, newer *stressHold
	at           time.Time
	d            *disturbance
	history      string
}

type struck struct {
	d *disturbance
	h *stressHold
}

type keyEvent struct {
	at   time.Time
	what string
}

type stressKey struct {
	inside []*stressHold
	last   map[int]*stressHold // each registry's latest hold of the key
	dist   []*disturbance
	maxTok int64
	maxBy  *stressHold
	ring   [48]keyEvent
	n      int
}

type stressChecker struct {
	mu         sync.Mutex
	t0         time.Time
	seed       uint64
	nextID     int64
	keys       map[string]*stressKey
	overlaps   []overlap
	struck     []struck
	lowTokens  []*stressHold
	violations []string
	tokens     int
	// paths: what each registry's hooks said of its latest acquisition of
	// each key (one goroutine of a registry acquires a key at a time).
	paths     map[[2]any]hookNote
	pathCount map[lockreg.Path]int
}

type hookNote struct {
	attempt time.Time
	path    lockreg.Path
}

func newChecker(seed uint64, keys []string) *stressChecker {
	c := &stressChecker{t0: time.Now(), seed: seed, keys: make(map[string]*stressKey), paths: make(map[[2]any]hookNote), pathCount: make(map[lockreg.Path]int)}
	for _, k := range keys {
		c.keys[k] = &stressKey{last: make(map[int]*stressHold)}
	}
	return c
}

// hooks tells the checker how registry reg's acquisitions took their keys.
func (c *stressChecker) hooks(reg int) lockreg.Hooks {
	return lockreg.Hooks{
		AcquireAttempt: func(_ context.Context, key string) {
			c.mu.Lock()
			n := c.paths[[2]any{reg, key}]
			n.attempt = time.Now()
			c.paths[[2]any{reg, key}] = n
			c.mu.Unlock()
		},
		AcquireDone: func(_ context.Context, e lockreg.AcquireEvent) {
			if e.Outcome == lockreg.OutcomeAcquired {
				c.mu.Lock()
				n := c.paths[[2]any{reg, e.Key}]
				n.path = e.Path
				c.paths[[2]any{reg, e.Key}] = n
				c.mu.Unlock()
			}
		},
	}
}

func (c *stressChecker) since(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return fmt.Sprintf("%.6fs", t.Sub(c.t0).Seconds())
}

// note adds to key's recent history; c.mu is held.
func (c *stressChecker) note(k *stressKey, format string, args ...any) {
	k.ring[k.n%len(k.ring)] = keyEvent{time.Now(), fmt.Sprintf(format, args...)}
	k.n++
}

func (c *stressChecker) history(k *stressKey) string {
	var b strings.Builder
	for i := max(0, k.n-len(k.ring)); i < k.n; i++ {
		e := k.ring[i%len(k.ring)]
		fmt.Fprintf(&b, "\n    %s %s", c.since(e.at), e.what)
	}
	return b.String()
}

func (c *stressChecker) name(h *stressHold) string {
	return fmt.Sprintf("hold %d (%s, registry %d, token %d, tenure %s, enter %s, exit %s, released %s: %v, told %s by %s, cause %q)",
		h.id, h.way, h.reg, h.token, c.since(h.tenure), c.since(h.enter), c.since(h.exit), c.since(h.released), h.releaseErr, c.since(h.told), h.toldBy, h.cause)
}

func (c *stressChecker) violation(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.violationLocked(format, args...)
}

func (c *stressChecker) violationLocked(format string, args ...any) {
	c.violations = append(c.violations, fmt.Sprintf("seed %d: ", c.seed)+fmt.Sprintf(format, args...))
}

// begin records an acquisition about to start.
func (c *stressChecker) begin(key string, reg int, way string, lease time.Duration) *stressHold {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nextID++
	return &stressHold{id: c.nextID, key: key, reg: reg, way: way, lease: lease, start: time.Now(), floor: c.keys[key].maxTok}
}

// enter records that h's acquisition returned, and checks it against the
// holds live now.
func (c *stressChecker) enter(h *stressHold, lost <-chan struct{}) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	k := c.keys[h.key]
	h.enter, h.lost = now, lost
	h.stop, h.watched = make(chan struct{}), make(chan struct{})
	hn := c.paths[[2]any{h.reg, h.key}]
	prev := k.last[h.reg]
	// The attempt hook runs before its call is sent (on clients that do
	// not end calls at their deadline, as these do not), and a grant came
	// after the mark of an attempt or a release made since h began; an
	// attempt before start was an earlier hold's.
	switch {
	case hn.path == lockreg.PathHandoff && prev != nil:
		h.tenure = prev.tenure
	case hn.attempt.After(h.start):
		h.tenure = hn.attempt
	default:
		h.tenure = h.start
	}
	k.last[h.reg] = h
	c.pathCount[hn.path]++
	c.note(k, "enter hold %d (%s, registry %d, %s, tenure %s)", h.id, h.way, h.reg, hn.path, c.since(h.tenure))
	if isClosed(lost) {
		c.toldLocked(h, now, "lost")
	} else {
		for _, o := range k.inside {
			if isClosed(o.lost) {
				c.toldLocked(o, now, "lost")
				continue
			}
			older, newer := o, h
			if h.tenure.Before(o.tenure) {
				older, newer = h, o
			}
			ov := overlap{older: older, newer: newer, at: now}
			c.note(k, "overlap: hold %d entered while hold %d was live", h.id, o.id)
			ov.history = c.history(k)
			c.overlaps = append(c.overlaps, ov)
		}
		k.inside = append(k.inside, h)
	}
	go func() {
		defer close(h.watched)
		select {
		case <-lost:
			c.told(h, time.Now(), "lost")
		case <-h.stop:
		}
	}()
}

func (c *stressChecker) told(h *stressHold, at time.Time, by string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.toldLocked(h, at, by)
}

func (c *stressChecker) toldLocked(h *stressHold, at time.Time, by string) {
	if h.told.IsZero() || at.Before(h.told) {
		if h.told.IsZero() {
			c.note(c.keys[h.key], "hold %d told by %s", h.id, by)
		}
		h.told, h.toldBy = at, by
	}
}

// exit records that h's holder let go: its release is about to begin.
func (c *stressChecker) exit(h *stressHold) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	k := c.keys[h.key]
	h.exit = now
	if isClosed(h.lost) {
		c.toldLocked(h, now, "lost")
	}
	k.inside = slices.DeleteFunc(k.inside, func(o *stressHold) bool { return o == h })
	c.note(k, "exit hold %d", h.id)
}

// released records how h's release ended: err is the release's (or Do's),
// holdErr the hold's Err once it ended, nil where there is no Hold.
func (c *stressChecker) released(h *stressHold, err, holdErr error) {
	now := time.Now()
	close(h.stop)
	<-h.watched
	c.mu.Lock()
	defer c.mu.Unlock()
	h.released, h.releaseErr = now, err
	if isClosed(h.lost) {
		c.toldLocked(h, now, "lost")
	}
	switch {
	case errors.Is(holdErr, lockreg.ErrLockLost):
		c.toldLocked(h, now, "release")
		h.cause = causeOf(holdErr)
	case errors.Is(err, lockreg.ErrLockLost):
		c.toldLocked(h, now, "release")
		h.cause = causeOf(err)
	case errors.Is(err, lockreg.ErrRedis):
		h.cutShort = true
	}
	if errors.Is(err, lockreg.ErrNotHeld) {
		c.violationLocked("the release of %s returned ErrNotHeld: %v", c.name(h), err)
	}
	c.note(c.keys[h.key], "released hold %d: %v", h.id, err)
}

// tokenDrawn checks the token h's Token returned.
func (c *stressChecker) tokenDrawn(h *stressHold, token int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := c.keys[h.key]
	c.tokens++
	h.token = token
	c.note(k, "hold %d token %d", h.id, token)
	switch {
	case token <= h.floor:
		c.violationLocked("fencing: %s got token %d, not above %d, a token of key %s returned before its acquisition began%s",
			c.name(h), token, h.floor, h.key, c.history(k))
	case token <= k.maxTok && k.maxBy != h:
		h.above = k.maxBy
		c.lowTokens = append(c.lowTokens, h)
	}
	if token > k.maxTok {
		k.maxTok, k.maxBy = token, h
	}
}

// heldKey picks a key to disturb: mostly one that is held now.
func (c *stressChecker) heldKey(rng *rand.Rand, keys []string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var held []string
	for _, k := range keys {
		if len(c.keys[k].inside) > 0 {
			held = append(held, k)
		}
	}
	if len(held) > 0 && rng.IntN(5) > 0 {
		return held[rng.IntN(len(held))]
	}
	return keys[rng.IntN(len(keys))]
}

// disturb records that a disturbance is about to begin; done records
// that it ended, and whether it changed anything.
func (c *stressChecker) disturb(kind, key string, reg int) *disturbance {
	c.mu.Lock()
	defer c.mu.Unlock()
	d := &disturbance{kind: kind, key: key, reg: reg, lo: time.Now()}
	for name, k := range c.keys {
		if key == "" || key == name {
			for _, h := range k.inside {
				if reg < 0 || h.reg == reg {
					d.inside = append(d.inside, h)
				}
			}
		}
	}
	return d
}

func (c *stressChecker) done(d *disturbance, changed, strikes bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	d.hi = time.Now()
	if !changed {
		return
	}
	d.history = make(map[string]string)
	for name, k := range c.keys {
		if d.key == "" || d.key == name {
			k.dist = append(k.dist, d)
			c.note(k, "%s (registry %d) from %s", d.kind, d.reg, c.since(d.lo))
			d.history[name] = c.history(k)
		}
	}
	for _, h := range d.inside {
		if strikes && h.exit.IsZero() {
			c.struck = append(c.struck, struck{d, h})
		}
	}
}

// judgement is what finish found.
type judgement struct {
	overlaps, explained, expired, cutShort int
	blindOverlap                           []time.Duration
	blind                                  map[string][]time.Duration // by disturbance kind
	causes                                 map[string]int
}

// finish judges the run, once every hold was released.
func (c *stressChecker) finish() judgement {
	c.mu.Lock()
	defer c.mu.Unlock()
	j := judgement{blind: make(map[string][]time.Duration), causes: make(map[string]int)}
	for _, o := range c.overlaps {
		j.overlaps++
		h := o.older
		// Judged now, not at the overlap: a disturbance may end after it.
		for _, d := range c.keys[h.key].dist {
			if d.hi.After(h.tenure) && d.lo.Before(o.newer.enter) && (d.reg < 0 || d.reg == h.reg) {
				o.d = d
			}
		}
		switch {
		case h.told.IsZero() && h.cutShort:
			j.cutShort++
		case h.told.IsZero():
			c.violationLocked("silent overlap on key %s: %s and %s were live at once at %s; %s held it from before (disturbance: %s) and was never told%s",
				h.key, c.name(o.older), c.name(o.newer), c.since(o.at), c.name(h), c.describe(o.d), o.history)
		case o.d == nil && h.cause == "expired":
			j.expired++
			c.judgeBound(h, o.at, "an overlap after its lease ran out")
		case o.d == nil:
			c.violationLocked("overlap on key %s that no disturbance explains: %s and %s were live at once at %s%s",
				h.key, c.name(o.older), c.name(o.newer), c.since(o.at), o.history)
		default:
			j.explained++
			end := h.told
			if !h.exit.IsZero() && h.exit.Before(end) {
				end = h.exit
			}
			j.blindOverlap = append(j.blindOverlap, max(end.Sub(o.at), 0))
			c.judgeBound(h, o.d.hi, "the "+o.d.kind)
		}
	}
	for _, s := range c.struck {
		h := s.h
		switch {
		case h.told.IsZero() && h.cutShort:
			j.cutShort++
		case h.told.IsZero():
			c.violationLocked("the %s of key %s struck %s, who was never told%s", s.d.kind, h.key, c.name(h), s.d.history[h.key])
		default:
			j.blind[s.d.kind] = append(j.blind[s.d.kind], max(h.told.Sub(s.d.hi), 0))
			j.causes[s.d.kind+":"+h.cause+"/"+h.toldBy]++
			c.judgeBound(h, s.d.hi, "the "+s.d.kind)
		}
	}
	for _, h := range c.lowTokens {
		if h.told.IsZero() && !h.cutShort {
			c.violationLocked("fencing: %s got a token below that of %s, returned before it, and was never told it may be lost",
				c.name(h), c.name(h.above))
		}
	}
	return j
}

// judgeBound checks that h was told within its lease and lockTold of from.
func (c *stressChecker) judgeBound(h *stressHold, from time.Time, what string) {
	if late := h.told.Sub(from); late > h.lease+lockTold {
		c.violationLocked("%s was told %v after %s on key %s", c.name(h), late, what, h.key)
	}
}

func (c *stressChecker) describe(d *disturbance) string {
	if d == nil {
		return "none"
	}
	return fmt.Sprintf("%s of %q by registry %d, %s to %s", d.kind, d.key, d.reg, c.since(d.lo), c.since(d.hi))
}

// causeOf names the LossCause an ErrLockLost error explains, by its text:
// the causes' names are not exported.
func causeOf(err error) string {
	if err == nil {
		return ""
	}
	msg := err.Error()
	for _, c := range [][2]string{
		{"lease ran out unrenewed", "expired"}, {"WithMaxHold", "max_hold"},
		{"deleted or passed to another owner", "deleted"}, {"restart or failover", "restart"},
		{"registry was closed", "closed"}, {"forced its key open", "forced"},
		{"set to another value", "overwritten"}, {"flushed", "flushed"}, {"evicted", "evicted"},
		{"expired, was deleted, or Redis lost it", "gone"},
	} {
		if strings.Contains(msg, c[0]) {
			return c[1]
		}
	}
	return "unnamed"
}

// checkTracking checks that s, if it held keys a while, has tracking on:
// this server never refuses it.
func (e *stressEnv) checkTracking(s *stressRegistry) {
	if st := s.r.Stats(); st.Acquisitions > 0 && !st.Tracking && time.Since(s.made) > 2*time.Second {
		e.chk.violation("registry %d: tracking is off after %d acquisitions, on a server that never refuses it", s.id, st.Acquisitions)
	}
}
