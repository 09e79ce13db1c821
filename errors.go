package lockreg

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/lockreg/lockreg/internal/keytext"
)

// Errors returned by the registry and its locks. Every error lockreg returns
// is one of these or wraps one, so callers can test with errors.Is; but for
// fn's own error, which Do and DoAll return as fn returned it (joined with
// theirs, if any). The wrapping error names the key and what happened; the
// advice is here.
var (
	// ErrNotObtained: an acquisition was abandoned because its context ended
	// (the error also matches the context's error) while another owner
	// held the key or Redis did not answer. Retry later, or allow a longer
	// deadline. It also ends at once when Redis refuses the attempt for
	// good (WRONGTYPE, NOPERM, a closed client): the error then matches
	// ErrRedis too, and retrying will not help.
	ErrNotObtained = errors.New("lockreg: lock not obtained")
	// ErrNotHeld: a release or use of what is not held: an Unlock by a
	// goroutine that does not hold the lock, a second Release of a Hold,
	// its Token or Err once it was released, or a nil Hold (HoldFor outside
	// a Do of its key). Unlock from the goroutine that locked, once per
	// successful lock; release a Hold once, and use it only until then.
	ErrNotHeld = errors.New("lockreg: lock not held")
	// ErrLockLost: the hold may have been lost, so its critical section
	// may have overlapped another holder's. The wrapping error names the
	// cause when the registry knows it: a stall longer than the lease (a
	// GC pause, a stopped process, Redis unreachable), Redis losing data (a
	// restart without persistence, a failover to a lagging replica), a
	// key deleted, overwritten, flushed or evicted behind its back, or one
	// an operator forced open (ForceUnlock); also a lease that WithMaxHold
	// let run out, or a closed registry. Stop the protected work; use fencing tokens (Hold.Token)
	// where a late write must be refused; for stalls, make the lease
	// (WithExpireAfter) longer than the longest pause.
	ErrLockLost = errors.New("lockreg: lock lost")
	// ErrClosed: the registry was closed (Close, Shutdown). Obtain locks
	// from an open registry made by New.
	ErrClosed = errors.New("lockreg: registry closed")
	// ErrInvalidOption: New was given an argument it cannot use; the
	// message names it. Fix the named option; for a redis.Ring of more
	// than one shard, which would split a registry's keys and
	// notifications, use a ClusterClient, or a Ring of one shard.
	ErrInvalidOption = errors.New("lockreg: invalid argument to New")
	// ErrInvalidKey: an empty key, or a DoAll with no keys. Name the
	// resource to lock: any non-empty string is a key.
	ErrInvalidKey = errors.New("lockreg: invalid key")
	// ErrInvalidArgument: a nil context, a nil function or an empty owner
	// id. Pass context.Background() where no context is at hand, the
	// function to run under the lock, and the owner id Inspect reported.
	ErrInvalidArgument = errors.New("lockreg: invalid argument")
	// ErrRedis: a Redis call failed. While waiting, the lock retries; at
	// release, the key may be left to expire after its lease (a script
	// that failed part-way may have freed it). Check that Redis is
	// reachable and healthy, and that its ACL allows the commands the
	// README lists.
	ErrRedis = errors.New("lockreg: Redis call failed")
	// ErrNotReplicated: with WithWaitReplicas, fewer replicas acknowledged
	// an acquisition than required; the key was released and the attempt
	// counts as failed. Check the replicas' health, or require fewer.
	ErrNotReplicated = errors.New("lockreg: too few replicas acknowledged the lock")
	// ErrServerEvicts: a Redis server has a memory limit (maxmemory) and
	// an eviction policy other than noeviction, so it may evict lock keys,
	// which have a time to live: another process would then take a key
	// while its holder still works under it. Set maxmemory-policy to
	// noeviction (CONFIG SET maxmemory-policy noeviction, or the managed
	// service's parameter group), or keep the locks on a server of their
	// own that does not evict (the registry looks again every 30 s, and
	// uses a fixed server from then on); to accept the risk, pass
	// WithEvictionAllowed, which reports each eviction of a held key as a
	// loss (LossEvicted).
	ErrServerEvicts = errors.New("lockreg: the server may evict lock keys")
)

var (
	errNilContext  = fmt.Errorf("%w: nil context", ErrInvalidArgument)
	errNilFunction = fmt.Errorf("%w: nil function", ErrInvalidArgument)
)

// printedKey is a key as errors and logs print it: a key longer than
// 200 bytes is cut to its head and its length (keytext.Short), so that a
// huge key does not make a huge error. Logs print an owner's name so too.
type printedKey string

func (k printedKey) String() string { return keytext.Short(string(k)) }

// LogValue prints the key as String does, for slog's handlers.
func (k printedKey) LogValue() slog.Value { return slog.StringValue(k.String()) }

// keysCut is a Redis error on a key's calls whose message may name the
// key's keys in Redis: a script names the queue, marker or fence whose
// call failed (a key of another type, an ACL). Those names hold the key
// whole, escaped; its message cuts a long one there as printedKey cuts
// the key, so that a huge key does not make a huge error. It unwraps to
// the error itself.
type keysCut struct {
	err      error
	lockKey  string // <namespace>:{<key>}, every other key's prefix
	shortKey string // the same, the key cut
}

func (e *keysCut) Error() string { return strings.ReplaceAll(e.err.Error(), e.lockKey, e.shortKey) }
func (e *keysCut) Unwrap() error { return e.err }

// cutKeys returns err, a Redis error of one of l's calls, with l's keys
// in Redis cut in its message if the key is long.
func (l *Lock) cutKeys(err error) error {
	keys := l.keys()
	printed, cut := keys.PrintedLock(l.r.namespace)
	if !cut {
		return err
	}
	return &keysCut{err: err, lockKey: keys.Lock(), shortKey: printed}
}

// refused says that err ended an acquisition because Redis refused it
// for good (see notAcquired), not because its context ended.
func refused(err error) bool {
	return errors.Is(err, ErrRedis) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}
