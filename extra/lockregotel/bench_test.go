package lockregotel_test

import (
	"context"
	"math/rand/v2"
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

// instrumented is a lock of its own registry, instrumented one way.
type instrumented struct {
	name string
	lock *lockreg.Lock
}

// instrumentedLocks are the ways to instrument a registry, each with a
// lock on a registry of its own: off (never instrumented); metrics, into
// the SDK with a manual reader, which aggregates as any reader does and is
// not read meanwhile; tracing, into the SDK sampling every span and
// batching them to an exporter that drops them; and both.
func instrumentedLocks(b *testing.B) []instrumented {
	srv := redistest.Shared(b)
	meters := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	tracer := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	b.Cleanup(func() {
		require.NoError(b, meters.Shutdown(context.Background()))
		require.NoError(b, tracer.Shutdown(context.Background()))
	})
	var locks []instrumented
	for _, v := range []struct {
		name       string
		instrument []func(*lockreg.Registry, ...lockregotel.Option) error
	}{
		{"off", nil},
		{"metrics", []func(*lockreg.Registry, ...lockregotel.Option) error{lockregotel.InstrumentMetrics}},
		{"tracing", []func(*lockreg.Registry, ...lockregotel.Option) error{lockregotel.InstrumentTracing}},
		{"metrics+tracing", []func(*lockreg.Registry, ...lockregotel.Option) error{lockregotel.InstrumentMetrics, lockregotel.InstrumentTracing}},
	} {
		r, registryKey := newRegistry(b, srv.Client(b))
		for _, instrument := range v.instrument {
			require.NoError(b, instrument(r, lockregotel.WithMeterProvider(meters), lockregotel.WithTracerProvider(tracer), lockregotel.WithRegistryKey(registryKey)))
		}
		lock := r.Obtain(v.name)
		cycle(b, lock) // loads the scripts, dials the connection
		locks = append(locks, instrumented{v.name, lock})
	}
	return locks
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
	for _, v := range instrumentedLocks(b) {
		b.Run("instrumentation="+v.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				cycle(b, v.lock)
			}
		})
	}
}

// BenchmarkUncontendedSideBySide times one uncontended cycle of each way
// per iteration, in an order shuffled every iteration, so that noise on a
// shared machine hits all alike; x-off are the ratios of their totals to
// the uninstrumented registry's.
func BenchmarkUncontendedSideBySide(b *testing.B) {
	locks := instrumentedLocks(b)
	totals := make([]time.Duration, len(locks))
	order := make([]int, len(locks))
	for i := range order {
		order[i] = i
	}
	shuffle := rand.New(rand.NewPCG(1, 2))
	for b.Loop() {
		shuffle.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, k := range order {
			start := time.Now()
			cycle(b, locks[k].lock)
			totals[k] += time.Since(start)
		}
	}
	for k, v := range locks {
		b.ReportMetric(float64(totals[k].Nanoseconds())/float64(b.N), v.name+"-ns/op")
		if k > 0 {
			b.ReportMetric(float64(totals[k])/float64(totals[0]), v.name+"-x-off")
		}
	}
}
