// Command lockdemo shows lockreg keeping a shared counter consistent: several
// simulated services, each with its own registry and Redis client, run
// workers that increment one Redis counter under one lock with a deliberately
// racy GET-then-SET. Without the lock, updates would be lost.
//
// By default it runs against an in-process Redis, so it needs nothing
// installed:
//
//	go run ./cmd/lockdemo
//	go run ./cmd/lockdemo -redis redis://127.0.0.1:6379/0
//
// With -metrics, it serves the registries' metrics (extra/lockregotel)
// to Prometheus while it runs, and with -keep-serving until interrupted:
//
//	go run ./cmd/lockdemo -metrics 127.0.0.1:9464 -keep-serving
//
// The demo is a module of its own, so that the library's needs no
// OpenTelemetry; go.work at the repository root makes the commands above
// work from there.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/lockreg/lockreg"
	"github.com/lockreg/lockreg/internal/redisstat"
	"github.com/redis/go-redis/v9"
)

const (
	// lockTimeout is far above any fair wait, so hitting it means a bug or
	// an unreachable Redis rather than ordinary contention.
	lockTimeout = time.Minute
	// raceWindow is slept between GET and SET so that, were the lock broken,
	// concurrent increments would overlap and lose updates.
	raceWindow     = time.Millisecond
	progressPeriod = 500 * time.Millisecond
	// retryInterval is lockreg's default, set explicitly so that -expire can
	// be checked against it here, in terms of the flag.
	retryInterval = 100 * time.Millisecond
)

func main() { os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr)) }

