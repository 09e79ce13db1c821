// Redisson-style lock: a Go port of the algorithm of Redisson's RLock, so
// that the benchmarks can compare lockreg with the best-known Redis lock of
// the Java world on equal terms (same Go runtime, same go-redis client, same
// Redis). It is written from Redisson's documented algorithm, not from its
// code, and it is only a comparison point: nothing in lockreg uses it.
//
// The algorithm:
//
//   - The lock is a Redis hash named by the lock's key. Its one field is the
//     holder, "<uuid>:<goroutine id>" (uuid per contender instance, the
//     goroutine id from github.com/petermattis/goid), and its value is the
//     reentrancy count.
//   - Acquire runs one script: if the hash does not exist, or the holder's
//     field is in it, HINCRBY the field, PEXPIRE the hash to the lease and
//     return nil (acquired); otherwise return the PTTL of the hash.
//   - A waiter subscribes to "redisson_lock__channel:{<key>}" before trying
//     again. The subscription is one go-redis PubSub per waited-on key,
//     shared by this contender's goroutines waiting on that key, reference
//     counted and closed when the last one stops waiting. Each unlock
//     message gives one permit, as a counting semaphore, so it wakes one
//     waiter of this contender; a waiter also wakes when the holder's TTL
//     has passed, and then tries again.
//   - Release runs one script: if the field is not in the hash, nil (not
//     held); else HINCRBY the field by -1, and if still positive PEXPIRE to
//     the lease and return 0; else DEL the hash, PUBLISH the unlock message
//     on the channel and return 1.
//   - A watchdog keeps the locks alive: the lease is 30s, and one goroutine
//     per contender renews every held lock every 10s (lease/3) with a script
//     that PEXPIREs the hash if the field is still in it, and drops the lock
//     from the renewal set if not.
//
// Round trips per acquisition: an uncontended acquire is 1 EVALSHA (go-redis
// falls back to EVAL once per script on NOSCRIPT). A contended one adds a
// SUBSCRIBE (and its confirmation) when this contender is not already
// subscribed to the key's channel, plus 1 EVALSHA per retry, each retry
// waiting for an unlock message or the holder's TTL. Release is 1 EVALSHA;
// its PUBLISH runs inside the script. The watchdog costs 1 EVALSHA per held
// lock per 10s.
package contenders

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/petermattis/goid"
	"github.com/redis/go-redis/v9"
)

// Redisson makes Redisson-style contenders.
var Redisson = Factory{Name: "redisson-style", New: NewRedisson}

const (
	redissonLease = 30 * time.Second
	// redissonUnlockMessage is what the unlock script publishes.
	redissonUnlockMessage = "0"
	// redissonMinWait is how long a waiter waits when the holder's TTL is
	// zero or negative (the hash expired or vanished between the commands).
	redissonMinWait = time.Millisecond
	// redissonMaxPermits bounds the unlock permits a subscription stores;
	// permits beyond it could only cause spurious wake-ups.
	redissonMaxPermits = 1024
)

var (
	redissonAcquireScript = redis.NewScript(`
if redis.call('exists', KEYS[1]) == 0 then
	redis.call('hincrby', KEYS[1], ARGV[2], 1)
	redis.call('pexpire', KEYS[1], ARGV[1])
	return nil
end
if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
	redis.call('hincrby', KEYS[1], ARGV[2], 1)
	redis.call('pexpire', KEYS[1], ARGV[1])
	return nil
end
return redis.call('pttl', KEYS[1])
`)

	redissonUnlockScript = redis.NewScript(`
if redis.call('hexists', KEYS[1], ARGV[3]) == 0 then
	return nil
end
local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1)
if counter > 0 then
	redis.call('pexpire', KEYS[1], ARGV[2])
	return 0
end
redis.call('del', KEYS[1])
redis.call('publish', KEYS[2], ARGV[1])
return 1
`)

	redissonRenewScript = redis.NewScript(`
if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
	redis.call('pexpire', KEYS[1], ARGV[1])
	return 1
end
return 0
`)
)

var (
	errRedissonClosed  = errors.New("redisson-style: contender is closed")
	errRedissonNotHeld = errors.New("redisson-style: lock is not held by this holder")
)

// redissonHold names one holder's lock: the lock's key and the holder field.
type redissonHold struct {
	name, field string
}

// redissonHeld is the watchdog's record of one holder's lock. gen changes
// at every acquire, so that a renewal that found the lock gone does not drop
// a record that an acquire has just renewed.
type redissonHeld struct {
	count int
	gen   uint64
}

// redissonSub is the shared subscription to one key's unlock channel.
type redissonSub struct {
	refs    int           // waiters using it; guarded by redisson.mu
	ready   chan struct{} // closed once subscribed, or failed
	err     error         // set before ready is closed
	ps      *redis.PubSub // set under redisson.mu once subscribed
	permits chan struct{} // one per unlock message: a counting semaphore
}

