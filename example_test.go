package lockreg_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockreg/lockreg"
	"github.com/lockreg/lockreg/internal/redistest"
)

// redisAddr is the test binary's redis-server; in an application it is your
// Redis's address.
var redisAddr = redistest.SharedAddr

// The basic pattern: one registry per process and namespace, one lock per
// business key, held while the work runs. The work's context ends if the
// lock is lost; Do's error tells that apart from not getting the lock.
func Example() {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: redisAddr()})
	defer client.Close()
	registry, err := lockreg.New(client, "example:orders")
	if err != nil {
		panic(err)
	}
	defer registry.Shutdown(ctx)

	err = registry.Do(ctx, "order-42", func(ctx context.Context) error {
		fmt.Println("only one process at a time works on order-42")
		return nil // or ctx's error, if the lock was lost meanwhile
	})
	switch {
	case errors.Is(err, lockreg.ErrNotObtained):
		// Another process held it until ctx ended: try later.
	case errors.Is(err, lockreg.ErrLockLost):
		// The work may have overlapped another holder's.
	}
	fmt.Println(err)
	// Output:
	// only one process at a time works on order-42
	// <nil>
}

// DoAll takes several keys in one canonical order, so that two transfers
// between the same accounts, in opposite directions, cannot deadlock.
func ExampleRegistry_DoAll() {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: redisAddr()})
	defer client.Close()
	registry, err := lockreg.New(client, "example:accounts")
	if err != nil {
		panic(err)
	}
	defer registry.Close()

	transfer := func(from, to string) error {
		return registry.DoAll(ctx, []string{from, to}, func(ctx context.Context) error {
			fmt.Println("moving money from", from, "to", to)
			return nil
		})
	}
	var transfers sync.WaitGroup
	for _, accounts := range [][2]string{{"account-1", "account-2"}, {"account-2", "account-1"}} {
		transfers.Go(func() {
			if err := transfer(accounts[0], accounts[1]); err != nil {
				fmt.Println(err)
			}
		})
	}
	transfers.Wait()
	// Unordered output:
	// moving money from account-1 to account-2
	// moving money from account-2 to account-1
}

// A Hold belongs to no goroutine: one goroutine acquires, a worker of a
// pool does the work and releases.
func ExampleLock_Acquire() {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: redisAddr()})
	defer client.Close()
	registry, err := lockreg.New(client, "example:jobs")
	if err != nil {
		panic(err)
	}
	defer registry.Close()

	jobs := make(chan *lockreg.Hold)
	var workers, watchers sync.WaitGroup
	for range 2 {
		workers.Go(func() {
			for hold := range jobs {
				// A watcher of the hold ends with it: Done closes on the
				// release as on a loss, and Err says which.
				watchers.Go(func() {
					<-hold.Done()
					if errors.Is(hold.Err(), lockreg.ErrLockLost) {
						fmt.Println("lost", hold.Key(), "while working: undo the work")
					}
				})
				fmt.Println("working on", hold.Key())
				if err := hold.Release(ctx); err != nil {
					fmt.Println(err)
				}
			}
		})
	}
	for _, key := range []string{"job-1", "job-1"} { // the second waits for the first's release
		hold, err := registry.Obtain(key).Acquire(ctx)
		if err != nil {
			panic(err)
		}
		jobs <- hold
	}
	close(jobs)
	workers.Wait()
	watchers.Wait() // every watcher ended with its hold
	// Output:
	// working on job-1
	// working on job-1
}

// Shutdown lets the work under way finish and release its locks, within
// its deadline; what is still held then is released for it.
func ExampleRegistry_Shutdown() {
	client := redis.NewClient(&redis.Options{Addr: redisAddr()})
	defer client.Close()
	registry, err := lockreg.New(client, "example:shutdown")
	if err != nil {
		panic(err)
	}

	started := make(chan struct{})
	done := make(chan error)
	go func() {
		done <- registry.Do(context.Background(), "report", func(ctx context.Context) error {
			close(started)
			time.Sleep(50 * time.Millisecond) // the work under way
			return nil
		})
	}()
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	fmt.Println("shutdown:", registry.Shutdown(ctx))
	fmt.Println("the work:", <-done)
	fmt.Println("new work:", errors.Is(registry.Do(ctx, "report", func(context.Context) error { return nil }), lockreg.ErrClosed))
	// Output:
	// shutdown: <nil>
	// the work: <nil>
	// new work: true
}

// LockContext gives up when its context ends; the error then matches both
// ErrNotObtained and the context's error.
func ExampleLock_LockContext() {
	client := redis.NewClient(&redis.Options{Addr: redisAddr()})
	defer client.Close()
	// Two registries stand for two processes.
	billing, err := lockreg.New(client, "example:accounts")
	if err != nil {
		panic(err)
	}
	defer billing.Close()
	reports, err := lockreg.New(client, "example:accounts")
	if err != nil {
		panic(err)
	}
	defer reports.Close()

	billing.Obtain("account-7").Lock()
	defer billing.Obtain("account-7").Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err = reports.Obtain("account-7").LockContext(ctx)
	fmt.Println(errors.Is(err, lockreg.ErrNotObtained), errors.Is(err, context.DeadlineExceeded))
	// Output: true true
}

