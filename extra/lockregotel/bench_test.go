package lockregotel_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/lockreg/lockreg"
	"github.com/lockreg/lockreg/extra/lockregotel"
	"github.com/lockreg/lockreg/internal/redistest"
)

// ways are the ways a registry is instrumented in the benchmarks: off
// (never); metrics, into the SDK with a manual reader, which aggregates as
// any reader does and is not read meanwhile; tracing, into the SDK
// sampling every span and batching them to an exporter that drops them;
// and both.
var ways = []string{"off", "metrics", "tracing", "metrics+tracing"}

// providers are the options of InstrumentMetrics and InstrumentTracing
// to instrument a registry way, into providers of its own that stop when
// the benchmark ends; nil for those the way leaves out.
func providers(b *testing.B, way string) (metrics, tracing []lockregotel.Option) {
	ctx := context.Background()
	if strings.Contains(way, "metrics") {
		meters := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
		b.Cleanup(func() { require.NoError(b, meters.Shutdown(ctx)) })
		metrics = []lockregotel.Option{lockregotel.WithMeterProvider(meters)}
	}
	if strings.Contains(way, "tracing") {
		tracer := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
		b.Cleanup(func() { require.NoError(b, tracer.Shutdown(ctx)) })
		tracing = []lockregotel.Option{lockregotel.WithTracerProvider(tracer)}
	}
	return metrics, tracing
}

// instrumentedLock is a lock of a registry of its own, instrumented way.
func instrumentedLock(b *testing.B, way string) *lockreg.Lock {
	r, _ := newRegistry(b, redistest.Shared(b).Client(b))
	metrics, tracing := providers(b, way)
	if metrics != nil {
		require.NoError(b, lockregotel.InstrumentMetrics(r, metrics...))
	}
	if tracing != nil {
		require.NoError(b, lockregotel.InstrumentTracing(r, tracing...))
	}
	lock := r.Obtain("k")
	cycle(b, lock) // loads the scripts, dials the connection
	return lock
}

// cycle is the uncontended cycle: Acquire, then Release.
func cycle(b *testing.B, lock *lockreg.Lock) {
	ctx := context.Background()
	h, err := lock.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	if err := h.Release(ctx); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkUncontended is the uncontended cycle, instrumented each way,
// for its allocations. Its times come one way after the other; see
// BenchmarkUncontendedSideBySide for their ratios.
func BenchmarkUncontended(b *testing.B) {
	for _, way := range ways {
		b.Run("instrumentation="+way, func(b *testing.B) {
			lock := instrumentedLock(b, way)
			b.ReportAllocs()
			for b.Loop() {
				cycle(b, lock)
			}
		})
	}
}

// BenchmarkUncontendedSideBySide times, for each way of instrumenting, a
// cycle instrumented that way and an uninstrumented one per iteration, in
// alternating order, so that noise on a shared machine hits both alike;
// x-off is the ratio of their totals. Each way has a run of its own, so
// that the batching goroutine of tracing's does not disturb metrics'.
// instrumentation=off pairs two uninstrumented registries: the A/A
// control, whose x-off is the method's own error.
func BenchmarkUncontendedSideBySide(b *testing.B) {
	for _, way := range ways {
		b.Run("instrumentation="+way, func(b *testing.B) {
			off, on := instrumentedLock(b, "off"), instrumentedLock(b, way)
			var offTotal, onTotal time.Duration
			timed := func(lock *lockreg.Lock, total *time.Duration) {
				start := time.Now()
				cycle(b, lock)
				*total += time.Since(start)
			}
			i := 0
			for b.Loop() {
				if i++; i%2 == 0 {
					timed(off, &offTotal)
					timed(on, &onTotal)
				} else {
					timed(on, &onTotal)
					timed(off, &offTotal)
				}
			}
			b.ReportMetric(float64(offTotal.Nanoseconds())/float64(b.N), "off-ns/op")
			b.ReportMetric(float64(onTotal.Nanoseconds())/float64(b.N), "on-ns/op")
			b.ReportMetric(float64(onTotal)/float64(offTotal), "x-off")
		})
	}
}

// BenchmarkHooksOfACycle is what the hooks cost an uncontended cycle,
// without Redis: they are called as a registry calls them for an Acquire
// of one attempt and a Release. It is the instrumentation's own cost,
// which the wall time of a cycle on a shared machine blurs.
func BenchmarkHooksOfACycle(b *testing.B) {
	for _, way := range ways[1:] {
		b.Run("instrumentation="+way, func(b *testing.B) {
			var hooks []lockreg.Hooks
			metrics, tracing := providers(b, way)
			if metrics != nil {
				h, err := lockregotel.MetricsHooks("bench", metrics)
				require.NoError(b, err)
				hooks = append(hooks, h)
			}
			if tracing != nil {
				hooks = append(hooks, lockregotel.TracingHooks("bench", tracing))
			}
			b.ReportAllocs()
			for b.Loop() {
				callHooks(hooks)
			}
		})
	}
}

// callHooks calls the hooks that a registry calls for an uncontended
// cycle (an acquisition of one attempt, then a release), with the
// contexts it passes them.
func callHooks(hooks []lockreg.Hooks) {
	acquire, release := context.Background(), context.Background()
	for _, h := range hooks {
		if h.AcquireStart != nil {
			acquire = h.AcquireStart(acquire, "k")
		}
	}
	for _, h := range hooks {
		if h.AcquireAttempt != nil {
			h.AcquireAttempt(acquire, "k")
		}
		if h.RedisCalls != nil {
			h.RedisCalls(lockreg.OpAcquire, 1)
		}
	}
	for _, h := range hooks {
		if h.AcquireDone != nil {
			h.AcquireDone(acquire, lockreg.AcquireEvent{Key: "k", Wait: 50 * time.Microsecond, Outcome: lockreg.OutcomeAcquired, Path: lockreg.PathRedis})
		}
		if h.ReleaseStart != nil {
			release = h.ReleaseStart(release, "k")
		}
	}
	for _, h := range hooks {
		if h.RedisCalls != nil {
			h.RedisCalls(lockreg.OpRelease, 1)
		}
		if h.ReleaseDone != nil {
			h.ReleaseDone(release, lockreg.ReleaseEvent{Key: "k", Held: 20 * time.Microsecond})
		}
	}
}
