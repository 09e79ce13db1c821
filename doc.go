// Package lockreg provides distributed locks on Redis, one per business key,
// in the style of Spring Integration's RedisLockRegistry: a registry hands
// out locks by key, and each lock is a local reentrant mutex in front of a
// Redis key with a lease.
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
//  1. The local mutex. Each key has one in-process reentrant mutex per
//     registry, owned by a goroutine. The owner may lock again any number of
//     times without touching Redis; other goroutines, including ones the
//     owner started, wait here, in arrival order and with no Redis traffic.
//     Only the goroutine that holds the local mutex talks to Redis for the
//     key.
//  2. The Redis key. The local owner runs obtain.lua, one atomic script:
//     if the key holds this registry's client id, refresh its lease; if it
//     is absent, SET it with the lease; otherwise fail and try again after
//     the retry interval (100ms by default) until the context ends. A failed
//     attempt never touches another owner's key.
//  3. The lease. The key expires after WithExpireAfter (30s by default), so
//     a crashed holder cannot block the key for ever. The holder must finish
//     within the lease: past it another process may take the key, and the
//     holder learns of it only at release, as ErrLockLost.
//
// Unlock undoes one level of the hold. The last one runs release.lua, which
// deletes the key only if it still holds this registry's client id, so a
// holder whose lease ran out never deletes its successor's lock; then the
// local mutex is freed, even when Redis failed.
//
// # Failure modes ruled out
//
// The lock value and its expiry are set in one command (no lock left without
// a lease by a crash between SETNX and EXPIRE); ownership is checked and the
// key deleted inside one script (no deleting a lock that expired and was
// taken by someone else between a GET and a DEL); reentrancy is counted
// locally per goroutine; waiters inside one process queue on the local
// mutex instead of polling Redis.
//
// A lease-based lock cannot stop a holder that stalls beyond its lease (a
// long GC pause, a stopped process) from acting after losing the lock, and
// Redis replication is asynchronous, so a failover can lose a lock. Keep
// the lease well above the longest critical section.
//
// # Errors
//
// Every error is one of the package's sentinels or wraps one: ErrNotObtained
// (the context ended first; it also matches the context's error),
// ErrNotHeld, ErrLockLost, ErrClosed, ErrInvalidOption and ErrRedis.
package lockreg
