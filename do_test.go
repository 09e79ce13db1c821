package lockreg

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg/internal/protocol"
	"github.com/lockreg/lockreg/internal/redisstat"
	"github.com/lockreg/lockreg/internal/redistest"
)

func TestDoHoldsTheKeyWhileFnRuns(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client)
	redisKey := r.Obtain("k").keys().Lock()
	errFn := errors.New("fn failed")
	err := r.Do(ctx, "k", func(ctx context.Context) error {
		assert.Equal(t, r.clientID, client.Get(ctx, redisKey).Val(), "held while fn runs")
		assert.NoError(t, ctx.Err())
		return errFn
	})
	require.Same(t, errFn, err, "fn's error, as it is")
	require.Zero(t, client.Exists(ctx, redisKey).Val(), "released after")
	requireNoLocalState(t, r)
}

// TestHoldForFindsDosHold: fn reaches its hold through its context, for
// its fencing token; nothing else does.
func TestHoldForFindsDosHold(t *testing.T) {
	ctx := context.Background()
	r := newRegistry(t, redistest.Shared(t).Client(t))
	other := newRegistry(t, redistest.Shared(t).Client(t))
	require.Nil(t, r.HoldFor(ctx, "k"))
	require.NoError(t, r.DoAll(ctx, []string{"k", "j"}, func(ctx context.Context) error {
		h := r.HoldFor(ctx, "k")
		require.NotNil(t, h)
		require.Equal(t, "k", h.Key())
		token, err := h.Token(ctx)
		require.NoError(t, err)
		require.Positive(t, token)
		require.Equal(t, "j", r.HoldFor(ctx, "j").Key())
		require.Nil(t, r.HoldFor(ctx, "x"), "a key it does not hold")
		require.Nil(t, other.HoldFor(ctx, "k"), "another registry's")
		return nil
	}))
}

func TestDoRejectsAnEmptyKey(t *testing.T) {
	r := newRegistry(t, redistest.Shared(t).Client(t))
	ran := false
	fn := func(context.Context) error { ran = true; return nil }
	require.ErrorIs(t, r.Do(context.Background(), "", fn), ErrInvalidKey)
	require.ErrorIs(t, r.DoAll(context.Background(), nil, fn), ErrInvalidKey)
	require.ErrorIs(t, r.DoAll(context.Background(), []string{"a", ""}, fn), ErrInvalidKey)
	require.False(t, ran)
}

// TestDoTellsNotObtainedFromLost: a Do that could not take the key runs
// nothing and says ErrNotObtained; one that lost it while fn ran cancels
// fn's context with the loss as its cause and says ErrLockLost, even if fn
// returned nil.
func TestDoTellsNotObtainedFromLost(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	other := newRegistry(t, client)
	const lease = 300 * time.Millisecond
	r := newRegistry(t, client, WithExpireAfter(lease), WithRetryInterval(20*time.Millisecond))

	h, err := other.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	ran := false
	err = r.Do(short, "k", func(context.Context) error { ran = true; return nil })
	require.ErrorIs(t, err, ErrNotObtained)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NotErrorIs(t, err, ErrLockLost)
	require.False(t, ran)
	require.NoError(t, h.Release(ctx))

	err = r.Do(ctx, "k", func(ctx context.Context) error {
		require.NoError(t, client.Del(ctx, r.Obtain("k").keys().Lock()).Err())
		requireFires(t, ctx.Done(), 5*time.Second, "the next renewal, within lease/3, finds the key gone")
		assert.ErrorIs(t, context.Cause(ctx), ErrLockLost)
		return nil
	})
	require.ErrorIs(t, err, ErrLockLost)
	require.NotErrorIs(t, err, ErrNotObtained)

	// fn returning the cause does not make the loss say itself twice.
	err = r.Do(ctx, "k", func(ctx context.Context) error {
		require.NoError(t, client.Del(ctx, r.Obtain("k").keys().Lock()).Err())
		requireFires(t, ctx.Done(), 5*time.Second, "lost")
		return context.Cause(ctx)
	})
	require.ErrorIs(t, err, ErrLockLost)
	require.Len(t, unjoin(err), 1, "%v", err)
}

func TestDoReleasesWhenFnPanicsAndPanicsAgain(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client)
	require.PanicsWithValue(t, "boom", func() {
		_ = r.Do(ctx, "k", func(context.Context) error { panic("boom") })
	})
	require.Zero(t, client.Exists(ctx, r.Obtain("k").keys().Lock()).Val(), "released before the panic went on")
	requireNoLocalState(t, r)
}

