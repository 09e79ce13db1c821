package lockreg

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockreg/lockreg/internal/protocol"
)

// Hooks are told what a registry does, for metrics and traces: see
// extra/lockregotel, which builds OpenTelemetry instruments and spans on
// them. Every field is optional. The registry calls them synchronously,
// on the goroutine where the event happens, so they must be quick, must
// not block, and must not call the registry. A registry with no hooks
// pays one atomic load per event, and allocates nothing for them.
type Hooks struct {
	// AcquireStart is called when an acquisition begins, unless it is a
	// reentrant one (a goroutine taking its own hold again, a Do nested in
	// a Do of the key), which costs nothing and is not reported, or one
	// refused before it began (an empty key, a nil context, a registry
	// closed already: only those that Close ended are OutcomeClosed). The
	// context it returns (a span's, say) is the acquisition's from then
	// on, and AcquireAttempt's and AcquireDone's; nil keeps ctx.
	AcquireStart func(ctx context.Context, key string) context.Context
	// AcquireAttempt is called for each attempt to take the key in Redis.
	AcquireAttempt func(ctx context.Context, key string)
	// AcquireDone is called when the acquisition ends; if a panic (a
	// hook's, a client's) ends it, with OutcomeError, to the hooks whose
	// AcquireStart was called (every one, once they all were), and the
	// panic goes on.
	AcquireDone func(ctx context.Context, e AcquireEvent)
	// ReleaseStart and ReleaseDone frame the release of a hold (Release,
	// the last Unlock, Do's), as AcquireStart and AcquireDone frame an
	// acquisition, a panic's included.
	ReleaseStart func(ctx context.Context, key string) context.Context
	ReleaseDone  func(ctx context.Context, e ReleaseEvent)
	// Lost is called when a hold is signalled lost (its Lost channel
	// closes), from the goroutine that found out: often the watchdog's;
	// for a hold whose key Shutdown releases, once that release found
	// what became of the key, whose cause it names, as Err does then.
	// A panic in it is logged, and the registry goes on.
	Lost func(e LossEvent)
	// RedisCalls is called as the registry sends Redis n calls for op;
	// calls that share a pipeline are counted each. A panic in it goes on
	// to the caller of the operation; in the registry's background work
	// (renewals, a tracker's reads, releases aside) it is logged, and the
	// calls fail as on a Redis error.
	RedisCalls func(op RedisOp, n int)
}

// AcquireEvent is an acquisition's end.
type AcquireEvent struct {
	Key string
	// Wait is how long the acquisition took, local waiting included.
	Wait    time.Duration
	Outcome Outcome
	Path    Path  // how the key was taken, when Outcome is OutcomeAcquired
	Err     error // why it was not, otherwise
}

// ReleaseEvent is a release's end.
type ReleaseEvent struct {
	Key string
	// Held is how long the hold lasted, from its acquisition to its
	// release's call.
	Held time.Duration
	// WasLost says that the hold was signalled lost before its release
	// (a LossEvent reported it).
	WasLost bool
	// FoundLost, if not zero, is why the release itself found the hold
	// lost, with no LossEvent before: its lease had run out unrenewed,
	// Redis said the key was not the registry's (LossDeleted, or
	// LossOverwritten where it can tell, LossForced where news of a forced
	// unlock came first), or the read that confirms its
	// local hand-off found the key changed (the cause it names).
	FoundLost LossCause
	Err       error
}

// LossEvent is a hold signalled lost.
type LossEvent struct {
	Key   string
	Cause LossCause
	Held  time.Duration // from the hold's acquisition to the loss
}

// Outcome is how an acquisition ended.
type Outcome string

const (
	OutcomeAcquired    Outcome = "acquired"
	OutcomeNotObtained Outcome = "not_obtained" // its context ended first, or TryLock found the key held
	OutcomeClosed      Outcome = "closed"       // the registry closed
	OutcomeError       Outcome = "error"        // anything else
)

// Path is how an acquisition took its key.
type Path string

const (
	PathRedis   Path = "redis"   // its own call took the key in Redis
	PathHandoff Path = "handoff" // a release of this registry handed the hold off to it
	PathGrant   Path = "grant"   // another registry's release granted it the key
)

// pathIndex is a Path as a hold keeps it.
type pathIndex uint8

const (
	viaRedis pathIndex = iota
	viaHandoff
	viaGrant
)

var paths = [...]Path{PathRedis, PathHandoff, PathGrant}

// path is p's Path, or "" for a value that names none.
func (p pathIndex) path() Path {
	if int(p) < len(paths) {
		return paths[p]
	}
	return ""
}

// RedisOp is what a call to Redis is for.
type RedisOp string

const (
	OpAcquire  RedisOp = "acquire"  // an attempt: a plain SET or obtain.lua
	OpRelease  RedisOp = "release"  // release.lua, a give-back included
	OpRenew    RedisOp = "renew"    // renew.lua, one batch of keys; or SET ... IFEQ, per key
	OpToken    RedisOp = "token"    // token.lua
	OpWithdraw RedisOp = "withdraw" // the withdrawal of a waiting mark
	OpCheck    RedisOp = "check"    // a held key read on the registry's client: without tracking, or while its tracker cannot read it
	OpTrack    RedisOp = "track"    // a held key read to track it, or checked after its invalidation
)

