package lockreg

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Do holds the lock of key while fn runs, and returns fn's error.
//
// It acquires the key as Lock.Acquire does (on failure it returns that
// error, matching ErrNotObtained, ErrClosed or ErrServerEvicts, and does
// not run fn; so too, with ErrNotObtained, if the hold is lost already),
// then runs fn with a context derived from ctx that is also cancelled,
// with a context.Cause matching ErrLockLost, as soon as the hold is lost:
// stop the work then. When fn returns, or panics, Do releases the key,
// even if ctx has ended (the release runs bounded by the lease instead); after a
// panic it panics again. It returns fn's error joined with ErrLockLost if
// the hold was lost while fn ran (even if fn returned nil), and with the
// release's error, if any: errors.Is tells "not obtained" from "lost while
// working". A hold fn released itself (through HoldFor) is not released
// again: Do waits for that release, and reports the loss it found.
//
// Do is reentrant through its context: a Do or DoAll of this registry
// whose ctx is fn's context, or derived from it, on any goroutine, runs at
// once for a key the outer call holds, acquiring and releasing nothing;
// the outer Do releases only once such nested calls have returned. A Do
// with an unrelated context waits like any other acquisition, as does a
// Do on a key the calling goroutine holds through Lock, or one whose
// context outlived the outer Do (context.WithoutCancel) once that has
// returned.
func (r *Registry) Do(ctx context.Context, key string, fn func(ctx context.Context) error) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: Do with an empty key", ErrInvalidKey)
	case ctx == nil:
		return errNilContext
	case fn == nil:
		return errNilFunction
	}
	outer := scopeOf(ctx)
	for s := outer.holding(r, key, true); s != nil; s = outer.holding(r, key, true) {
		if done, err := runNested(ctx, []*scope{s}, fn); done {
			return err
		}
	}
	h, err := r.Obtain(key).Acquire(ctx)
	if err != nil {
		return err
	}
	if err := r.lostAlready(ctx, []*Hold{h}, nil); err != nil {
		return err
	}
	return r.runHolding(ctx, outer, []*Hold{h}, fn)
}

// DoAll holds the locks of all keys while fn runs, as Do holds one. It
// takes them one by one in one canonical order, by their Redis keys, with
// duplicates collapsed, so that DoAll calls over overlapping keys, in any
// order and in any process, never deadlock. It is all or nothing: if an
// acquisition fails, or a key it took was lost before it took the last
// (WithMaxHold, say), it releases the keys it took and returns an error
// matching ErrNotObtained (and the failure's cause: the context's error,
// ErrClosed; never ErrLockLost), without running fn. fn's context ends as
// soon as any of the holds is lost. Keys may lie in different Redis
// Cluster slots.
//
// Keys that an outer Do or DoAll of this registry holds, through ctx, are
// not acquired again (see Do); the others are, after them in the order,
// which is not canonical: to stay deadlock-free, nest only calls whose
// keys come after the outer call's. If an outer hold is lost, or released,
// before fn runs, DoAll runs nothing and its error matches ErrNotObtained
// (and the outer call's ErrLockLost, if lost).
func (r *Registry) DoAll(ctx context.Context, keys []string, fn func(ctx context.Context) error) error {
	switch {
	case len(keys) == 0:
		return fmt.Errorf("%w: DoAll with no keys", ErrInvalidKey)
	case slices.Contains(keys, ""):
		return fmt.Errorf("%w: DoAll with an empty key", ErrInvalidKey)
	case ctx == nil:
		return errNilContext
	case fn == nil:
		return errNilFunction
	}
	outer := scopeOf(ctx)
	var nestedIn []*scope
	var locks []*Lock
	for {
		// An outer call whose fn returned meanwhile holds nothing: look again.
		nestedIn, locks = r.partition(outer, keys)
		if len(locks) == 0 {
			if done, err := runNested(ctx, nestedIn, fn); done {
				return err
			}
			continue
		}
		entered, err := enterAll(nestedIn)
		if err != nil {
			return err
		}
		if entered {
			break
		}
	}
	defer exitAll(nestedIn)
	holds, err := r.acquireAll(ctx, locks)
	if err != nil {
		return err
	}
	if err := r.lostAlready(ctx, holds, nestedIn); err != nil {
		return err
	}
	err = r.runHolding(ctx, outer, holds, fn)
	if len(nestedIn) > 0 {
		// The keys the outer calls hold are DoAll's keys too: their loss
		// while fn ran is DoAll's, as it is runNested's.
		err = withOuterLoss(ctx, err)
	}
	return err
}

// partition splits keys into the scopes of the outer calls that hold
// some of them, and the locks of the others, in canonical order, without
// duplicates.
func (r *Registry) partition(outer *scope, keys []string) (nestedIn []*scope, locks []*Lock) {
	locks = make([]*Lock, 0, len(keys))
	for _, key := range keys {
		if s := outer.holding(r, key, true); s != nil {
			if !slices.Contains(nestedIn, s) {
				nestedIn = append(nestedIn, s)
			}
			continue
		}
		locks = append(locks, r.Obtain(key))
	}
	slices.SortFunc(locks, func(a, b *Lock) int { return strings.Compare(a.keys().Lock(), b.keys().Lock()) })
	return nestedIn, slices.CompactFunc(locks, func(a, b *Lock) bool { return a.keys().Lock() == b.keys().Lock() })
}