func TestDoReleasesWhenItsContextEnded(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client)
	ctx, cancel := context.WithCancel(context.Background())
	err := r.Do(ctx, "k", func(ctx context.Context) error {
		cancel()
		return ctx.Err()
	})
	require.ErrorIs(t, err, context.Canceled)
	require.Zero(t, client.Exists(context.Background(), r.Obtain("k").keys().Lock()).Val(), "released with a context of its own")
}

// TestDoIsReentrantThroughItsContext: a Do nested through fn's context,
// even on another goroutine, runs at once, at no cost in Redis; one with
// an unrelated context waits; one whose outer Do has returned runs
// nothing; the outer Do releases only after the nested ones returned.
func TestDoIsReentrantThroughItsContext(t *testing.T) {
	ctx := context.Background()
	var counter redisstat.Counter
	client := redistest.Shared(t).Client(t, &counter)
	r := newRegistry(t, client)
	redisKey := r.Obtain("k").keys().Lock()
	var escaped context.Context
	var innerDone atomic.Bool
	err := r.Do(ctx, "k", func(ctx context.Context) error {
		escaped = ctx
		requireSettled(t, r)
		calls := counter.RoundTrips()
		inGoroutine(func() {
			derived, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			assert.NoError(t, r.Do(derived, "k", func(context.Context) error { return nil }), "nested through the context")
			assert.NoError(t, r.DoAll(derived, []string{"k", "k"}, func(context.Context) error { return nil }))
		})
		require.Equal(t, calls, counter.RoundTrips(), "nested calls cost nothing in Redis")
		require.Equal(t, r.clientID, client.Get(ctx, redisKey).Val(), "and released nothing")

		short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		require.ErrorIs(t, r.Do(short, "k", func(context.Context) error { return nil }), ErrNotObtained, "an unrelated context waits")

		// A nested call still running when fn returns holds the release back.
		entered := make(chan struct{})
		go func() {
			assert.NoError(t, r.Do(ctx, "k", func(context.Context) error {
				close(entered)
				time.Sleep(100 * time.Millisecond)
				innerDone.Store(true)
				return nil
			}))
		}()
		<-entered
		return nil
	})
	require.NoError(t, err)
	require.True(t, innerDone.Load(), "Do returned before its nested call")
	require.Zero(t, client.Exists(ctx, redisKey).Val())
	ran := false
	err = r.Do(escaped, "k", func(context.Context) error { ran = true; return nil })
	require.ErrorIs(t, err, ErrNotObtained, "the outer Do has returned")
	require.False(t, ran)
}

// TestNestedDoOfAnotherKeyOrRegistryAcquires: reentrancy is by registry
// and key.
func TestNestedDoOfAnotherKeyOrRegistryAcquires(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client)
	other, err := New(client, "lockreg-test:"+t.Name()+"-other")
	require.NoError(t, err)
	defer other.Close()
	require.NoError(t, r.Do(ctx, "a", func(ctx context.Context) error {
		return r.Do(ctx, "b", func(ctx context.Context) error {
			require.Equal(t, r.clientID, client.Get(ctx, r.Obtain("b").keys().Lock()).Val())
			return other.Do(ctx, "a", func(ctx context.Context) error {
				require.Equal(t, other.clientID, client.Get(ctx, other.Obtain("a").keys().Lock()).Val())
				return nil
			})
		})
	}))
}

func TestDoAllHoldsEveryKeyOnce(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client)
	keys := []string{"c", "a", "b", "a"}
	require.NoError(t, r.DoAll(ctx, keys, func(ctx context.Context) error {
		for _, key := range keys {
			assert.Equal(t, r.clientID, client.Get(ctx, r.Obtain(key).keys().Lock()).Val(), key)
		}
		assert.Equal(t, int64(3), r.Stats().Held, "duplicates collapsed")
		return nil
	}))
	for _, key := range keys {
		require.Zero(t, client.Exists(ctx, r.Obtain(key).keys().Lock()).Val(), key)
	}
	requireNoLocalState(t, r)
}

// TestDoAllIsAllOrNothing: a key it cannot take leaves none taken.
func TestDoAllIsAllOrNothing(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client)
	other := newRegistry(t, client)
	h, err := other.Obtain("b").Acquire(ctx)
	require.NoError(t, err)
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	ran := false
	err = r.DoAll(short, []string{"a", "b", "c"}, func(context.Context) error { ran = true; return nil })
	require.ErrorIs(t, err, ErrNotObtained)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.False(t, ran)
	for _, key := range []string{"a", "c"} {
		require.Zero(t, client.Exists(ctx, r.Obtain(key).keys().Lock()).Val(), "%s was given back", key)
	}
	require.NoError(t, h.Release(ctx))

	require.NoError(t, r.Close())
	err = r.DoAll(ctx, []string{"a"}, func(context.Context) error { return nil })
	require.ErrorIs(t, err, ErrNotObtained)
	require.ErrorIs(t, err, ErrClosed)
}