type redisson struct {
	client *redis.Client
	id     string
	lease  time.Duration

	mu     sync.Mutex
	closed bool
	held   map[redissonHold]*redissonHeld
	gen    uint64
	subs   map[string]*redissonSub

	readers  sync.WaitGroup // subscription readers
	stop     context.CancelFunc
	stopCtx  context.Context
	watchdog chan struct{} // closed when the watchdog has exited
	once     sync.Once
}

// NewRedisson returns a Redisson-style contender with its own go-redis
// client to addr.
func NewRedisson(addr string) (Contender, error) {
	return newRedisson(addr, redissonLease), nil
}

// newRedisson is NewRedisson with the lease as a parameter, for tests.
func newRedisson(addr string, lease time.Duration) *redisson {
	ctx, cancel := context.WithCancel(context.Background())
	r := &redisson{
		client:   redis.NewClient(&redis.Options{Addr: addr}),
		id:       uuid.NewString(),
		lease:    lease,
		held:     make(map[redissonHold]*redissonHeld),
		subs:     make(map[string]*redissonSub),
		stop:     cancel,
		stopCtx:  ctx,
		watchdog: make(chan struct{}),
	}
	go r.runWatchdog(r.lease / 3)
	return r
}

func (r *redisson) Reentrant() bool { return true }

func redissonChannel(name string) string {
	return "redisson_lock__channel:{" + name + "}"
}

func (r *redisson) leaseMillis() int64 { return r.lease.Milliseconds() }

// tryAcquire runs the acquire script once. It returns acquired, or the
// holder's remaining TTL.
func (r *redisson) tryAcquire(ctx context.Context, name, field string) (acquired bool, ttl time.Duration, err error) {
	n, err := redissonAcquireScript.Run(ctx, r.client, []string{name}, r.leaseMillis(), field).Int64()
	if errors.Is(err, redis.Nil) {
		r.addHeld(name, field)
		return true, 0, nil
	}
	if err != nil {
		return false, 0, err
	}
	return false, time.Duration(n) * time.Millisecond, nil
}

func (r *redisson) Acquire(ctx context.Context, key string) (func(context.Context) error, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// The field names this goroutine; release uses the one captured here.
	field := r.id + ":" + strconv.FormatInt(goid.Get(), 10)

	acquired, _, err := r.tryAcquire(ctx, key, field)
	if err != nil {
		return nil, r.ctxErr(ctx, err)
	}
	if !acquired {
		if err := r.wait(ctx, key, field); err != nil {
			return nil, err
		}
	}

	var released sync.Once
	return func(ctx context.Context) error {
		err := errRedissonNotHeld
		released.Do(func() { err = r.unlock(ctx, key, field) })
		return err
	}, nil
}

// wait subscribes to the key's channel and retries until acquired.
func (r *redisson) wait(ctx context.Context, name, field string) error {
	sub, err := r.subscribe(ctx, name)
	if err != nil {
		return r.ctxErr(ctx, err)
	}
	defer r.unsubscribe(name, sub)

	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		acquired, ttl, err := r.tryAcquire(ctx, name, field)
		if err != nil {
			return r.ctxErr(ctx, err)
		}
		if acquired {
			return nil
		}
		if ttl <= 0 {
			ttl = redissonMinWait
		}
		// Since Go 1.23 Reset leaves no stale tick in timer.C.
		timer.Reset(ttl)
		select {
		case <-sub.permits:
		case <-timer.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// ctxErr prefers ctx's error to the one a command failed with because of it.
func (r *redisson) ctxErr(ctx context.Context, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return ctxErr
	}
	return err
}

// subscribe returns the shared subscription to name's channel, made and
// confirmed by SUBSCRIBE if this contender has none, with a reference taken.
func (r *redisson) subscribe(ctx context.Context, name string) (*redissonSub, error) {
	for {
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			return nil, errRedissonClosed
		}
		if sub := r.subs[name]; sub != nil {
			sub.refs++
			r.mu.Unlock()
			select {
			case <-sub.ready:
			case <-ctx.Done():
				r.unsubscribe(name, sub)
				return nil, ctx.Err()
			}
			if sub.err != nil {
				// The goroutine that made it failed, perhaps only because of
				// its own ctx; it has taken the subscription out of the map,
				// so try with a new one.
				r.unsubscribe(name, sub)
				if err := ctx.Err(); err != nil {
					return nil, err
				}
				continue
			}
			return sub, nil
		}
		sub := &redissonSub{
			refs:    1,
			ready:   make(chan struct{}),
			permits: make(chan struct{}, redissonMaxPermits),
		}
		r.subs[name] = sub
		r.mu.Unlock()
		return sub, r.startSubscription(ctx, name, sub)
	}
}

