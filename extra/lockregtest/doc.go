// Package lockregtest is a test kit for code that works under lockreg's
// locks: registries on a Redis embedded in the test process (miniredis),
// so that a test needs no redis-server, and Lose, which takes a lock away
// from its holder, so that the code's loss path can be tested too:
//
//	func TestPackStopsWhenItLosesTheLock(t *testing.T) {
//		r := lockregtest.New(t) // on a server of its own; closed when the test ends
//		parcels := make(chan string)
//		done := make(chan error)
//		go func() { done <- pack(t.Context(), r, "order-42", parcels) }() // works under r.Do
//		parcels <- "parcel-1" // pack holds the lock now
//		lockregtest.Lose(t, r, "order-42") // as an operator's ForceUnlock would
//		require.ErrorIs(t, <-done, lockreg.ErrLockLost)
//	}
//
// New returns a registry on a new embedded server, in a namespace of its
// own. Another returns one more registry on the same server and
// namespace, with a client of its own: the two exclude each other, and
// pass keys between them, as two processes' registries do; NewPair
// returns both. NewAt does what New does on a real Redis, for the tests
// that need one. The kit names its registries after the test, in the
// order it makes them ("TestPack#1", "TestPack#2": Inspect's Owner), and
// writes what they log at WARN and above to the test's output. Options
// given to New, NewAt, NewPair and Another apply after the kit's own, and
// override them.
//
// Lose forces the key open (lockreg.Registry.ForceUnlock) and returns once
// the holder signalled its hold lost: Lost is closed, Do's context has
// ended with a cause matching lockreg.ErrLockLost, and Release returns
// ErrLockLost; a registry waiting for the key takes it. It fails the test
// if the registry does not hold the key.
//
// # goleak
//
// The kit closes its registries, clients and servers in the test's
// cleanup (t.Cleanup), which runs after the test's deferred calls: a
// deferred goleak.VerifyNone(t) finds their goroutines still running.
// Register the check as a cleanup before the kit's, which then runs after
// them (cleanups run last registered first):
//
//	t.Cleanup(func() { goleak.VerifyNone(t) }) // before New
//	r := lockregtest.New(t)
//
// or check the whole package at once with goleak.VerifyTestMain.
//
// # An embedded server is not Redis
//
// The library runs on miniredis as it does on Redis: the same scripts,
// keys and messages, and the kit's own tests run each behaviour it relies
// on against both. What differs:
//
//   - miniredis has no CLIENT TRACKING, so a holder learns that its key
//     was deleted or changed behind its back at its next renewal, not at
//     once, and Stats().Tracking is false. A forced unlock tells the
//     holder at once on both: by pub/sub, or, as Lose forces the key open
//     from the holder's own registry, with no news from the server.
//   - Leases are Lease (3s), not lockreg's 30s, so that a key a closed
//     registry left held frees within seconds, and renewals, every
//     second, make up for the missing tracking. A test stopped for two
//     seconds or more (a debugger's breakpoint) loses its holds:
//     WithExpireAfter sets a longer lease. An option that must stay below
//     the lease (WithRetryInterval) must stay below 3s too, or come with
//     WithExpireAfter.
//   - Time is the wall clock: leases run out as on Redis (miniredis's
//     ClockTTL), and there is no fake clock to move them on.
//   - There is one server: no replicas, failover, Cluster or eviction
//     (the kit answers INFO memory as a server that never evicts). Test
//     those on real servers.
package lockregtest
