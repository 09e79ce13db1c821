package contenders

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	redsyncgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/lockreg/lockreg"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidislock"
)

// All is every contender the benchmarks compare, lockreg first.
//
// When ctx ends before the lock is had, each of these contenders returns an
// error that matches ctx.Err() and its library's own not-obtained error
// (lockreg.ErrNotObtained, redislock.ErrNotObtained, redsync.ErrFailed,
// rueidislock.ErrNotLocked), whatever the library itself returns.
var All = []Factory{LockReg, LockRegSpin, Redisson, RedisLockLinear, RedisLockExp, Redsync, RueidisLock}

// peerTTL is the lease of the peers that take one (bsm/redislock,
// redsync), as long as lockreg's and Redisson's default.
const peerTTL = 30 * time.Second

// ---------------------------------------------------------------------
// lockreg

// LockReg is lockreg with its defaults: pub/sub release notifications and
// local hand-offs.
var LockReg = Factory{Name: "lockreg", New: func(addr string) (Contender, error) {
	return NewLockReg(addr)
}}

// LockRegSpin is lockreg polling every retry interval (100ms), without
// pub/sub and without local hand-offs, like Spring Integration's
// SPIN_LOCK mode.
var LockRegSpin = Factory{Name: "lockreg-spin", New: func(addr string) (Contender, error) {
	return NewLockReg(addr, lockreg.WithPubSub(false), lockreg.WithLocalHandoff(0, 0))
}}

type lockReg struct {
	client *redis.Client
	reg    *lockreg.Registry
}

// NewLockReg makes a lockreg contender with its own client and registry
// (registryKey "bench"), configured by opts.
func NewLockReg(addr string, opts ...lockreg.Option) (Contender, error) {
	client := redis.NewClient(&redis.Options{Addr: addr})
	reg, err := lockreg.New(client, "bench", opts...)
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	return &lockReg{client: client, reg: reg}, nil
}

// Acquire returns a release that must run on the goroutine that acquired:
// lockreg's holds belong to goroutines.
func (c *lockReg) Acquire(ctx context.Context, key string) (func(context.Context) error, error) {
	l := c.reg.Obtain(key)
	if err := l.LockContext(ctx); err != nil {
		return nil, err // matches lockreg.ErrNotObtained and ctx.Err()
	}
	return l.UnlockContext, nil
}

func (c *lockReg) Reentrant() bool { return true }

func (c *lockReg) Close() error {
	return errors.Join(c.reg.Close(), c.client.Close())
}

// ---------------------------------------------------------------------
// bsm/redislock

// RedisLockLinear is bsm/redislock retrying every 100ms.
var RedisLockLinear = Factory{Name: "bsm/redislock-linear", New: func(addr string) (Contender, error) {
	return NewRedisLock(addr, func() redislock.RetryStrategy {
		return redislock.LinearBackoff(100 * time.Millisecond)
	})
}}

// RedisLockExp is bsm/redislock with exponential backoff from 16ms (the
// minimum its docs recommend) up to 100ms.
var RedisLockExp = Factory{Name: "bsm/redislock-exp", New: func(addr string) (Contender, error) {
	return NewRedisLock(addr, func() redislock.RetryStrategy {
		return redislock.ExponentialBackoff(16*time.Millisecond, 100*time.Millisecond)
	})
}}

type redisLock struct {
	client *redis.Client
	locker *redislock.Client
	// retry makes the strategy of one Obtain: ExponentialBackoff keeps its
	// attempt count, so it must not be shared between acquisitions.
	retry func() redislock.RetryStrategy
}

// NewRedisLock makes a bsm/redislock contender with its own client; retry
// makes each Obtain's retry strategy.
func NewRedisLock(addr string, retry func() redislock.RetryStrategy) (Contender, error) {
	client := redis.NewClient(&redis.Options{Addr: addr})
	return &redisLock{client: client, locker: redislock.New(client), retry: retry}, nil
}

func (c *redisLock) Acquire(ctx context.Context, key string) (func(context.Context) error, error) {
	// Obtain retries until ctx ends, then returns ctx.Err() itself, not
	// ErrNotObtained, which comes only when the strategy gives up (these
	// never do); a ctx that ends during the script call gives go-redis'
	// error (also ctx.Err()) instead. A ctx without a deadline would get
	// one of ttl from Obtain, so it gets a distant one here.
	octx := ctx
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		octx, cancel = context.WithDeadline(ctx, time.Now().AddDate(100, 0, 0))
		defer cancel()
	}
	lock, err := c.locker.Obtain(octx, key, peerTTL, &redislock.Options{RetryStrategy: c.retry()})
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil && !errors.Is(err, redislock.ErrNotObtained) {
			return nil, fmt.Errorf("%w: %w", redislock.ErrNotObtained, ctxErr)
		}
		return nil, err
	}
	return lock.Release, nil
}