// TestDoAllNeverDeadlocks: registries (processes) taking overlapping key
// sets, in opposite orders, all finish.
func TestDoAllNeverDeadlocks(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := redistest.Shared(t).Client(t)
	registries := []*Registry{newRegistry(t, client), newRegistry(t, client), newRegistry(t, client)}
	sets := [][]string{{"a", "b", "c"}, {"c", "b", "a"}, {"b", "c", "a"}}
	var inside atomic.Int32
	var wg sync.WaitGroup
	for i, r := range registries {
		for g := range 3 {
			wg.Go(func() {
				for range 20 {
					err := r.DoAll(ctx, sets[(i+g)%len(sets)], func(context.Context) error {
						if n := inside.Add(1); n != 1 {
							t.Errorf("%d callers inside at once", n)
						}
						inside.Add(-1)
						return nil
					})
					if !assert.NoError(t, err) {
						return
					}
				}
			})
		}
	}
	wg.Wait()
}

func TestDoAllsContextEndsWhenAnyHoldIsLost(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client, WithExpireAfter(300*time.Millisecond), WithRetryInterval(20*time.Millisecond))
	err := r.DoAll(ctx, []string{"a", "b", "c"}, func(ctx context.Context) error {
		require.NoError(t, client.Del(ctx, r.Obtain("b").keys().Lock()).Err())
		select {
		case <-ctx.Done():
			assert.ErrorContains(t, context.Cause(ctx), `"b"`)
		case <-time.After(5 * time.Second):
			t.Error("fn's context did not end")
		}
		return nil
	})
	require.ErrorIs(t, err, ErrLockLost)
	for _, key := range []string{"a", "c"} {
		require.Zero(t, client.Exists(ctx, r.Obtain(key).keys().Lock()).Val(), "%s released", key)
	}
}

// TestDoAllAcrossClusterSlots: keys in different slots, on different
// primaries, and a nested Do on one of them.
func TestDoAllAcrossClusterSlots(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := clusterClient(t, redistest.StartCluster(t, 3))
	r := newRegistry(t, client)
	var keys []string
	slots := map[int]bool{}
	for i := 0; len(keys) < 6; i++ {
		key := "order-" + strconv.Itoa(i)
		if slot := protocol.Slot(r.Obtain(key).keys().Lock()); !slots[slot] {
			slots[slot] = true
			keys = append(keys, key)
		}
	}
	primaries := map[string]bool{}
	for _, key := range keys {
		node, err := client.MasterForKey(ctx, r.Obtain(key).keys().Lock())
		require.NoError(t, err)
		primaries[node.String()] = true
	}
	require.Greater(t, len(primaries), 1, "the keys span primaries")
	require.NoError(t, r.DoAll(ctx, keys, func(ctx context.Context) error {
		for _, key := range keys {
			assert.Equal(t, r.clientID, client.Get(ctx, r.Obtain(key).keys().Lock()).Val(), key)
		}
		return r.Do(ctx, keys[2], func(context.Context) error { return nil })
	}))
	for _, key := range keys {
		require.Zero(t, client.Exists(ctx, r.Obtain(key).keys().Lock()).Val(), key)
	}
}

// TestDoKeepsCountersRight: a Do in a loop leaves nothing behind.
func TestDoKeepsCountersRight(t *testing.T) {
	ctx := context.Background()
	r := newRegistry(t, redistest.Shared(t).Client(t))
	for i := range 10 {
		require.NoError(t, r.Do(ctx, fmt.Sprint(i%3), func(context.Context) error { return nil }))
	}
	require.Zero(t, r.Stats().Held)
	require.Equal(t, int64(10), r.Stats().Acquisitions)
	requireNoLocalState(t, r)
}