// acquireAll takes the keys of locks, in their order, or none: it
// releases those it took if an acquisition fails, or if a hook panics
// (the panic then goes on).
func (r *Registry) acquireAll(ctx context.Context, locks []*Lock) ([]*Hold, error) {
	holds := make([]*Hold, 0, len(locks))
	done := false
	defer func() {
		if !done {
			_ = r.releaseAll(ctx, holds)
		}
	}()
	for _, l := range locks {
		h, err := l.Acquire(ctx)
		if err != nil {
			done = true
			err = fmt.Errorf("%w: %d of %d keys taken, released again: %w", ErrNotObtained, len(holds), len(locks), err)
			return nil, errors.Join(err, withoutLoss(r.releaseAll(ctx, holds)))
		}
		holds = append(holds, h)
	}
	done = true
	return holds, nil
}

// lostAlready releases holds and returns an ErrNotObtained error if one
// of them is lost before fn could run: its reply came a lease late, or
// DoAll waited for its other keys past its lease (WithMaxHold, say); or
// if a hold of the outer scopes, whose keys DoAll holds through them, is
// lost (its lease may run out while DoAll waits, unsignalled until the
// watchdog's next tick). fn would run unprotected.
func (r *Registry) lostAlready(ctx context.Context, holds []*Hold, outer []*scope) error {
	i := slices.IndexFunc(holds, func(h *Hold) bool { return h.isLost() || h.leaseOver() })
	if i >= 0 {
		err := fmt.Errorf("%w: key %q was lost before fn could run; released again", ErrNotObtained, printedKey(holds[i].Key()))
		return errors.Join(err, withoutLoss(r.releaseAll(ctx, holds)))
	}
	if err := outerLoss(outer); err != nil {
		return errors.Join(err, withoutLoss(r.releaseAll(ctx, holds)))
	}
	return nil
}

// withoutLoss is err, the error of releasing holds under which no fn ran,
// without the losses it reports: they harmed no work, and would make an
// error that says "not obtained" say "lost while working" too.
func withoutLoss(err error) error {
	if err == nil || !errors.Is(err, ErrLockLost) {
		return err
	}
	parts := unjoin(err)
	if len(parts) == 1 {
		return nil // a loss, and nothing else
	}
	var kept []error
	for _, e := range parts {
		if e = withoutLoss(e); e != nil {
			kept = append(kept, e)
		}
	}
	return errors.Join(kept...)
}

// withOuterLoss joins to err, the error of a call nested in outer calls,
// the loss of an outer hold that ended ctx, if err does not carry it.
func withOuterLoss(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); errors.Is(cause, ErrLockLost) && !errors.Is(err, cause) {
		err = errors.Join(err, cause)
	}
	return err
}

// runHolding runs fn under holds, in a scope nested in outer, and then
// releases them, even if fn panics.
func (r *Registry) runHolding(ctx context.Context, outer *scope, holds []*Hold, fn func(ctx context.Context) error) (err error) {
	fnCtx, cancel := context.WithCancelCause(ctx)
	s := &scope{r: r, holds: holds, parent: outer}
	for _, h := range holds {
		h.whenLost(cancel)
	}
	returned := false
	defer func() {
		cancel(nil)
		releaseErr := s.end(ctx)
		if !returned {
			if releaseErr != nil {
				r.cfg.logger.Warn("lockreg: release failed after fn panicked or exited its goroutine", "error", releaseErr)
			}
			return // the panic, or runtime.Goexit, goes on
		}
		err = joinNew(err, releaseErr)
	}()
	err = fn(context.WithValue(fnCtx, scopeKey{}, s))
	returned = true
	return err
}

// releaseAll releases holds, last first, with a context that ctx's end
// does not cut short.
func (r *Registry) releaseAll(ctx context.Context, holds []*Hold) error {
	if len(holds) == 0 {
		return nil
	}
	ctx, cancel := r.releaseContext(ctx)
	defer cancel()
	var errs []error
	i := len(holds) - 1
	defer func() {
		if i >= 0 {
			// A hook panicked in the release of holds[i]: the holds before
			// it are released all the same, and the panic goes on.
			_ = r.releaseAll(ctx, holds[:i])
		}
	}()
	for ; i >= 0; i-- {
		if err := releaseOwn(ctx, holds[i]); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// releaseOwn releases h, a hold of a Do or DoAll. One that fn released
// first (through HoldFor) is not released again: what counts is how that
// release ended, once it is done (ctx bounding the wait), a loss or
// nothing. ErrNotHeld would say that Do's release failed, and hide the
// loss that fn's release reported and fn may have dropped.
func releaseOwn(ctx context.Context, h *Hold) error {
	if !h.wasReleased() {
		if err := h.Release(ctx); !errors.Is(err, ErrNotHeld) {
			return err
		}
	}
	select {
	case <-h.Done():
	case <-ctx.Done():
	}
	return h.lossError()
}

// joinNew joins to err the errors of more that err does not carry already
// (fn may return the loss that cancelled its context).
func joinNew(err, more error) error {
	if more == nil {
		return err
	}
	errs := []error{err}
	for _, e := range unjoin(more) {
		if err == nil || !errors.Is(err, e) {
			errs = append(errs, e)
		}
	}
	return errors.Join(errs...)
}

func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}
