package lockregtest

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/lockreg/lockreg"
)

// states are the kit's registries, each with what the kit knows of it.
var states sync.Map // *lockreg.Registry → *state

// kitState returns what the kit knows of r, or fails the test of fn if r
// is not one of its registries.
func kitState(t testing.TB, fn string, r *lockreg.Registry) *state {
	t.Helper()
	if r == nil {
		t.Fatalf("lockregtest.%s: the registry is nil", fn)
	}
	s, ok := states.Load(r)
	if !ok {
		t.Fatalf("lockregtest.%s: the registry %q was not made by lockregtest, or its test has ended", fn, r.Key())
	}
	return s.(*state)
}

// state is what the kit knows of one of its registries: its server, its
// client, and its holds, by its hooks.
type state struct {
	srv    *redisServer
	client *redis.Client
	owner  string // its owner name, as the kit gave it

	mu sync.Mutex // guards what follows
	// held counts the registry's live holds by key: acquired, and neither
	// released nor signalled lost. One at most, but a hand-off between
	// two local holders may be told in either order.
	held map[string]int
	// losses are closed when a hold of their key is signalled lost, for
	// Lose.
	losses map[string]chan struct{}
}

// hooks keep held up to date, and tell Lose of losses.
func (s *state) hooks() lockreg.Hooks {
	return lockreg.Hooks{
		AcquireDone: func(_ context.Context, e lockreg.AcquireEvent) {
			if e.Outcome == lockreg.OutcomeAcquired {
				s.count(e.Key, 1)
			}
		},
		ReleaseDone: func(_ context.Context, e lockreg.ReleaseEvent) {
			// A hold lost first was counted out by its loss; a second
			// Release of a hold changes nothing.
			if !e.WasLost && !errors.Is(e.Err, lockreg.ErrNotHeld) {
				s.count(e.Key, -1)
			}
		},
		Lost: func(e lockreg.LossEvent) {
			s.count(e.Key, -1)
			s.mu.Lock()
			defer s.mu.Unlock()
			if lost, ok := s.losses[e.Key]; ok {
				close(lost)
				delete(s.losses, e.Key)
			}
		},
	}
}

func (s *state) count(key string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held[key] += n; s.held[key] == 0 {
		delete(s.held, key)
	}
}

// holds reports whether the registry has a live hold on key.
func (s *state) holds(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held[key] > 0
}

// expectLoss returns a channel that is closed when a hold on key is next
// signalled lost.
func (s *state) expectLoss(key string) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	lost, ok := s.losses[key]
	if !ok {
		lost = make(chan struct{})
		s.losses[key] = lost
	}
	return lost
}
