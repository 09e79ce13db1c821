package lockreg

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockreg/lockreg/internal/protocol"
	"github.com/lockreg/lockreg/internal/redisstat"
	"github.com/lockreg/lockreg/internal/redistest"
)

// Figures in README.md come from `make bench-lib`.

// BenchmarkGoroutineID compares the two ways of telling goroutines apart
// that ownership could use; lockreg uses goid.
func BenchmarkGoroutineID(b *testing.B) {
	b.Run("impl=goid", func(b *testing.B) {
		for b.Loop() {
			_ = goroutineID()
		}
	})
	b.Run("impl=runtime.Stack", func(b *testing.B) {
		buf := make([]byte, 64)
		for b.Loop() {
			n := runtime.Stack(buf, false)
			_, _ = strconv.ParseInt(strings.Fields(string(buf[:n]))[1], 10, 64)
		}
	})
}

// BenchmarkReentrant is a re-lock and unlock by the owner while it holds
// the lock: local only.
func BenchmarkReentrant(b *testing.B) {
	var counter redisstat.Counter
	r := newRegistry(b, redistest.Shared(b).Client(b, &counter))
	lock := r.Obtain("k")
	lock.Lock()
	defer lock.Unlock()
	before := counter.RoundTrips()
	b.ReportAllocs()
	for b.Loop() {
		lock.Lock()
		lock.Unlock()
	}
	b.ReportMetric(float64(counter.RoundTrips()-before)/float64(b.N), "roundtrips/op")
}

// BenchmarkUncontended is a Lock+Unlock cycle on one key, measured in pairs
// with its physical floor, two PING round trips on the same client: each
// iteration times both, in alternating order, so that noise on a shared
// machine hits both alike. x-floor is the ratio of their totals.
func BenchmarkUncontended(b *testing.B) {
	ctx := context.Background()
	client := redistest.Shared(b).Client(b)
	lock := newRegistry(b, client).Obtain("k")
	lock.Lock() // loads the scripts
	lock.Unlock()
	pings := func() {
		for range 2 {
			if err := client.Ping(ctx).Err(); err != nil {
				b.Fatal(err)
			}
		}
	}
	cycle := func() {
		lock.Lock()
		lock.Unlock()
	}
	var floor, lockreg time.Duration
	timed := func(fn func(), total *time.Duration) {
		start := time.Now()
		fn()
		*total += time.Since(start)
	}
	i := 0
	for b.Loop() {
		if i++; i%2 == 0 {
			timed(pings, &floor)
			timed(cycle, &lockreg)
		} else {
			timed(cycle, &lockreg)
			timed(pings, &floor)
		}
	}
	b.ReportMetric(float64(floor.Nanoseconds())/float64(b.N), "floor-ns/op")
	b.ReportMetric(float64(lockreg.Nanoseconds())/float64(b.N), "lockreg-ns/op")
	b.ReportMetric(float64(lockreg)/float64(floor), "x-floor")
}

// BenchmarkUncontendedWithContext is BenchmarkUncontended's cycle with a
// context: none (Background); a deadline, on a default client, whose
// acquisition runs its attempts in a goroutine of its own so that it can
// return at the deadline while Redis hangs; and a deadline, on a client
// with ContextTimeoutEnabled, which ends its calls at the deadline itself,
// so that the first attempt runs on the caller's goroutine. Each iteration
// times one cycle of each, in an order shuffled every iteration (a fixed
// rotation favours whoever follows whom: see bench/'s turnOrder); x-bg
// are the ratios of their totals to Background's.
func BenchmarkUncontendedWithContext(b *testing.B) {
	srv := redistest.Shared(b)
	timeoutsClient := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	b.Cleanup(func() { _ = timeoutsClient.Close() })
	deadline, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	variants := []struct {
		name string
		lock *Lock
		ctx  context.Context
	}{
		{"background", newRegistry(b, srv.Client(b)).Obtain("bg"), context.Background()},
		{"deadline", newRegistry(b, srv.Client(b)).Obtain("deadline"), deadline},
		{"deadline+ContextTimeoutEnabled", newRegistry(b, timeoutsClient).Obtain("inline"), deadline},
	}
	cycle := func(lock *Lock, ctx context.Context) {
		if err := lock.LockContext(ctx); err != nil {
			b.Fatal(err)
		}
		if err := lock.UnlockContext(ctx); err != nil {
			b.Fatal(err)
		}
	}
	for _, v := range variants {
		cycle(v.lock, v.ctx) // loads the scripts, dials the connections
	}
	totals := make([]time.Duration, len(variants))
	order := []int{0, 1, 2}
	shuffle := rand.New(rand.NewPCG(1, 2))
	for b.Loop() {
		shuffle.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, k := range order {
			start := time.Now()
			cycle(variants[k].lock, variants[k].ctx)
			totals[k] += time.Since(start)
		}
	}
	for k, v := range variants {
		b.ReportMetric(float64(totals[k].Nanoseconds())/float64(b.N), v.name+"-ns/op")
		if k > 0 {
			b.ReportMetric(float64(totals[k])/float64(totals[0]), v.name+"-x-bg")
		}
	}
}