// The goroutine that holds a lock may take it again; each lock needs its
// unlock, and only the last one releases the key in Redis.
func ExampleLock_reentrant() {
	client := redis.NewClient(&redis.Options{Addr: redisAddr()})
	defer client.Close()
	registry, err := lockreg.New(client, "example:jobs")
	if err != nil {
		panic(err)
	}
	defer registry.Close()

	transfer := func(lock *lockreg.Lock) {
		lock.Lock() // already held by this goroutine: no Redis call
		defer lock.Unlock()
		fmt.Println("transfer under", lock.Key())
	}
	lock := registry.Obtain("job-1")
	lock.Lock()
	transfer(registry.Obtain("job-1"))
	lock.Unlock()

	// Once the last unlock released it, another goroutine takes it at once.
	done := make(chan bool)
	go func() {
		ok := lock.TryLock()
		if ok {
			lock.Unlock()
		}
		done <- ok
	}()
	got := <-done
	fmt.Println("free after the last unlock:", got)
	// Output:
	// transfer under job-1
	// free after the last unlock: true
}

// fencedStore stands for storage that checks fencing tokens: it remembers
// the highest token it has seen and rejects writes with a lower one.
type fencedStore struct {
	mu      sync.Mutex
	highest int64
	value   string
}

var errStaleToken = errors.New("stale fencing token: the writer lost its lock")

func (s *fencedStore) Write(token int64, value string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if token < s.highest {
		return errStaleToken
	}
	s.highest, s.value = token, value
	return nil
}

// A holder that stalls past its lease can still try to write; the token
// lets the storage turn it away.
func ExampleLock_Token() {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: redisAddr()})
	defer client.Close()
	// A fixed 100ms lease stands for a holder paused for longer than its lease.
	slow, err := lockreg.New(client, "example:docs", lockreg.WithExpireAfter(100*time.Millisecond),
		lockreg.WithRetryInterval(10*time.Millisecond), lockreg.WithRenewal(false))
	if err != nil {
		panic(err)
	}
	defer slow.Close()
	fast, err := lockreg.New(client, "example:docs")
	if err != nil {
		panic(err)
	}
	defer fast.Close()
	store := &fencedStore{}

	stale := slow.Obtain("doc-1")
	stale.Lock()
	staleToken, err := stale.Token(ctx) // drawn while the hold is good
	if err != nil {
		panic(err)
	}
	<-stale.Lost() // the lease ran out while "paused"

	lock := fast.Obtain("doc-1")
	lock.Lock()
	token, err := lock.Token(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("new holder writes:", store.Write(token, "v2"))
	lock.Unlock()

	fmt.Println("stale holder writes:", store.Write(staleToken, "v1"))
	_, err = stale.Token(ctx)
	fmt.Println("stale holder's token:", errors.Is(err, lockreg.ErrLockLost))
	fmt.Println("stale holder unlocks:", errors.Is(stale.UnlockContext(ctx), lockreg.ErrLockLost))
	// Output:
	// new holder writes: <nil>
	// stale holder writes: stale fencing token: the writer lost its lock
	// stale holder's token: true
	// stale holder unlocks: true
}