// AddHooks adds hooks to the registry, after those it has; they apply to
// what happens from then on. It is safe to call at any time.
func (r *Registry) AddHooks(h Hooks) {
	r.hooks.mu.Lock()
	defer r.hooks.mu.Unlock()
	var hooks []Hooks
	if current := r.hooks.list.Load(); current != nil {
		hooks = append(hooks, *current...)
	}
	hooks = append(hooks, h)
	r.hooks.list.Store(&hooks)
}

// hookList is a registry's hooks: a list swapped whole, so that reading it
// takes no lock.
type hookList struct {
	mu   sync.Mutex // serializes AddHooks
	list atomic.Pointer[[]Hooks]
	// panicked says that a hook panicked in background work: only the
	// first is logged as an error, as a broken hook panics at every call.
	panicked atomic.Bool
}

// all returns the hooks, or nil: the one check an event costs without any.
func (l *hookList) all() []Hooks {
	if hs := l.list.Load(); hs != nil {
		return *hs
	}
	return nil
}

// countCalls counts n calls to Redis for op, in Stats and to the hooks.
func (r *Registry) countCalls(op RedisOp, n int) {
	switch op {
	case OpAcquire:
		r.stats.acquireCalls.Add(int64(n))
	case OpRelease:
		r.stats.releaseCalls.Add(int64(n))
	case OpRenew:
		r.stats.renewCalls.Add(int64(n))
	}
	for _, hk := range r.hooks.all() {
		if hk.RedisCalls != nil {
			hk.RedisCalls(op, n)
		}
	}
}

// countCallsAside is countCalls for the registry's background work, where
// a hook's panic has no caller to go on to and would crash the process. As
// a foreground panic fails its operation, this one fails the calls (sent
// already, on a tracking connection, whose replies are then ignored) as a
// Redis error would: their holds are handled as on one (a
// renewal is tried again, then its lease lapses, signalled lost). It
// reports the error, or nil.
func (r *Registry) countCallsAside(op RedisOp, calls []*protocol.Call) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = r.hookPanicked(op, v)
			for _, c := range calls {
				c.Cmd = redis.NewCmd(context.Background())
				c.Cmd.SetErr(err)
			}
		}
	}()
	r.countCalls(op, len(calls))
	return nil
}

// hookPanicked logs v, the panic of a hook told of calls for op in
// background work, and returns the error the calls fail with.
func (r *Registry) hookPanicked(op RedisOp, v any) error {
	err := fmt.Errorf("%w: a RedisCalls hook panicked for %s calls: %v", ErrRedis, op, v)
	r.logHookPanic(err, "its calls fail as on a Redis error")
	return err
}

// logHookPanic logs err, a hook's panic that the registry went on from
// (outcome says how): the first as an error, later ones at debug level.
func (r *Registry) logHookPanic(err error, outcome string) {
	if r.hooks.panicked.CompareAndSwap(false, true) {
		r.cfg.logger.Error("lockreg: a hook panicked; "+outcome+" (later panics are logged at debug level)", "error", err)
	} else {
		r.cfg.logger.Debug("lockreg: a hook panicked", "error", err)
	}
}

// tellLost tells a Lost hook of e. Losses are found mostly by the
// registry's own goroutines (the watchdog, a tracker), where a hook's
// panic would crash the process, and on the watchdog end the renewal of
// every other hold: it is logged, and the other hooks are told all the
// same. The loss itself is signalled before (Lost, Err).
func (r *Registry) tellLost(lost func(LossEvent), e LossEvent) {
	defer func() {
		if v := recover(); v != nil {
			r.logHookPanic(fmt.Errorf("a Lost hook panicked for key %q: %v", printedKey(e.Key), v), "the loss is signalled all the same")
		}
	}()
	lost(e)
}

// attempting tells the hooks of an attempt to take key in Redis.
func (r *Registry) attempting(ctx context.Context, key string) {
	for _, hk := range r.hooks.all() {
		if hk.AcquireAttempt != nil {
			hk.AcquireAttempt(ctx, key)
		}
	}
}

// tellAcquireDone tells the hooks that an acquisition ended.
func tellAcquireDone(ctx context.Context, hooks []Hooks, e AcquireEvent) {
	tellEach(hooks, func(hk Hooks) {
		if hk.AcquireDone != nil {
			hk.AcquireDone(ctx, e)
		}
	})
}

// tellReleaseDone tells the hooks that a release ended.
func tellReleaseDone(ctx context.Context, hooks []Hooks, e ReleaseEvent) {
	tellEach(hooks, func(hk Hooks) {
		if hk.ReleaseDone != nil {
			hk.ReleaseDone(ctx, e)
		}
	})
}

// tellEach tells each of hooks, the ones after a hook that panics too:
// each began something (a span) that only its Done hook ends. The panic
// then goes on.
func tellEach(hooks []Hooks, tell func(Hooks)) {
	for i, hk := range hooks {
		told := false
		func() {
			defer func() {
				if !told {
					tellEach(hooks[i+1:], tell)
				}
			}()
			tell(hk)
			told = true
		}()
	}
}
