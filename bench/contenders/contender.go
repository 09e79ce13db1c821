// Package contenders puts each lock library the benchmarks compare behind
// one small interface, so that every scenario measures all of them the same
// way against the same Redis.
package contenders

import "context"

// Contender is one lock library, configured, with its own Redis
// connections to one address. It is safe for concurrent use.
type Contender interface {
	// Acquire takes the lock for key, waiting until ctx ends. It returns
	// the function that releases this hold. If Reentrant, a goroutine that
	// holds key may Acquire it again; each hold needs its release.
	Acquire(ctx context.Context, key string) (release func(context.Context) error, err error)
	// Reentrant reports whether a holder may Acquire its key again; the
	// harness reports reentrant scenarios as n/a for the others.
	Reentrant() bool
	// Close releases the contender's connections and goroutines.
	Close() error
}

// Factory makes a contender whose Redis connections go to addr (host:port);
// the harness points it at a counting proxy for the round-trip pass.
type Factory struct {
	Name string
	New  func(addr string) (Contender, error)
}