// TestANestedDoAllReportsTheLossOfAnOuterKey: a DoAll nested in a Do,
// whose keys include the outer Do's, holds them all while its fn runs: a
// loss of the outer key meanwhile is a loss of one of its keys, which it
// reports as ErrLockLost, as a DoAll whose keys are all nested does.
func TestANestedDoAllReportsTheLossOfAnOuterKey(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client, WithExpireAfter(300*time.Millisecond), WithRetryInterval(20*time.Millisecond))
	var inner error
	_ = r.Do(ctx, "a", func(ctx context.Context) error {
		inner = r.DoAll(ctx, []string{"a", "b"}, func(ctx context.Context) error {
			require.NoError(t, client.Del(ctx, r.Obtain("a").keys().Lock()).Err())
			requireFires(t, ctx.Done(), 5*time.Second, "a's loss ends the nested fn's context")
			return nil
		})
		return nil
	})
	require.ErrorIs(t, inner, ErrLockLost, "the nested DoAll lost key a while its fn ran: %v", inner)
}

// TestADoAllThatRanNothingReportsNoLoss: a DoAll that could not take a key
// ran nothing: its error says ErrNotObtained, never ErrLockLost, even if a
// key it had taken was lost while it waited for the next.
func TestADoAllThatRanNothingReportsNoLoss(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client, WithExpireAfter(300*time.Millisecond), WithRetryInterval(20*time.Millisecond))
	other := newRegistry(t, client)
	h, err := other.Obtain("b").Acquire(ctx)
	require.NoError(t, err)
	defer h.Release(ctx)
	short, cancel := context.WithTimeout(ctx, 700*time.Millisecond)
	defer cancel()
	go func() {
		time.Sleep(100 * time.Millisecond)
		client.Del(ctx, r.Obtain("a").keys().Lock())
	}()
	ran := false
	err = r.DoAll(short, []string{"a", "b"}, func(context.Context) error { ran = true; return nil })
	require.False(t, ran)
	require.ErrorIs(t, err, ErrNotObtained)
	require.NotErrorIs(t, err, ErrLockLost, "fn never ran: %v", err)
}

// TestADoAllRunsNothingWithoutAllItsKeys: a key DoAll took is lost
// (WithMaxHold) while it waits for the next: fn must not run.
func TestADoAllRunsNothingWithoutAllItsKeys(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client, WithExpireAfter(300*time.Millisecond), WithMaxHold(100*time.Millisecond), WithRetryInterval(20*time.Millisecond))
	other := newRegistry(t, client)
	h, err := other.Obtain("b").Acquire(ctx)
	require.NoError(t, err)
	released := make(chan error, 1)
	go func() {
		time.Sleep(time.Second) // past a's WithMaxHold and lease
		released <- h.Release(ctx)
	}()
	ran := false
	err = r.DoAll(ctx, []string{"a", "b"}, func(ctx context.Context) error {
		ran = true
		return nil
	})
	require.NoError(t, <-released)
	require.False(t, ran, "fn ran while a was not held: %v", err)
	require.ErrorIs(t, err, ErrNotObtained)
	require.NotErrorIs(t, err, ErrLockLost, "%v", err)
	for _, key := range []string{"a", "b"} {
		requireReleased(t, client, r.Obtain(key).keys().Lock(), key)
	}
	requireNoLocalState(t, r)
}

// TestADoRunsNothingUnderAHoldLostAlready: the reply that took the key
// came after a lease: the hold is lost from the start, and fn must not
// run unprotected.
func TestADoRunsNothingUnderAHoldLostAlready(t *testing.T) {
	ctx := context.Background()
	var slow atomic.Bool // delays the reply of the SET that takes the key
	client := redistest.Shared(t).Client(t, redistest.Hook{Process: func(next redis.ProcessHook) redis.ProcessHook {
		return func(ctx context.Context, cmd redis.Cmder) error {
			err := next(ctx, cmd)
			if slow.Load() && cmd.Name() == "set" {
				time.Sleep(400 * time.Millisecond)
			}
			return err
		}
	}})
	r := newRegistry(t, client, WithExpireAfter(300*time.Millisecond))
	slow.Store(true)
	ran := false
	err := r.Do(ctx, "a", func(context.Context) error { ran = true; return nil })
	slow.Store(false)
	require.False(t, ran, "fn ran under a hold lost before it began: %v", err)
	require.ErrorIs(t, err, ErrNotObtained)
	require.NotErrorIs(t, err, ErrLockLost, "%v", err)
	requireReleased(t, client, r.Obtain("a").keys().Lock(), "a")
	requireNoLocalState(t, r)
}

