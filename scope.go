package lockreg

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

// A Do or DoAll is reentrant through its fn's context: the context
// carries the scope of what the call holds, and the calls nested in it
// find their keys there rather than acquire them again.

// HoldFor returns the hold under which a Do or DoAll of this registry
// holding key runs ctx (its fn's context, or one derived from it), or nil:
// fn asks it for its fencing token, say. A context that outlived its Do
// (context.WithoutCancel) has nil once the hold is released.
func (r *Registry) HoldFor(ctx context.Context, key string) *Hold {
	if ctx == nil {
		return nil
	}
	s := scopeOf(ctx).holding(r, key, false)
	if s == nil {
		return nil
	}
	for _, h := range s.holds {
		if h.lock.key == key && !h.wasReleased() {
			return h
		}
	}
	return nil
}

// scope is what a Do or DoAll holds while its fn runs, found through fn's
// context by the calls nested in it.
type scope struct {
	r      *Registry
	holds  []*Hold
	parent *scope // the scope of the call this one is nested in, or nil

	// ended says that fn returned: nested calls no longer run. It is set
	// under mu, which orders it with nested.Add, and read without: a look
	// for the scope holding a key costs a nested call no lock.
	mu     sync.Mutex
	ended  atomic.Bool
	nested sync.WaitGroup
}

type scopeKey struct{}

func scopeOf(ctx context.Context) *scope {
	s, _ := ctx.Value(scopeKey{}).(*scope)
	return s
}

// holding returns the scope, s or one it is nested in, that holds key of
// registry r, or nil; if running, only one whose fn has not returned: a
// call whose context outlived its scope (context.WithoutCancel) acquires
// the key as any other.
func (s *scope) holding(r *Registry, key string, running bool) *scope {
	for ; s != nil; s = s.parent {
		if s.r != r || running && s.ended.Load() {
			continue
		}
		for _, h := range s.holds {
			if h.lock.key == key {
				return s
			}
		}
	}
	return nil
}

// enter counts a nested call in, unless the scope's fn has returned: its
// holds are being released.
func (s *scope) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended.Load() {
		return false
	}
	s.nested.Add(1)
	return true
}

// enterAll enters every scope of scopes, or none. It reports false if
// one's fn has returned (the call must then take that one's keys itself),
// and an error if one of their holds is lost (outerLoss), as the call
// would run unprotected.
func enterAll(scopes []*scope) (bool, error) {
	for i, s := range scopes {
		if !s.enter() {
			exitAll(scopes[:i])
			return false, nil
		}
	}
	if err := outerLoss(scopes); err != nil {
		exitAll(scopes)
		return false, err
	}
	return true, nil
}

// outerLoss returns the error of a nested call under scopes, one of whose
// holds is lost (its lease ran out included, which the watchdog would
// signal only at its next tick) or released already (fn released it
// early, through HoldFor), or nil.
func outerLoss(scopes []*scope) error {
	for _, s := range scopes {
		for _, h := range s.holds {
			if h.wasReleased() {
				return fmt.Errorf("%w: the outer call's hold of %q was released", ErrNotObtained, printedKey(h.Key()))
			}
			if lost := h.lossNow(); lost != nil {
				return errors.Join(fmt.Errorf("%w: the outer call's hold of %q is lost", ErrNotObtained, printedKey(h.Key())), lost)
			}
		}
	}
	return nil
}

func exitAll(scopes []*scope) {
	for _, s := range scopes {
		s.nested.Done()
	}
}

// runNested runs fn for a call whose keys the scopes hold already, and
// reports done; or not done, running nothing, if one's fn has returned
// meanwhile.
func runNested(ctx context.Context, scopes []*scope, fn func(ctx context.Context) error) (done bool, err error) {
	if entered, err := enterAll(scopes); !entered {
		return err != nil, err
	}
	defer exitAll(scopes)
	if ctx.Err() != nil {
		// The outer hold was lost, or the caller stopped waiting: fn would run
		// unprotected, or for nobody.
		// Its error matches ctx's, as an acquisition's does, and its cause
		// (the outer hold's loss, or the caller's own), which may differ.
		err := fmt.Errorf("%w: the outer call's context ended: %w", ErrNotObtained, ctx.Err())
		if cause := context.Cause(ctx); cause != ctx.Err() {
			err = errors.Join(err, cause)
		}
		return true, err
	}
	return true, withOuterLoss(ctx, fn(ctx))
}

// end waits for the nested calls, then releases the holds, in reverse
// order of acquisition.
func (s *scope) end(ctx context.Context) error {
	s.mu.Lock()
	s.ended.Store(true)
	s.mu.Unlock()
	s.nested.Wait()
	return s.r.releaseAll(ctx, s.holds)
}
