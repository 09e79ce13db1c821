// Package lockreg provides distributed locks on Redis, one per business key,
// in the style of Spring Integration's RedisLockRegistry: a registry hands
// out locks by key, and each lock is a local mutex in front of a Redis key
// with a lease.
//
// # Holding a lock
//
// Registry.Do runs a function while it holds a key:
//
//	err := registry.Do(ctx, "order-42", func(ctx context.Context) error {
//		return ship(ctx, order) // ctx ends if the lock is lost
//	})
//
// Its error tells "not obtained" (ErrNotObtained: ctx ended first) from
// "lost while working" (ErrLockLost: fn's context was cancelled with that
// cause, and the work may have overlapped another holder's). Do releases
// the key however fn ends, and is reentrant through fn's context; fn finds
// its hold, for its fencing token, with HoldFor. DoAll holds several keys,
// taken in one canonical order so that overlapping calls never deadlock.
//
// The other ways to hold a key:
//
//   - Lock.Acquire returns a Hold that belongs to no goroutine: any
//     goroutine may Release it, watch its Lost channel or draw its Token.
//   - Lock.LockContext and UnlockContext make the calling goroutine the
//     owner, reentrantly, as Java's locks do threads.
//   - Lock.Lock and Unlock make a Lock a sync.Locker. Lock cannot report an
//     error: on a closed registry it blocks its goroutine for good.
//
// Registry.Shutdown ends a registry gracefully: it refuses new
// acquisitions, waits for the holds to be released (renewing them
// meanwhile) until its context ends, then releases what is left. Close
// ends it at once: held keys stay in Redis until their holders release
// them or their leases run out. Registry.Done closes when either has
// closed it.
//
// # The model
//
// A Registry is made once per process and namespace with
// New, and draws a random client id. A lock for key is the Redis key
// <namespace>:{<key>} holding the client id of the registry that holds
// it. Registries sharing a namespace, in this process or any other,
// exclude each other through Redis. Taking a lock goes through three
// layers:
//
//  1. The local mutex. Each key has one mutex per registry, owned by a
//     hold. Every other acquisition of the key in the registry waits
//     there, in arrival order, with no Redis traffic; only the owner talks
//     to Redis for the key. A goroutine-owned hold may be taken again at
//     no cost. A release with local waiters hands the hold off to the
//     next, with no round trip, a bounded number of times in a row
//     (WithLocalHandoff).
//  2. The Redis key. The owner sets it to the client id with the lease, if
//     it is free: a plain SET NX PX, one round trip. If it is taken, the
//     attempt marks the registry as waiting (obtain.lua) and waits for a
//     grant, a wake-up or the retry interval (WithRetryInterval). The
//     release (release.lua) deletes the key only if it is still this
//     registry's, or grants it straight to the registry that has waited
//     longest, which then holds it without a call of its own.
//  3. The lease. The key expires after WithExpireAfter, so a crashed holder
//     cannot block it for ever; while it is held, one watchdog goroutine
//     per registry renews every held key each lease/3, in batches.
//
// docs/PROTOCOL.md has the keys, scripts, messages and waiting rules;
// internal/protocol is their one home in Go.
//
// # Operating
//
// WithOwner names a registry to operators. Inspect says who holds a key,
// for how long, and who waits; Locks lists a namespace's held locks;
// ForceUnlock frees a stuck key whoever holds it, keeping fencing tokens
// sound and telling the holder; ForceUnlockHeldBy, only while the
// registry Inspect showed holds it. cmd/lockctl does all three from a shell.
// AddHooks reports what a registry does, for metrics and traces.
//
// # Guarantees
//
// While a holder's lease is live, no other registry holds the key, and no
// registry deletes or extends another owner's key. A holder learns that
// its hold may be lost through Lost (or the end of Do's context), within a
// round trip or two of the cause: its key was deleted, overwritten,
// flushed or evicted behind its back (Redis tells the registry, through
// CLIENT TRACKING), Redis came back from a restart or failover without the
// key, or the lease ran out unrenewed. Its release then returns
// ErrLockLost, naming the cause. A server that may evict lock keys is
// refused (ErrServerEvicts) unless WithEvictionAllowed.
//
// What a lease cannot do: stop a holder that stalls past it (a GC pause, a
// stopped process, a slow network) from acting after it lost the lock,
// before it can see the signal; nor survive Redis losing data, as a
// failover to a replica that lacked the key does (WithWaitReplicas narrows
// that window; it does not close it). Fencing tokens close both gaps for
// storage that checks them: Token returns a number greater than every
// earlier token of the key, from any registry, even after Redis lost its
// data; the storage rejects writes whose token is lower than one it has
// seen. A hold pays for its token, one round trip, only if it asks.
// docs/RELIABILITY.md shows these under faults.
//
// # Contexts
//
// An acquisition returns when its context ends, even while Redis hangs: its
// Redis calls then run in a goroutine of their own, and an attempt that
// reached Redis after the caller left is undone before another local
// acquisition may take the key. Release, Unlock and Token make their one
// call on the caller's goroutine: ctx bounds it as far as the client
// honours it (go-redis's ContextTimeoutEnabled). A release whose ctx has
// ended runs all the same, bounded by the lease, so that a cancelled
// request does not leave its key held. One whose ctx ends while its call
// waits behind the registry's four calls in flight (Redis slow to answer)
// returns at once, unsent, with ErrRedis and ctx's error: its key is left
// to its lease, which nothing renews any more.
//
// # Errors
//
// Every error is one of the package's sentinels or wraps one (but for fn's
// own, which Do and DoAll return as fn returned it): ErrNotObtained
// (the context ended first, and the error also matches the context's
// error; or Redis refused the attempt for good, and it also matches
// ErrRedis), ErrNotHeld, ErrLockLost, ErrClosed, ErrInvalidOption,
// ErrInvalidKey, ErrInvalidArgument, ErrRedis, ErrNotReplicated and
// ErrServerEvicts. Their messages are short, and cut a key longer than 200
// bytes to its first bytes and its length; their doc comments say what to
// do.
//
// An acquisition retries what may pass (no connection, a timeout, a server
// loading, failing over or busy) until its context ends, and ends at once
// on what retrying would not mend: a key of another type (WRONGTYPE), an
// ACL that forbids a command (NOPERM), a closed client.
//
// Bad input is an error, never a panic: an empty key (ErrInvalidKey), a nil
// context or function (ErrInvalidArgument), a nil client or an invalid
// option (ErrInvalidOption), and the call changes nothing. Of several, the
// key's error comes first, then the context's, then the rest's. Obtain, which
// returns no error, returns for an empty key a Lock whose calls fail so;
// Lock, which can return none either, panics with the error at the call,
// as Unlock panics with ErrNotHeld. A nil *Hold (HoldFor outside a Do of
// its key) holds nothing: its methods say ErrNotHeld.
//
// # Glossary
//
// One word for each act, in the code and its comments:
//
//   - obtain: Registry.Obtain hands out a key's Lock and takes nothing, as
//     Spring's obtain does. (obtain.lua, the script an attempt runs once a
//     plain SET found the key taken, keeps the name of Spring's.)
//   - hold: one holding of a key, from acquisition to release (Hold).
//   - acquire: take a key, waiting as needed: an acquisition takes the
//     local mutex, then the key in Redis by attempts, waiting between them.
//   - attempt: one try to take the key in Redis: a plain SET NX PX, or
//     obtain.lua.
//   - release: let go of a held key: hand it off, grant it, or delete it.
//   - hand off: pass a hold to the next local waiter, the key staying held.
//   - tenure: the holds of one key that rest on one taking of it in Redis,
//     handed off locally one to the next; strike: end a tenure by a loss.
//   - confirm: read a key after a hold of it ended in a hand-off, so that
//     its release reports a change it could not see (tenure.go).
//   - mark: record a registry as waiting for a key, in the key's marker and
//     queue; withdraw: remove its mark.
//   - grant: a release passes the key to another waiting registry; give
//     back: release a grant nobody here took.
//   - abandon: end an acquisition without the key.
//   - unlock: let go of the local mutex (Unlock releases a goroutine's
//     hold).
//   - yield: hold the next local acquisition back briefly after a release
//     others waited for.
//   - renew: extend a held key's lease; lose: signal a hold lost.
//   - track: have Redis tell the registry when a held key changes; arm:
//     read the key so that Redis tracks it; verify: read it again after
//     Redis said it changed.
package lockreg