// TestAHookThatPanicsLeavesNoKeyHeld: a hook that panics inside a DoAll,
// as its second key is taken or as its keys are released, does not leave
// the keys it took held, here or in Redis: the panic goes on, as fn's
// does, once they are released.
func TestAHookThatPanicsLeavesNoKeyHeld(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	for _, tc := range []struct {
		name  string
		hooks func(panicOn string) Hooks
	}{
		{"AcquireDone", func(key string) Hooks {
			return Hooks{AcquireDone: func(_ context.Context, e AcquireEvent) {
				if e.Key == key && e.Err == nil {
					panic("hook")
				}
			}}
		}},
		{"AcquireAttempt", func(key string) Hooks {
			return Hooks{AcquireAttempt: func(_ context.Context, k string) {
				if k == key {
					panic("hook")
				}
			}}
		}},
		{"ReleaseStart", func(key string) Hooks {
			return Hooks{ReleaseStart: func(ctx context.Context, k string) context.Context {
				if k == key {
					panic("hook")
				}
				return ctx
			}}
		}},
		{"ReleaseDone", func(key string) Hooks {
			return Hooks{ReleaseDone: func(_ context.Context, e ReleaseEvent) {
				if e.Key == key {
					panic("hook")
				}
			}}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRegistry(t, client)
			r.AddHooks(tc.hooks("b")) // the second key taken, the first released
			require.PanicsWithValue(t, "hook", func() {
				_ = r.DoAll(ctx, []string{"a", "b"}, func(context.Context) error { return nil })
			})
			for _, key := range []string{"a", "b"} {
				require.Zero(t, client.Exists(ctx, r.Obtain(key).keys().Lock()).Val(), "%s released in Redis", key)
			}
			requireNoLocalState(t, r, "released here")
			require.Zero(t, r.stats.held.Load(), "no hold left")
		})
	}
}

// TestADetachedCallAfterTheOuterDoReturnedAcquires: a context detached
// from fn's (context.WithoutCancel), as work that outlives fn takes,
// still carries the outer Do's values; once that Do has returned, it
// holds nothing, and a Do or DoAll with such a context acquires its keys
// like any other rather than fail.
func TestADetachedCallAfterTheOuterDoReturnedAcquires(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r := newRegistry(t, client)
	var detached context.Context
	require.NoError(t, r.Do(ctx, "k", func(ctx context.Context) error {
		detached = context.WithoutCancel(ctx)
		return nil
	}))
	require.Nil(t, r.HoldFor(detached, "k"), "the outer Do holds nothing any more")
	redisKey := r.Obtain("k").keys().Lock()
	require.NoError(t, r.Do(detached, "k", func(ctx context.Context) error {
		require.Equal(t, r.clientID, client.Get(ctx, redisKey).Val())
		require.NotNil(t, r.HoldFor(ctx, "k"))
		return nil
	}))
	require.NoError(t, r.DoAll(detached, []string{"j", "k"}, func(ctx context.Context) error {
		require.Equal(t, r.clientID, client.Get(ctx, redisKey).Val())
		return nil
	}))
	require.Zero(t, client.Exists(ctx, redisKey).Val())

	// Work handed to a goroutine as fn returns races its return: it runs
	// nested or acquires, never fails.
	errs := make(chan error, 50)
	for range cap(errs) {
		require.NoError(t, r.Do(ctx, "k", func(ctx context.Context) error {
			go func() { errs <- r.Do(context.WithoutCancel(ctx), "k", func(context.Context) error { return nil }) }()
			return nil
		}))
	}
	for range cap(errs) {
		require.NoError(t, <-errs)
	}
	requireNoLocalState(t, r)
}

// TestANestedDoAllRunsNothingOnceAnOuterKeyLapsed: the lease of a key the
// outer Do holds runs out, unsignalled yet (the watchdog's tick is to
// come), while a nested DoAll waits for its other key: fn must not run,
// as a nested call begun past the lease does not.
func TestANestedDoAllRunsNothingOnceAnOuterKeyLapsed(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	r, other := newRegistry(t, client), newRegistry(t, client)
	ran := false
	var inner error
	_ = r.Do(ctx, "a", func(ctx context.Context) error {
		h, err := other.Obtain("b").Acquire(ctx)
		require.NoError(t, err)
		done := make(chan struct{})
		go func() {
			defer close(done)
			inner = r.DoAll(ctx, []string{"a", "b"}, func(context.Context) error { ran = true; return nil })
		}()
		waitUntilWaiting(t, r)
		outer := r.HoldFor(ctx, "a")
		outer.tenure.leaseEnd.Store(int64(instantOf(time.Now().Add(-time.Millisecond))))
		require.NoError(t, h.Release(ctx))
		<-done
		return nil
	})
	require.False(t, ran, "fn ran while a was not held: %v", inner)
	require.ErrorIs(t, inner, ErrNotObtained)
	requireReleased(t, client, r.Obtain("b").keys().Lock(), "b was given back")
	requireNoLocalState(t, r)
}
