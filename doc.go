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
// the key however fn ends, and is reentrant through fn's context. DoAll
// holds several keys, taken in one canonical order so that overlapping
// calls never deadlock.
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
// All of them share one local queue per key: while the key is held, every
// other acquisition of it in the registry waits, first come, first served.
//
// Registry.Shutdown ends a registry gracefully: it refuses new
// acquisitions, waits for the holds to be released (renewing them
// meanwhile) until its context ends, then releases what is left. Close
// ends it at once: held keys stay in Redis until their leases run out.
//
// # The model
//
// A Registry is made once per process and namespace with New. It draws a
// random client id, and every lock it takes in Redis is the key
//
//	<registryKey>:{<key>}
//
// holding that client id as its value. Registries sharing a registryKey, in
// this process or any other, exclude each other through Redis.
//
// Taking a Lock goes through three layers:
//
//  1. The local mutex. Each key has one in-process mutex per registry,
//     owned by a hold: a Hold value, or a goroutine's hold, which that
//     goroutine may take again any number of times without touching
//     Redis. Every other acquisition, including by goroutines the owner
//     started, waits here, in arrival order and with no Redis traffic.
//     Only the owner of the local mutex talks to Redis for the key.
//  2. The Redis key. The local owner sets the key to the client id with
//     the lease, if it is absent: a plain SET NX PX, the least Redis can do
//     to take a key. If the key is taken, or this registry lately found it
//     taken, obtain.lua runs instead, one atomic script: if the key holds
//     this registry's client id, refresh its lease; if it is absent, SET it
//     with the lease; otherwise mark this registry as waiting and try again
//     after the retry interval (100ms by default) until the context ends.
//     A failed attempt never touches another owner's key.
//  3. The lease. The key expires after WithExpireAfter (30s by default), so
//     a crashed holder cannot block the key for ever. While the key is held,
//     the registry's watchdog renews it every expireAfter/3, so work may
//     outlast the lease (see below).
//
// Unlock undoes one level of the hold. The last one runs release.lua, which
// deletes the key only if it still holds this registry's client id, so a
// holder whose lease ran out never deletes its successor's lock; then the
// local mutex is freed, even when Redis failed.
//
// # Round trips
//
// An uncontended lock and unlock cost one round trip each: a plain SET,
// and release.lua with the client id as its only argument. Asking for the
// hold's fencing token costs one more, once per hold. A release that finds
// another registry waiting, on a key this registry did not know to be
// contended, changes nothing and goes again with the arguments a grant or
// a notification needs: one more round trip, the first time a key turns
// contended. When many
// goroutines of one registry lock and unlock different keys at once, the
// registry keeps at most four calls on the wire; calls made
// meanwhile queue, and leave as one pipeline when a call returns. A
// pipeline costs one write and one read, on the client and in Redis's one
// thread, however many calls it carries, and a call that finds the wire
// free is never delayed. The watchdog renews every held key each tick in
// one pipeline, up to 100 keys per script call: one round trip per node.
//
// # Failure modes ruled out
//
// The lock value and its expiry are set in one command (no lock left without
// a lease by a crash between SETNX and EXPIRE); ownership is checked and the
// key deleted inside one script (no deleting a lock that expired and was
// taken by someone else between a GET and a DEL); reentrancy is counted
// locally per goroutine; waiters inside one process queue on the local
// mutex instead of polling Redis; work longer than the lease is covered by
// renewal, and a holder that lost its lease anyway is told (Lost) and
// fenced off (Token).
//
// # Waiting
//
// Goroutines of one registry wait for a key on its local mutex, in arrival
// order. When the owner unlocks while one waits, the registry passes the
// hold on without a Redis round trip: the key stays held and the fencing
// token, if the hold had one, rises by one. The run of such hand-offs is bounded
// (WithLocalHandoff, 16 hand-offs or 10ms by default); then the key goes
// back to Redis.
//
// Other registries learn of a release by pub/sub. A failed attempt of an
// acquisition that waits marks its registry as waiting for the key (a mark
// that lapses after two of its registry's retry intervals unless renewed,
// whatever the other registries' intervals, and is withdrawn when the
// acquisition gives up; TryLock leaves none); releases nobody waits for
// publish nothing.
// Each registry holds one subscription, opened on its first wait and shared
// by all its keys, to <registryKey>:released, where a release wakes the
// waiters of all registries, and to <registryKey>:released:<client id>,
// where it receives the grants to it alone (see below), so that a grant
// wakes no other process. The waiter still retries
// every retry interval, so a lost message, a reconnect or a server without
// pub/sub costs latency, never liveness; when the subscription comes back
// after a lost connection, every waiter of the registry tries at once,
// which finds a grant whose message was lost.
//
// # Hand-offs between registries
//
// A release that finds a waiting registry passes the key straight to the
// one that has waited longest: the first in the key's queue whose mark is
// live. A registry joins the queue with the first mark of a wait, and
// renewing the mark at each retry keeps its place, so registries get the
// key first come, first served. In the same script call the release sets
// the key to that registry's client id with a short grant lease (two
// retry intervals, at least 100ms), draws the next fencing token and
// publishes both. The grantee's waiter holds the key as soon as the
// message arrives, without a round trip of its own; if it still holds the
// key halfway through the grant lease, the registry extends the lease to
// its own in the background. When goroutines of the releasing registry
// wait for the key too (its run of local hand-offs ended), the same call
// marks that registry as waiting, so that the next of them waits for its
// grant without a failing attempt of its own. Hand-offs between processes
// therefore cost the release's round trip and the message, not a further
// acquisition.
//
// The grantee trusts a grant only if it provably came after the call that
// marked it, one of its own failed attempts or its release that marked it,
// whose reply carried the key's last token (an attempt stores one from the
// clock if none is stored): the grant's token must be larger. Its lease is
// then counted from when that call was sent, so the registry never
// overestimates it, and the token keeps the fencing order. A grant it cannot
// place this way (it came before the call) only wakes the waiter, whose next
// attempt finds the key its own. A registry whose waiter gave up withdraws
// its mark; a grant that still reaches it, or that reaches it while it holds
// the key (its hold was broken unseen and a mark outlived it), is given back
// at once, unless an acquisition of the registry took the key meanwhile
// (one that begins once the grant came waits for the give-back; for one
// already under way, the give-back checks the key's last token and that its
// time to live is still within the grant's lease); a grant to a registry
// that died while waiting blocks the key for the grant lease only.
// Registries with WithPubSub(false) or WithWaitReplicas take no grants (a
// grant is not acknowledged by replicas); their marks ask to be woken, and a release
// whose first waiter is one of them deletes the key, publishes it to all
// waiters and queues that registry again at the back. Such a release also
// holds this registry's next acquisition of the key back for 2ms (one retry
// interval with WithPubSub(false)), so the waiters get their turn instead of
// losing every race to the releasing process.
//
// On Redis Cluster the notification is a classic PUBLISH, which the cluster
// broadcasts to every node; the registry's one subscription, on any node,
// receives it. Sharded pub/sub would confine the message to the key's shard
// but needs one channel per slot, so a registry waiting on many keys would
// hold many subscriptions: the constant one subscription per registry was
// chosen over it.
//
// Registry.Stats reports what happened: acquisitions, local hand-offs and
// grants, failed attempts, Redis calls by kind, notifications, keys held
// and tracked, and a wait-time summary.
//
// # Leases, loss and fencing
//
// One watchdog goroutine per registry renews the leases of all keys it
// holds, every expireAfter/3, with one owner-checked script call per 100
// keys (per slot, on Redis Cluster). A renewal error is logged and retried
// on the next tick. Renewal stops when the key is released, when it is
// found gone or owned by someone else, when the lease ran out unrenewed
// (the owner check, by client id, cannot tell a key held all along from
// one that came back to the registry since), after WithMaxHold, or at
// Close; WithRenewal(false) turns it off and leaves a fixed lease.
//
// A holder learns that its hold may be lost through Hold.Lost (or
// Lock.Lost, or the cancellation of Do's context), a channel closed when
// renewal found the key gone or taken, or when the lease ran out
// unrenewed (renewal off or stopped, or Redis unreachable for a whole
// lease). It fires within one renewal interval of the loss; the lease is
// counted from when the acquisition or renewal was sent, so it errs on the
// early side. Its release then returns ErrLockLost, naming the cause.
//
// A Redis restart without persistence, or a failover to a replica that
// lacked the key, lets another process take a key at once, long before
// the next renewal. With pub/sub on, a registry that holds keys keeps its
// subscription open; when it reconnects, the registry checks every held
// key in one pipeline and signals those that are gone, within about a
// second of Redis answering again (docs/RELIABILITY.md has the figures).
//
// What is guaranteed: while a holder's lease is live, no other registry
// holds the key, and no registry deletes or extends another owner's key.
// What is not: a lease cannot stop a holder that stalls past it (a long GC
// pause, a stopped process, a slow network) from acting after it lost the
// lock, before it can see the signal. Redis replication is asynchronous, so
// a failover to a replica that had not yet received the key can hand the
// lock to a second owner; WithWaitReplicas narrows that window by waiting
// for replicas to acknowledge each acquisition, but does not close it.
//
// Fencing tokens close both gaps for storage that checks them. A hold that
// asks for its token (Lock.Token) gets one greater than every earlier
// token of that key, from any registry. The first ask of a hold draws it in
// Redis, in one script call (token.lua) that first checks that the key
// still holds this registry's client id, so a holder whose key passed on
// gets ErrLockLost instead of a token; holds passed on locally from a hold
// with a token, and holds another registry's release granted (the grant
// carries a token), get theirs without a call. Tokens are drawn on demand
// so that holds that never use one, most of them, pay nothing for fencing:
// an uncontended cycle then costs Redis a plain SET and one script call.
// The storage remembers the highest token it has seen and rejects writes
// with a lower one, so a stale holder's late write fails.
//
// Tokens must keep rising even when Redis loses its data (a restart
// without persistence, a failover to a lagging replica), where a stored
// counter alone would restart at 1. The token is therefore the larger of
// the stored last token + 1 and the Redis server's clock in microseconds
// (TIME). Every token is at most its issue time plus the few draws that
// can fall into one microsecond, so after a data loss the clock alone is
// ahead of every earlier token; while the stored token lives (one lease
// after the last draw), it also covers the clock stepping back. The
// argument needs the servers' clocks not to step back by more than the time
// since the key's last acquisition, nor a replica's clock to lag its
// primary's by more than that: true for NTP-synchronised servers at any
// realistic acquisition rate of one key.
//
// While a key's slot moves between Redis Cluster nodes, Redis refuses a
// script whose keys are split between the nodes or partly missing, which the
// fence, the waiting marker and the queue usually are. Acquisitions and
// releases of that key then run on the lock's key alone: the lock works as
// ever, tokens drawn then come from the clock alone, releases grant nothing,
// and waiters find a release by polling. Renewal then renews the slot's keys
// one by one.
//
// # Contexts
//
// LockContext returns when its context ends, even while Redis hangs: with
// a context that can end, the acquisition's Redis calls run in a goroutine
// of its own, and an attempt that reached Redis after the caller left is
// undone before another local goroutine may take the key. The waiting
// between attempts stays on the caller's goroutine, so a release that
// grants the key wakes the caller itself. The hand-off of a call
// between goroutines costs a few percent of an uncontended acquisition.
// A go-redis client with ContextTimeoutEnabled ends its calls at their
// context's deadline, so with a deadline the first attempt runs on the
// caller's goroutine instead, at the cost of a Background context.
// Release, Unlock and Token make their one call on the caller's
// goroutine: ctx bounds them only as far as the client honours it. A
// release whose ctx has ended runs all the same, bounded by the lease, so
// that a cancelled request never leaves its key held; Do releases with
// such a context always.
//
// # Errors
//
// Every error is one of the package's sentinels or wraps one: ErrNotObtained
// (the context ended first; it also matches the context's error),
// ErrNotHeld, ErrLockLost, ErrClosed, ErrInvalidOption, ErrInvalidKey,
// ErrRedis and ErrNotReplicated. Their messages are short; their doc
// comments say what to do.
package lockreg