// startSubscription subscribes sub, which the caller has just put in the
// map with the caller's reference, and starts its reader.
func (r *redisson) startSubscription(ctx context.Context, name string, sub *redissonSub) error {
	ps := r.client.Subscribe(ctx, redissonChannel(name))
	_, err := ps.Receive(ctx) // the SUBSCRIBE confirmation
	if err == nil {
		r.mu.Lock()
		if r.closed {
			err = errRedissonClosed
		} else {
			sub.ps = ps
			r.readers.Add(1)
			go r.readSubscription(ps.Channel(), sub.permits)
		}
		r.mu.Unlock()
	}
	if err != nil {
		_ = ps.Close()
		r.mu.Lock()
		if r.subs[name] == sub {
			delete(r.subs, name)
		}
		sub.refs--
		r.mu.Unlock()
		sub.err = err
	}
	close(sub.ready)
	return err
}

// readSubscription turns unlock messages into permits until the PubSub is
// closed.
func (r *redisson) readSubscription(msgs <-chan *redis.Message, permits chan<- struct{}) {
	defer r.readers.Done()
	for msg := range msgs {
		if msg.Payload != redissonUnlockMessage {
			continue
		}
		select {
		case permits <- struct{}{}:
		default:
		}
	}
}

// unsubscribe drops a reference to sub, closing its PubSub with the last.
func (r *redisson) unsubscribe(name string, sub *redissonSub) {
	r.mu.Lock()
	sub.refs--
	last := sub.refs == 0 && r.subs[name] == sub
	if last {
		delete(r.subs, name)
	}
	ps := sub.ps
	r.mu.Unlock()
	if last && ps != nil {
		_ = ps.Close()
	}
}

// unlock runs the unlock script for one hold.
func (r *redisson) unlock(ctx context.Context, name, field string) error {
	_, err := redissonUnlockScript.Run(ctx, r.client,
		[]string{name, redissonChannel(name)},
		redissonUnlockMessage, r.leaseMillis(), field).Int64()
	if errors.Is(err, redis.Nil) {
		r.dropHeld(name, field, true)
		return fmt.Errorf("%w: %q", errRedissonNotHeld, name)
	}
	// As Redisson does, the hold leaves the renewal set whatever the
	// outcome: a release that failed leaves the lock to expire.
	r.dropHeld(name, field, false)
	return err
}

func (r *redisson) addHeld(name, field string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gen++
	h := r.held[redissonHold{name, field}]
	if h == nil {
		h = &redissonHeld{}
		r.held[redissonHold{name, field}] = h
	}
	h.count++
	h.gen = r.gen
}

// dropHeld removes one hold from the watchdog's set, or all of the holder's
// holds on name if all.
func (r *redisson) dropHeld(name, field string, all bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := redissonHold{name, field}
	h := r.held[k]
	if h == nil {
		return
	}
	h.count--
	if all || h.count <= 0 {
		delete(r.held, k)
	}
}

// runWatchdog renews every held lock every interval until Close.
func (r *redisson) runWatchdog(interval time.Duration) {
	defer close(r.watchdog)
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		select {
		case <-r.stopCtx.Done():
			return
		case <-ticker.C:
			r.renewAll()
		}
	}
}

func (r *redisson) renewAll() {
	type item struct {
		k   redissonHold
		gen uint64
	}
	r.mu.Lock()
	items := make([]item, 0, len(r.held))
	for k, h := range r.held {
		items = append(items, item{k, h.gen})
	}
	r.mu.Unlock()

	for _, it := range items {
		if r.stopCtx.Err() != nil {
			return
		}
		ctx, cancel := context.WithTimeout(r.stopCtx, r.lease/3)
		n, err := redissonRenewScript.Run(ctx, r.client,
			[]string{it.k.name}, r.leaseMillis(), it.k.field).Int64()
		cancel()
		if err != nil || n != 0 {
			// Renewed, or failed this time: try again next tick.
			continue
		}
		// Not held any more: stop renewing it, unless it was acquired again
		// since the snapshot.
		r.mu.Lock()
		if h := r.held[it.k]; h != nil && h.gen == it.gen {
			delete(r.held, it.k)
		}
		r.mu.Unlock()
	}
}

// Close stops the watchdog, closes the subscriptions and the client. Locks
// still held are not released; they expire with their lease.
func (r *redisson) Close() error {
	var err error
	r.once.Do(func() {
		r.stop()
		<-r.watchdog

		r.mu.Lock()
		r.closed = true
		var pss []*redis.PubSub
		for name, sub := range r.subs {
			if sub.ps != nil {
				pss = append(pss, sub.ps)
			}
			delete(r.subs, name)
		}
		r.mu.Unlock()
		for _, ps := range pss {
			_ = ps.Close()
		}
		r.readers.Wait()
		err = r.client.Close()
	})
	return err
}
