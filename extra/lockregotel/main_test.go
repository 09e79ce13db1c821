package lockregotel_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.uber.org/goleak"

	"github.com/lockreg/lockreg"
	"github.com/lockreg/lockreg/extra/lockregotel"
	"github.com/lockreg/lockreg/internal/redistest"
)

// TestMain checks that the tests leave no goroutine behind: registries,
// clients, servers and span processors all stop.
func TestMain(m *testing.M) { goleak.VerifyTestMain(redistest.M(m)) }

// newRegistry is a registry on client for one test, closed when it ends,
// and its namespace, of its own: the runs of -count must not meet the
// keys that earlier ones left to expire.
func newRegistry(t testing.TB, client redis.UniversalClient, opts ...lockreg.Option) (*lockreg.Registry, string) {
	t.Helper()
	namespace := fmt.Sprintf("lockregotel-test:%s:%d", t.Name(), registries.Add(1))
	return openRegistry(t, client, namespace, opts...), namespace
}

var registries atomic.Int64 // registries made, for their namespaces

// openRegistry is a registry of namespace on client, closed when the
// test ends.
func openRegistry(t testing.TB, client redis.UniversalClient, namespace string, opts ...lockreg.Option) *lockreg.Registry {
	t.Helper()
	opts = append([]lockreg.Option{lockreg.WithLogger(slog.New(slog.DiscardHandler))}, opts...)
	r, err := lockreg.New(client, namespace, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, r.Close()) })
	return r
}

// contenders are two registries of one namespace, on the shared server,
// the first made with opts: each with its own client, as two processes'
// would have. The client of the first is returned.
func contenders(t *testing.T, opts ...lockreg.Option) (r, other *lockreg.Registry, namespace string, client *redis.Client) {
	t.Helper()
	srv := redistest.Shared(t)
	client = srv.Client(t)
	r, namespace = newRegistry(t, client, opts...)
	other = openRegistry(t, srv.Client(t), namespace)
	return r, other, namespace, client
}

// timesOut holds key in other, and requires that r's acquisition of it
// times out after 100ms.
func timesOut(t *testing.T, r, other *lockreg.Registry, key string) {
	t.Helper()
	ctx := context.Background()
	_, err := other.Obtain(key).Acquire(ctx)
	require.NoError(t, err)
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	_, err = r.Obtain(key).Acquire(short)
	require.ErrorIs(t, err, lockreg.ErrNotObtained)
}

// requireFires waits for ch to close within limit.
func requireFires(t *testing.T, ch <-chan struct{}, limit time.Duration, msg string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(limit):
		t.Fatalf("%s: no signal within %v", msg, limit)
	}
}

// meters reads the metrics of the registries instrumented with it, in
// memory, as an exporter would.
type meters struct {
	reader    *sdkmetric.ManualReader
	provider  *sdkmetric.MeterProvider
	namespace string // what every measurement's lockreg.registry must be
	keys      bool   // whether every measurement names its key (WithLockKeys)
}

func newMeters(t *testing.T, namespace string) *meters {
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { require.NoError(t, provider.Shutdown(context.Background())) })
	return &meters{reader: reader, provider: provider, namespace: namespace}
}

// instrument is InstrumentMetrics for r, into m, with opts.
func (m *meters) instrument(t *testing.T, r *lockreg.Registry, opts ...lockregotel.Option) {
	t.Helper()
	opts = append([]lockregotel.Option{lockregotel.WithMeterProvider(m.provider)}, opts...)
	require.NoError(t, lockregotel.InstrumentMetrics(r, opts...))
}

// point is a data point: its attributes, and its value, a sum's or a
// histogram's count and sum.
type point struct {
	attrs map[string]string
	value int64
	count uint64
	sum   float64
}

// collect reads every data point, by instrument name, and checks the
// attributes every one carries: lockreg.registry, and a key only with
// m.keys (but lockreg.redis.calls's, which never do).
func (m *meters) collect(t *testing.T) map[string][]point {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, m.reader.Collect(context.Background(), &rm))
	points := map[string][]point{}
	attrsOf := func(name string, set attribute.Set) map[string]string {
		attrs := map[string]string{}
		for _, kv := range set.ToSlice() {
			attrs[string(kv.Key)] = kv.Value.Emit()
		}
		require.Equal(t, m.namespace, attrs["lockreg.registry"], name)
		_, keyed := attrs["lockreg.key"]
		require.Equal(t, m.keys && name != "lockreg.redis.calls", keyed, "%s: %v", name, attrs)
		return attrs
	}
	for _, sm := range rm.ScopeMetrics {
		require.Equal(t, "github.com/lockreg/lockreg/extra/lockregotel", sm.Scope.Name)
		for _, metric := range sm.Metrics {
			switch data := metric.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range data.DataPoints {
					points[metric.Name] = append(points[metric.Name], point{attrs: attrsOf(metric.Name, dp.Attributes), value: dp.Value})
				}
			case metricdata.Histogram[float64]:
				require.Equal(t, "s", metric.Unit, metric.Name)
				for _, dp := range data.DataPoints {
					points[metric.Name] = append(points[metric.Name], point{attrs: attrsOf(metric.Name, dp.Attributes), count: dp.Count, sum: dp.Sum})
				}
			default:
				t.Fatalf("%s: unexpected data %T", metric.Name, data)
			}
		}
	}
	return points
}

// total adds up the points whose attributes include where: name, value,
// name, value...
func total(t *testing.T, points []point, where ...string) point {
	t.Helper()
	var sum point
next:
	for _, p := range points {
		for i := 0; i < len(where); i += 2 {
			if p.attrs[where[i]] != where[i+1] {
				continue next
			}
		}
		sum.value += p.value
		sum.count += p.count
		sum.sum += p.sum
	}
	return sum
}