// Inspect tells an operator who holds a key and who waits for it, by the
// names the registries gave themselves (WithOwner).
func ExampleRegistry_Inspect() {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: redisAddr()})
	defer client.Close()
	// Three registries stand for three processes.
	billing, err := lockreg.New(client, "example:inspect", lockreg.WithOwner("billing/pod-7"))
	if err != nil {
		panic(err)
	}
	defer billing.Close()
	reports, err := lockreg.New(client, "example:inspect", lockreg.WithOwner("reports/pod-1"))
	if err != nil {
		panic(err)
	}
	defer reports.Close()
	operator, err := lockreg.New(client, "example:inspect")
	if err != nil {
		panic(err)
	}
	defer operator.Close()

	hold, err := billing.Obtain("order-42").Acquire(ctx)
	if err != nil {
		panic(err)
	}
	waited := make(chan error)
	go func() {
		waited <- reports.Do(ctx, "order-42", func(context.Context) error { return nil })
	}()

	// A registry publishes its name in the background as it acquires or
	// waits: look again until the holder and the waiter are both named.
	var info lockreg.LockInfo
	for range 500 {
		if info, err = operator.Inspect(ctx, "order-42"); err != nil {
			panic(err)
		}
		if info.Owner != "" && len(info.Waiting) > 0 && info.Waiting[0].Owner != "" {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Println(info.Key, "held by", info.Owner)
	for _, w := range info.Waiting { // first in line first
		fmt.Println("waiting:", w.Owner)
	}

	if err := hold.Release(ctx); err != nil { // the release grants the key to the waiter
		panic(err)
	}
	fmt.Println("the waiter's turn:", <-waited)
	// Output:
	// order-42 held by billing/pod-7
	// waiting: reports/pod-1
	// the waiter's turn: <nil>
}

// Locks lists the locks held in the namespace, on every primary, in no
// particular order: sort them for a report.
func ExampleRegistry_Locks() {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: redisAddr()})
	defer client.Close()
	registry, err := lockreg.New(client, "example:invoices")
	if err != nil {
		panic(err)
	}
	defer registry.Close()

	for _, key := range []string{"invoice-3", "invoice-1"} {
		hold, err := registry.Obtain(key).Acquire(ctx)
		if err != nil {
			panic(err)
		}
		defer hold.Release(ctx)
	}
	// A lock released is listed no more.
	if err := registry.Do(ctx, "invoice-2", func(context.Context) error { return nil }); err != nil {
		panic(err)
	}

	var held []string
	for info, err := range registry.Locks(ctx) {
		if err != nil { // the listing stopped there
			panic(err)
		}
		held = append(held, info.Key)
	}
	slices.Sort(held)
	fmt.Println(held)
	// Output: [invoice-1 invoice-3]
}

// ForceUnlock frees a key whose holder is stuck, or dead with a long
// lease, and tells the holder: its Lost channel closes, and its Err names
// the cause. Its release then leaves the key alone, whoever took it since.
func ExampleRegistry_ForceUnlock() {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: redisAddr()})
	defer client.Close()
	// Two registries stand for a worker's process and an operator's.
	worker, err := lockreg.New(client, "example:exports", lockreg.WithOwner("exports/pod-3"))
	if err != nil {
		panic(err)
	}
	defer worker.Close()
	operator, err := lockreg.New(client, "example:exports")
	if err != nil {
		panic(err)
	}
	defer operator.Close()

	hold, err := worker.Obtain("export-9").Acquire(ctx)
	if err != nil {
		panic(err)
	}
	// A holder hears of a forced unlock at once through Redis's CLIENT
	// TRACKING, which its registry turns on in the background from New
	// (on Cluster, as it first acquires on each node); a long-running
	// worker has it on long before.
	for range 500 {
		if worker.Stats().Tracking {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}

	freed, err := operator.ForceUnlock(ctx, "export-9")
	fmt.Println("freed:", freed, err)
	<-hold.Lost() // the worker stops its work here
	fmt.Println(hold.Err())
	fmt.Println("its release:", errors.Is(hold.Release(ctx), lockreg.ErrLockLost))

	freed, err = operator.ForceUnlock(ctx, "export-9")
	fmt.Println("freed again:", freed, err) // nobody holds it now
	// Output:
	// freed: true <nil>
	// lockreg: lock lost: key "export-9": an operator forced its key open (ForceUnlock)
	// its release: true
	// freed again: false <nil>
}

// Hooks feed metrics and logs. The registry calls them on the goroutine
// where the event happens, so they only count, or hand the event on
// without blocking.
func ExampleRegistry_AddHooks() {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: redisAddr()})
	defer client.Close()
	// A fixed 100ms lease stands for a holder stalled for longer than it.
	registry, err := lockreg.New(client, "example:hooks", lockreg.WithExpireAfter(100*time.Millisecond),
		lockreg.WithRetryInterval(10*time.Millisecond), lockreg.WithRenewal(false))
	if err != nil {
		panic(err)
	}
	defer registry.Close()

	var acquired, notObtained atomic.Int64
	losses := make(chan lockreg.LossEvent, 100) // read by a logging goroutine, here the example's
	registry.AddHooks(lockreg.Hooks{
		AcquireDone: func(_ context.Context, e lockreg.AcquireEvent) {
			switch e.Outcome {
			case lockreg.OutcomeAcquired:
				acquired.Add(1)
			case lockreg.OutcomeNotObtained:
				notObtained.Add(1)
			}
		},
		Lost: func(e lockreg.LossEvent) {
			select {
			case losses <- e:
			default: // a full log drops the event rather than stall the registry
			}
		},
	})

	for range 3 {
		_ = registry.Do(ctx, "report", func(context.Context) error { return nil })
	}
	hold, err := registry.Obtain("report").Acquire(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("taken while held:", registry.Obtain("report").TryLock())
	lost := <-losses // the lease ran out unrenewed
	fmt.Println("lost", lost.Key)
	_ = hold.Release(ctx) // ErrLockLost
	fmt.Println("acquired:", acquired.Load(), "not obtained:", notObtained.Load())
	// Output:
	// taken while held: false
	// lost report
	// acquired: 4 not obtained: 1
}