// run runs the demo; with -keep-serving, it serves metrics after the work
// until interrupted or until ctx ends.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("lockdemo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	redisURL := fs.String("redis", "", "Redis URL such as redis://127.0.0.1:6379/0 (default: an in-process Redis)")
	services := fs.Int("services", 4, "number of simulated services, each with its own registry and Redis client")
	workers := fs.Int("workers", 8, "goroutines per service")
	increments := fs.Int("increments", 60, "increments per worker")
	key := fs.String("key", "counter", "the lock key")
	namespace := fs.String("registry", "lockdemo", "the registry's namespace: its Redis keys' prefix")
	expire := fs.Duration("expire", 30*time.Second, fmt.Sprintf("lock lease, longer than the %v retry interval", retryInterval))
	metricsAddr := fs.String("metrics", "", "serve Prometheus metrics at http://ADDR/metrics while it runs, such as 127.0.0.1:9464")
	keepServing := fs.Bool("keep-serving", false, "with -metrics, keep serving them after the work ends, until interrupted")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	usage := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "lockdemo: "+format+"\n", a...)
		return 2
	}
	switch {
	case fs.NArg() > 0:
		return usage("unexpected argument %q; all settings are flags (see -h)", fs.Arg(0))
	case *services < 1:
		return usage("-services must be at least 1, got %d", *services)
	case *workers < 1:
		return usage("-workers must be at least 1, got %d", *workers)
	case *increments < 1:
		return usage("-increments must be at least 1, got %d", *increments)
	case *key == "":
		return usage("-key must not be empty")
	case *namespace == "":
		return usage("-registry must not be empty")
	case *expire <= retryInterval:
		return usage("-expire must be longer than the %v retry interval, got %v", retryInterval, *expire)
	case *keepServing && *metricsAddr == "":
		return usage("-keep-serving needs -metrics")
	}

	// The library and the demo's goroutines write to stderr at once.
	stderr = &syncWriter{w: stderr}
	logLevel := slog.LevelInfo
	opts := &redis.Options{}
	if *redisURL == "" {
		// The in-process Redis has neither INFO memory nor CLIENT
		// TRACKING, as the registries would say at WARN and INFO: the
		// demo shows their errors only.
		logLevel = slog.LevelError
		mr := miniredis.NewMiniRedis()
		// miniredis freezes TTLs unless told otherwise; leases should run out
		// on the wall clock as they do on a real server.
		mr.ClockTTL(true)
		if err := mr.Start(); err != nil {
			fmt.Fprintf(stderr, "lockdemo: starting in-process Redis: %v\n", err)
			return 1
		}
		defer mr.Close()
		opts.Addr = mr.Addr()
	} else {
		var err error
		if opts, err = redis.ParseURL(*redisURL); err != nil {
			return usage("-redis %q: %v; pass a URL like redis://127.0.0.1:6379/0", *redisURL, err)
		}
	}

	// The counter has a client of its own so that the hook below sees only
	// lock traffic.
	data := redis.NewClient(opts)
	defer data.Close()
	counterKey := *namespace + ":" + *key + ":value"
	if err := data.Set(ctx, counterKey, 0, 0).Err(); err != nil {
		fmt.Fprintf(stderr, "lockdemo: cannot use Redis at %s: %v; start it or omit -redis\n", opts.Addr, err)
		return 1
	}
	defer data.Del(ctx, counterKey)

	lockTraffic := &redisstat.Counter{}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: logLevel}))
	locks := make([]*lockreg.Lock, *services)
	registries := make([]*lockreg.Registry, *services)
	for i := range locks {
		client := redis.NewClient(opts)
		defer client.Close()
		client.AddHook(lockTraffic)
		reg, err := lockreg.New(client, *namespace,
			lockreg.WithExpireAfter(*expire), lockreg.WithRetryInterval(retryInterval), lockreg.WithLogger(logger))
		if errors.Is(err, lockreg.ErrInvalidOption) {
			return usage("%v", err) // from a flag: -expire beyond what lockreg allows
		}
		if err != nil {
			fmt.Fprintf(stderr, "lockdemo: %v\n", err)
			return 1
		}
		defer reg.Close()
		registries[i] = reg
		locks[i] = reg.Obtain(*key)
	}
	if *metricsAddr != "" {
		stop, err := serveMetrics(*metricsAddr, registries, stderr)
		if err != nil {
			fmt.Fprintf(stderr, "lockdemo: -metrics %s: %v\n", *metricsAddr, err)
			return 1
		}
		defer stop()
	}

	var (
		acquired atomic.Int64
		wg       sync.WaitGroup
		errs     = make([]error, *services**workers)
	)
	start := time.Now()
	stopProgress := reportProgress(stderr, &acquired)
	for i := range errs {
		wg.Go(func() {
			lock := locks[i / *workers]
			for range *increments {
				if errs[i] = increment(ctx, lock, data, counterKey, &acquired); errs[i] != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	stopProgress()
	if *keepServing {
		// It listens for the interrupt before the report, which tells
		// whoever waits for it that the work ended, and waits for it on the
		// way out, before the metrics' server stops.
		interrupted, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
		defer stop()
		defer func() {
			fmt.Fprintln(stderr, "lockdemo: the work ended; serving metrics until interrupted")
			<-interrupted.Done()
		}()
	}

	// Only completed increments count, so that workers stopped by an error
	// do not show up as lost updates.
	n := acquired.Load()
	actual, err := data.Get(ctx, counterKey).Int64()
	fmt.Fprintf(stdout, "services x workers:  %d x %d\n", *services, *workers)
	fmt.Fprintf(stdout, "acquisitions:        %d in %v (%.0f/s)\n", n, elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds())
	if n > 0 {
		fmt.Fprintf(stdout, "round trips/acquire: %.2f (lock traffic only)\n", float64(lockTraffic.RoundTrips())/float64(n))
		printStats(stdout, registries)
	}
	fmt.Fprintf(stdout, "counter:             expected %d, actual %d\n", n, actual)
	fmt.Fprintf(stdout, "lost updates:        %d\n", n-actual)
	if err := errors.Join(append(errs, err)...); err != nil {
		fmt.Fprintf(stderr, "lockdemo: %v\n", err)
		return 1
	}
	if actual != n {
		fmt.Fprintln(stderr, "lockdemo: FAIL: the lock let increments overlap")
		return 1
	}
	return 0
}

// increment adds one to the counter under the lock, as a GET and a SET that
// only the lock keeps from interleaving with other workers', and counts the
// SETs that succeed in acquired.
func increment(ctx context.Context, lock *lockreg.Lock, data *redis.Client, counterKey string, acquired *atomic.Int64) error {
	lockCtx, cancel := context.WithTimeout(ctx, lockTimeout)
	defer cancel()
	if err := lock.LockContext(lockCtx); err != nil {
		return err
	}
	err := func() error {
		n, err := data.Get(ctx, counterKey).Int64()
		if err != nil {
			return err
		}
		time.Sleep(raceWindow)
		if err := data.Set(ctx, counterKey, n+1, 0).Err(); err != nil {
			return err
		}
		acquired.Add(1)
		return nil
	}()
	return errors.Join(err, lock.UnlockContext(ctx))
}

// reportProgress prints the acquisitions so far every progressPeriod until the
// returned stop function is called; stop waits for the printer to exit.
func reportProgress(w io.Writer, acquired *atomic.Int64) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		ticker := time.NewTicker(progressPeriod)
		defer ticker.Stop()
		last, lastAt := int64(0), time.Now()
		for {
			select {
			case <-done:
				return
			case now := <-ticker.C:
				n := acquired.Load()
				fmt.Fprintf(w, "acquisitions: %d (%.0f/s)\n", n, float64(n-last)/now.Sub(lastAt).Seconds())
				last, lastAt = n, now
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// printStats sums the registries' own counters: how the acquisitions were
// made, and how long they waited.
func printStats(w io.Writer, registries []*lockreg.Registry) {
	var sum lockreg.Stats
	for _, r := range registries {
		s := r.Stats()
		sum.Acquisitions += s.Acquisitions
		sum.LocalHandoffs += s.LocalHandoffs
		sum.FailedAttempts += s.FailedAttempts
		sum.AcquireCalls += s.AcquireCalls
		sum.ReleaseCalls += s.ReleaseCalls
		sum.RenewCalls += s.RenewCalls
		sum.Notifications += s.Notifications
		sum.Wait.Max = max(sum.Wait.Max, s.Wait.Max)
		sum.Wait.P99 = max(sum.Wait.P99, s.Wait.P99)
	}
	fmt.Fprintf(w, "local hand-offs:     %d of %d acquisitions (no Redis call)\n", sum.LocalHandoffs, sum.Acquisitions)
	fmt.Fprintf(w, "Redis calls:         %d acquire (%d found the lock taken), %d release, %d renew\n",
		sum.AcquireCalls, sum.FailedAttempts, sum.ReleaseCalls, sum.RenewCalls)
	fmt.Fprintf(w, "notifications:       %d received\n", sum.Notifications)
	fmt.Fprintf(w, "wait:                p99 at most %v, longest %v (worst service)\n", sum.Wait.P99.Round(time.Microsecond), sum.Wait.Max.Round(time.Microsecond))
}

// syncWriter serializes the writes of several goroutines to w.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
