package lockreg

import (
	"context"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/lockreg/lockreg/internal/redisstat"
	"github.com/lockreg/lockreg/internal/redistest"
)

// Figures in README.md come from:
//
//	go test -run '^$' -bench . -count 10 . | tee bench.txt && benchstat bench.txt

// BenchmarkGoroutineID compares the two ways of telling goroutines apart
// that ownership could use; lockreg uses goid.
func BenchmarkGoroutineID(b *testing.B) {
	b.Run("goid", func(b *testing.B) {
		for b.Loop() {
			_ = goroutineID()
		}
	})
	b.Run("runtime.Stack", func(b *testing.B) {
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

// BenchmarkUncontended is a Lock+Unlock cycle on one key beside its
// physical floor, two PING round trips on the same client, in one run.
func BenchmarkUncontended(b *testing.B) {
	client := redistest.Shared(b).Client(b)
	ctx := context.Background()
	b.Run("2xPING", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := client.Ping(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			if err := client.Ping(ctx).Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("lockreg", func(b *testing.B) {
		lock := newRegistry(b, client).Obtain("k")
		lock.Lock() // loads the scripts
		lock.Unlock()
		b.ReportAllocs()
		for b.Loop() {
			lock.Lock()
			lock.Unlock()
		}
	})
}

// BenchmarkHotKey has 64 goroutines of one registry take turns on one key.
// It reports what the client sends per acquisition (roundtrips/op) and what
// the server runs, script bodies included (servercmds/op).
func BenchmarkHotKey(b *testing.B) {
	srv := redistest.Shared(b)
	admin := srv.Client(b)
	var counter redisstat.Counter
	r := newRegistry(b, srv.Client(b, &counter))
	lock := r.Obtain("hot")
	lock.Lock() // loads the scripts and dials the first connection
	lock.Unlock()

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
	delete(server, "info")
	var serverCmds int64
	for _, n := range server {
		serverCmds += n
	}
	b.ReportMetric(float64(counter.RoundTrips()-before)/float64(b.N), "roundtrips/op")
	b.ReportMetric(float64(serverCmds)/float64(b.N), "servercmds/op")
}

func commandStats(b *testing.B, c redis.UniversalClient) map[string]int64 {
	b.Helper()
	stats, err := redisstat.CommandStats(context.Background(), c)
	if err != nil {
		b.Fatal(err)
	}
	return stats
}