// minimalLock is the least an owner-checked lock runs in Redis: SET NX PX
// to take the key, GET and DEL in one script to release it. It has no
// fencing token and no waiting marker.
var minimalLock = struct{ obtain, release *redis.Script }{
	redis.NewScript(`return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])`),
	redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`),
}

// BenchmarkServerTime measures what an uncontended cycle costs Redis's one
// thread inside the commands the client sends (INFO commandstats), for
// lockreg (a plain SET, then release.lua) and for the minimal owner-checked
// lock (two scripts, as bsm/redislock runs), in alternating blocks of
// cycles.
func BenchmarkServerTime(b *testing.B) {
	ctx := context.Background()
	srv := redistest.Shared(b)
	client := srv.Client(b)
	lock := newRegistry(b, client).Obtain("script-time")
	const lease = "30000"
	cycles := map[string]func(){
		"lockreg": func() {
			lock.Lock()
			lock.Unlock()
		},
		"minimal": func() {
			if err := minimalLock.obtain.Run(ctx, client, []string{"minimal"}, "owner", lease).Err(); err != nil {
				b.Fatal(err)
			}
			if err := minimalLock.release.Run(ctx, client, []string{"minimal"}, "owner").Err(); err != nil {
				b.Fatal(err)
			}
		},
	}
	// The commands each cycle sends; the scripts' own time includes what
	// they run. The tracking connection's GET, which arms the key held,
	// counts too, off the caller's path as it is.
	sent := map[string][]string{"lockreg": {"set", "evalsha", "eval", "get"}, "minimal": {"evalsha", "eval"}}
	micros := func(name string) int64 {
		us, err := redisstat.CommandMicros(ctx, client, sent[name]...)
		if err != nil {
			b.Fatal(err)
		}
		return us
	}
	spent := make(map[string]int64)
	for _, cycle := range cycles {
		cycle() // loads the scripts
	}
	const block = 100
	blocks := 0
	for b.Loop() {
		for _, name := range []string{"lockreg", "minimal"} {
			before := micros(name)
			for range block {
				cycles[name]()
			}
			spent[name] += micros(name) - before
		}
		blocks++
	}
	perCycle := func(name string) float64 { return float64(spent[name]) / float64(blocks*block) }
	b.ReportMetric(perCycle("lockreg"), "lockreg-redis-µs/op")
	b.ReportMetric(perCycle("minimal"), "minimal-redis-µs/op")
	b.ReportMetric(perCycle("lockreg")/perCycle("minimal"), "x-minimal")
}

// BenchmarkGrantServerTime reports what a release that grants the key
// to another registry costs Redis: release.lua's own time, the commands it
// runs included, for a release that also marks its registry as waiting
// (markNext), as one with goroutines behind it does. Each grant is set up
// by commands outside the measure: the key this registry's, one other
// registry's mark. A hand-off between processes waits for this script.
func BenchmarkGrantServerTime(b *testing.B) {
	ctx := context.Background()
	client := redistest.Shared(b).Client(b)
	r := newRegistry(b, client)
	lock := r.Obtain("grant-time")
	setUp := func() {
		_, err := client.Pipelined(ctx, func(p redis.Pipeliner) error {
			p.Del(ctx, lock.keys().Marker(), lock.keys().Queue())
			p.Set(ctx, lock.keys().Lock(), r.clientID, time.Minute)
			p.ZAdd(ctx, lock.keys().Marker(), redis.Z{Score: float64(time.Now().Add(time.Minute).UnixMilli()), Member: "other:1000"})
			p.ZAdd(ctx, lock.keys().Queue(), redis.Z{Score: float64(time.Now().UnixMilli()), Member: "other:1000"})
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	grant := func() {
		found, err := lock.releaseRedis(ctx, protocol.Release{MarkNext: true})
		if err != nil || found.MarkToken == 0 {
			b.Fatalf("release: %+v, %v; want a grant that marks this registry", found, err)
		}
	}
	setUp()
	grant() // loads the script
	const block = 100
	var spent int64
	blocks := 0
	micros := func() int64 {
		us, err := redisstat.CommandMicros(ctx, client, "evalsha", "eval")
		if err != nil {
			b.Fatal(err)
		}
		return us
	}
	for b.Loop() {
		before := micros()
		for range block {
			setUp()
			grant()
		}
		spent += micros() - before
		blocks++
	}
	b.ReportMetric(float64(spent)/float64(blocks*block), "redis-µs/grant")
}

// BenchmarkHotKey has 64 goroutines of one registry take turns on one key,
// with local hand-offs (the default) and without, alone or while a second
// registry with its own connection (standing in for another process) keeps
// taking the key too. It reports what the hot registry's client sends per
// acquisition (roundtrips/op), what the server runs, script bodies
// included (servercmds/op, both registries'), and the second registry's
// longest wait (remote-maxwait-ms).
func BenchmarkHotKey(b *testing.B) {
	for _, c := range []struct{ handoff, remote bool }{{false, false}, {false, true}, {true, true}} {
		handoff := c.handoff
		b.Run(fmt.Sprintf("handoff=%v/remote=%v", c.handoff, c.remote), func(b *testing.B) {
			srv := redistest.Shared(b)
			admin := srv.Client(b)
			var counter redisstat.Counter
			var opts []Option
			if !handoff {
				opts = append(opts, WithLocalHandoff(0, 0))
			}
			r := newRegistry(b, srv.Client(b, &counter), opts...)
			remote := newRegistry(b, srv.Client(b)).Obtain("hot")
			lock := r.Obtain("hot")
			lock.Lock() // loads the scripts and dials the first connection
			lock.Unlock()

			type remoteResult struct {
				acquisitions int
				longest      time.Duration
			}
			stopRemote := make(chan struct{})
			remoteDone := make(chan remoteResult)
			go func() {
				var res remoteResult
				for c.remote {
					select {
					case <-stopRemote:
						remoteDone <- res
						return
					default:
					}
					start := time.Now()
					remote.Lock()
					res.longest = max(res.longest, time.Since(start))
					res.acquisitions++
					remote.Unlock()
				}
				<-stopRemote
				remoteDone <- res
			}()
			statsBefore := commandStats(b, admin)
			before := counter.RoundTrips()
			b.SetParallelism(64 / runtime.GOMAXPROCS(0))
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					lock.Lock()
					lock.Unlock()
				}
			})
			b.StopTimer()
			server := redisstat.Delta(statsBefore, commandStats(b, admin))
			close(stopRemote)
			rem := <-remoteDone
			delete(server, "info")
			var serverCmds int64
			for _, n := range server {
				serverCmds += n
			}
			// Round trips are the hammering registry's; server commands are
			// both registries', per acquisition of either.
			b.ReportMetric(float64(counter.RoundTrips()-before)/float64(b.N), "roundtrips/op")
			b.ReportMetric(float64(serverCmds)/float64(b.N+rem.acquisitions), "servercmds/op")
			if c.remote {
				b.ReportMetric(float64(rem.longest)/float64(time.Millisecond), "remote-maxwait-ms")
				b.ReportMetric(float64(rem.acquisitions), "remote-acquisitions")
			}
		})
	}
}

func commandStats(b *testing.B, c redis.UniversalClient) map[string]int64 {
	b.Helper()
	stats, err := redisstat.CommandStats(context.Background(), c)
	if err != nil {
		b.Fatal(err)
	}
	return stats
}

// BenchmarkDistinctKeys locks and unlocks in parallel, each goroutine on a
// key of its own (bench/'s S6, the rueidislock README's shape): what one
// registry costs when Redis, not contention, is the limit.
func BenchmarkDistinctKeys(b *testing.B) {
	reg := newRegistry(b, redistest.Shared(b).Client(b))
	var next atomic.Int64
	b.SetParallelism(32) // 64 goroutines on 2 cores
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		lock := reg.Obtain("distinct-" + strconv.FormatInt(next.Add(1), 10))
		for pb.Next() {
			lock.Lock()
			lock.Unlock()
		}
	})
}

// BenchmarkHoldStyles times an uncontended cycle in each way of holding a
// key, on one registry and client, with a Background context: Lock+Unlock,
// LockContext+UnlockContext, Acquire+Release, and Do (a no-op fn). Each
// iteration times one cycle of each, in an order shuffled every iteration;
// x-lockcontext are the ratios of their totals to LockContext's, and
// roundtrips-per-cycle what each sends to Redis.
func BenchmarkHoldStyles(b *testing.B) {
	ctx := context.Background()
	var counter redisstat.Counter
	r := newRegistry(b, redistest.Shared(b).Client(b, &counter))
	noop := func(context.Context) error { return nil }
	styles := []struct {
		name  string
		cycle func() error
	}{
		{"lockcontext", func() error {
			lock := r.Obtain("lockcontext")
			if err := lock.LockContext(ctx); err != nil {
				return err
			}
			return lock.UnlockContext(ctx)
		}},
		{"lock", func() error {
			lock := r.Obtain("lock")
			lock.Lock()
			lock.Unlock()
			return nil
		}},
		{"acquire", func() error {
			h, err := r.Obtain("acquire").Acquire(ctx)
			if err != nil {
				return err
			}
			return h.Release(ctx)
		}},
		{"do", func() error { return r.Do(ctx, "do", noop) }},
	}
	for _, s := range styles {
		if err := s.cycle(); err != nil { // loads the scripts, dials
			b.Fatal(err)
		}
	}
	totals := make([]time.Duration, len(styles))
	roundTrips := make([]int64, len(styles))
	order := []int{0, 1, 2, 3}
	shuffle := rand.New(rand.NewPCG(1, 2))
	b.ReportAllocs()
	for b.Loop() {
		shuffle.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, k := range order {
			before := counter.RoundTrips()
			start := time.Now()
			if err := styles[k].cycle(); err != nil {
				b.Fatal(err)
			}
			totals[k] += time.Since(start)
			roundTrips[k] += counter.RoundTrips() - before
		}
	}
	for k, s := range styles {
		b.ReportMetric(float64(totals[k].Nanoseconds())/float64(b.N), s.name+"-ns/op")
		b.ReportMetric(float64(roundTrips[k])/float64(b.N), s.name+"-roundtrips/op")
		if k > 0 {
			b.ReportMetric(float64(totals[k])/float64(totals[0]), s.name+"-x-lockcontext")
		}
	}
}

// BenchmarkReentrantDo is a Do nested in another on the same key, through
// fn's context: local only.
func BenchmarkReentrantDo(b *testing.B) {
	var counter redisstat.Counter
	r := newRegistry(b, redistest.Shared(b).Client(b, &counter))
	noop := func(context.Context) error { return nil }
	err := r.Do(context.Background(), "k", func(ctx context.Context) error {
		before := counter.RoundTrips()
		b.ReportAllocs()
		for b.Loop() {
			if err := r.Do(ctx, "k", noop); err != nil {
				return err
			}
		}
		b.ReportMetric(float64(counter.RoundTrips()-before)/float64(b.N), "roundtrips/op")
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}

// BenchmarkRenewalRound times one watchdog renewal round for a registry
// holding 100 keys, with the owner name's refresh in its pipeline (as the
// watchdog sends it) and without, interleaved: x-without is the ratio of
// their times, extra-servercmds what the refresh adds inside Redis.
func BenchmarkRenewalRound(b *testing.B) {
	ctx := context.Background()
	srv := redistest.Shared(b)
	admin := srv.Client(b)
	r := newRegistry(b, srv.Client(b))
	for i := range 100 {
		if _, err := r.Obtain("renewed-" + strconv.Itoa(i)).Acquire(ctx); err != nil {
			b.Fatal(err)
		}
	}
	batches := r.renewalBatches(r.dueForRenewal())
	rounds := map[string]func(){
		"with":    func() { r.renew(ctx, batches, r.peer.RefreshOwner()...) },
		"without": func() { r.renew(ctx, batches) },
	}
	var with, without time.Duration
	var cmdsWith, cmdsWithout int64
	count := func() int64 {
		var n int64
		for _, c := range commandStats(b, admin) {
			n += c
		}
		return n
	}
	for b.Loop() {
		for _, name := range []string{"with", "without"} {
			before := count()
			start := time.Now()
			rounds[name]()
			took := time.Since(start)
			cmds := count() - before - 1 // the INFO that counted
			if name == "with" {
				with, cmdsWith = with+took, cmdsWith+cmds
			} else {
				without, cmdsWithout = without+took, cmdsWithout+cmds
			}
		}
	}
	b.ReportMetric(float64(with.Nanoseconds())/float64(b.N), "with-ns/op")
	b.ReportMetric(float64(without.Nanoseconds())/float64(b.N), "without-ns/op")
	b.ReportMetric(float64(with)/float64(without), "x-without")
	b.ReportMetric(float64(cmdsWith-cmdsWithout)/float64(b.N), "extra-servercmds")
}
