package lockreg

import (
	"context"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/lockreg/lockreg/internal/redistest"
)

// What a held lock and a waiting goroutine keep on the Go heap (#34):
// make bench-lib runs these once, into bench-heap.txt.

// BenchmarkHeldLockHeap weighs what a held lock keeps in Go: it takes
// 20,000 keys with Acquire on one registry and reports the live heap's
// growth per held lock, in bytes and objects, after a full collection
// before and after (bench/RESULTS.md, #34). Each iteration takes and
// releases them all.
func BenchmarkHeldLockHeap(b *testing.B) {
	ctx := context.Background()
	r := newRegistry(b, redistest.Shared(b).Client(b))
	const n = 20_000
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "heap-" + strconv.Itoa(i)
	}
	holds := make([]*Hold, n)
	warm, err := r.Obtain("warm").Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	_ = warm.Release(ctx)
	var bytes, objects float64
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for i, k := range keys {
			if holds[i], err = r.Obtain(k).Acquire(ctx); err != nil {
				b.Fatal(err)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		bytes += float64(after.HeapAlloc-before.HeapAlloc) / n
		objects += float64(after.HeapObjects-before.HeapObjects) / n
		for _, h := range holds {
			if err := h.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
		clear(holds) // else the next iteration's first weighing counts them
	}
	b.ReportMetric(bytes/float64(b.N), "B/held")
	b.ReportMetric(objects/float64(b.N), "objects/held")
}

// BenchmarkWaiterHeap weighs what a goroutine waiting in Acquire keeps on
// the heap above a plain goroutine waiting on the same ctx, for a key
// held by this registry (local) and by another (remote). 2,000 goroutines
// wait each time, and the heap is weighed after a full collection once
// they all wait. The goroutines of a first, unweighed round have ended, so
// that both weighings reuse their g's rather than count new ones.
func BenchmarkWaiterHeap(b *testing.B) {
	const n = 2_000
	client := redistest.Shared(b).Client(b)
	weigh := func(wait func(ctx context.Context)) float64 {
		ctx, cancel := context.WithCancel(context.Background())
		var waiting, ended sync.WaitGroup
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for range n {
			waiting.Add(1)
			ended.Add(1)
			go func() {
				defer ended.Done()
				waiting.Done()
				wait(ctx)
			}()
		}
		waiting.Wait()
		time.Sleep(50 * time.Millisecond) // the last ones reach their wait
		runtime.GC()
		runtime.ReadMemStats(&after)
		cancel()
		ended.Wait()
		return float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / n
	}
	plain := func(ctx context.Context) { <-ctx.Done() }
	weigh(plain)
	for _, remote := range []bool{false, true} {
		b.Run(map[bool]string{false: "local", true: "remote"}[remote], func(b *testing.B) {
			ctx := context.Background()
			r := newRegistry(b, client)
			holder := r
			if remote {
				holder = newRegistry(b, client)
			}
			var above float64
			i := 0
			for b.Loop() {
				key := "waited-" + strconv.Itoa(i)
				i++
				h, err := holder.Obtain(key).Acquire(ctx)
				if err != nil {
					b.Fatal(err)
				}
				plainBytes := weigh(plain)
				above += weigh(func(ctx context.Context) {
					if _, err := r.Obtain(key).Acquire(ctx); err == nil {
						b.Error("acquired a held key")
					}
				}) - plainBytes
				_ = h.Release(ctx)
			}
			b.ReportMetric(above/float64(b.N), "B/waiter-above-plain")
		})
	}
}