func (c *redisLock) Reentrant() bool { return false }

func (c *redisLock) Close() error { return c.client.Close() }

// ---------------------------------------------------------------------
// redsync

// Redsync is go-redsync/redsync on one Redis (quorum 1), with its default
// retry delay (random 50..250ms) but retrying until ctx ends, and a 30s
// expiry.
var Redsync = Factory{Name: "redsync", New: func(addr string) (Contender, error) {
	return NewRedsync(addr)
}}

type redsyncContender struct {
	client *redis.Client
	rs     *redsync.Redsync
}

// NewRedsync makes a redsync contender with its own client.
func NewRedsync(addr string) (Contender, error) {
	client := redis.NewClient(&redis.Options{Addr: addr})
	return &redsyncContender{client: client, rs: redsync.New(redsyncgoredis.NewPool(client))}, nil
}

func (c *redsyncContender) Acquire(ctx context.Context, key string) (func(context.Context) error, error) {
	// A Mutex carries the value of one hold, so each hold gets its own.
	// The default of 32 tries would give up after a few seconds.
	m := c.rs.NewMutex(key, redsync.WithTries(math.MaxInt32), redsync.WithExpiry(peerTTL))
	if err := m.LockContext(ctx); err != nil {
		// LockContext notices ctx only between tries and then returns
		// ErrFailed, without ctx's error.
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, fmt.Errorf("%w: %w", err, ctxErr)
		}
		return nil, err
	}
	return func(ctx context.Context) error {
		ok, err := m.UnlockContext(ctx)
		if err == nil && !ok {
			err = redsync.ErrLockAlreadyExpired
		}
		return err
	}, nil
}

func (c *redsyncContender) Reentrant() bool { return false }

func (c *redsyncContender) Close() error { return c.client.Close() }

// ---------------------------------------------------------------------
// rueidislock

// RueidisLock is redis/rueidis' rueidislock on one Redis (KeyMajority 1),
// with client-side caching off (ClientOption.DisableCache): waiters retry
// every TryNextAfter (20ms) instead of waking on the invalidation of the
// lock's key.
//
// Redis 7.0 has what client-side caching needs (RESP3, CLIENT TRACKING),
// and with it waiters wake within a millisecond of a release; but then they
// have no timed retry at all, and in rueidis v1.0.79 waiters of one Locker
// can miss their wake-up for good under contention (seen with 2 Lockers x 4
// goroutines on one key, mostly under -race): they wait until their
// context ends. Polling keeps the benchmark live.
var RueidisLock = Factory{Name: "rueidislock", New: func(addr string) (Contender, error) {
	return NewRueidisLock(addr)
}}

type rueidisLock struct {
	locker rueidislock.Locker
}

// NewRueidisLock makes a rueidislock contender with its own client.
func NewRueidisLock(addr string) (Contender, error) {
	locker, err := rueidislock.NewLocker(rueidislock.LockerOption{
		ClientOption: rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true},
		KeyMajority:  1,
	})
	if err != nil {
		return nil, err
	}
	return &rueidisLock{locker: locker}, nil
}

func (c *rueidisLock) Acquire(ctx context.Context, key string) (func(context.Context) error, error) {
	// The context given to WithContext bounds the hold, not just the wait:
	// the lock is released when it ends, and its lease is cut to its
	// deadline. So the lock gets a context without ctx's deadline, which
	// ctx cancels only while waiting.
	lockCtx, stopLock := context.WithCancel(context.WithoutCancel(ctx))
	stopWaiting := context.AfterFunc(ctx, stopLock)
	_, release, err := c.locker.WithContext(lockCtx, key)
	if !stopWaiting() { // ctx ended: lockCtx is (being) cancelled
		if err == nil {
			release()
		}
		stopLock()
		if errors.Is(err, rueidislock.ErrLockerClosed) {
			return nil, err
		}
		// WithContext returns the bare ctx error; say which.
		return nil, fmt.Errorf("%w: %w", rueidislock.ErrNotLocked, ctx.Err())
	}
	if err != nil {
		stopLock()
		return nil, err
	}
	return func(context.Context) error {
		release() // waits for the key's deletion
		stopLock()
		return nil
	}, nil
}

func (c *rueidisLock) Reentrant() bool { return false }

func (c *rueidisLock) Close() error {
	c.locker.Close()
	return nil
}
