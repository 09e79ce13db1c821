package lockregotel

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/lockreg/lockreg"
)

// durationBuckets are the histograms' bucket bounds, in seconds: from an
// uncontended acquisition on a nearby Redis (about 100µs) to holds of
// minutes. OpenTelemetry's default bounds start at 5ms, above most of
// them. A View can set others.
var durationBuckets = []float64{
	0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
	0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 600,
}

// InstrumentMetrics reports what reg does as the metrics listed in the
// package documentation, from now on. Instrument a registry once: a second
// time into the same meter provider returns ErrInstrumented. Once reg is
// closed (Registry.Done), lockreg.holds and lockreg.redis.calls no longer
// observe it, and the provider keeps it no more.
func InstrumentMetrics(reg *lockreg.Registry, opts ...Option) error {
	if reg == nil {
		return ErrNoRegistry
	}
	// lockreg.holds counts as Stats does, the holds taken before too: the
	// hooks see only the acquisitions that begin from now on, and would
	// count the releases of the earlier holds below zero.
	// Refused before the instruments are made: their callback would
	// observe the registry all the same.
	forget, err := instrumentOnce(reg, newConfig(reg.Key(), opts).mp)
	if err != nil {
		return err
	}
	hooks, err := metricsHooks(reg.Key(), func() int64 { return reg.Stats().Held }, reg.Done(), opts)
	if err != nil {
		forget()
		return err
	}
	reg.AddHooks(hooks)
	return nil
}

// metricsHooks are the hooks that InstrumentMetrics adds to a registry of
// namespace, whose holds held counts (Stats().Held), and which closes done
// (Registry.Done) once closed.
func metricsHooks(namespace string, held func() int64, done <-chan struct{}, opts []Option) (lockreg.Hooks, error) {
	c := newConfig(namespace, opts)
	m, err := newMetrics(&c, held, done)
	if err != nil {
		return lockreg.Hooks{}, err
	}
	return lockreg.Hooks{
		AcquireDone: m.acquireDone,
		ReleaseDone: m.releaseDone,
		Lost:        m.lose,
		RedisCalls:  m.calls.add,
	}, nil
}

// metrics are a registry's instruments, what they measure, and the
// attributes of their measurements.
type metrics struct {
	acquireDuration, holdDuration metric.Float64Histogram
	lost                          metric.Int64Counter
	holds                         metric.Int64ObservableUpDownCounter // observes held, or live
	redisCalls                    metric.Int64ObservableCounter       // observes calls
	held                          func() int64                        // the registry's holds, without WithLockKeys
	live                          liveHolds                           // with WithLockKeys
	calls                         callCounts

	base []attribute.KeyValue // every measurement's
	keys bool                 // WithLockKeys
	// Without keys, the attribute sets of the histograms' measurements
	// that come with every acquisition are made once: plain (base alone),
	// acquired (by outcome and path).
	plain    []metric.RecordOption
	acquired map[acquireKind][]metric.RecordOption
}

// acquireKind is how an acquisition ended, as its attributes tell.
type acquireKind struct {
	outcome lockreg.Outcome
	path    lockreg.Path
}

func newMetrics(c *config, held func() int64, done <-chan struct{}) (*metrics, error) {
	meter := c.mp.Meter(scope)
	var errs [6]error
	m := &metrics{base: c.baseAttributes(), keys: c.keys, held: held}
	m.acquireDuration, errs[0] = meter.Float64Histogram("lockreg.acquire.duration", metric.WithUnit("s"),
		metric.WithDescription("How long acquisitions took, waiting included."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	m.holdDuration, errs[1] = meter.Float64Histogram("lockreg.hold.duration", metric.WithUnit("s"),
		metric.WithDescription("How long holds lasted, from their acquisition to their release or loss."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	m.lost, errs[2] = meter.Int64Counter("lockreg.lost", metric.WithUnit("{hold}"),
		metric.WithDescription("Holds lost, by cause."))
	m.holds, errs[3] = meter.Int64ObservableUpDownCounter("lockreg.holds", metric.WithUnit("{hold}"),
		metric.WithDescription("Holds acquired and not released yet."))
	m.redisCalls, errs[4] = meter.Int64ObservableCounter("lockreg.redis.calls", metric.WithUnit("{call}"),
		metric.WithDescription("Calls sent to Redis, by operation."))
	var observing metric.Registration
	observing, errs[5] = meter.RegisterCallback(m.observe, m.holds, m.redisCalls)
	if err := errors.Join(errs[:]...); err != nil {
		if observing != nil {
			_ = observing.Unregister()
		}
		return nil, fmt.Errorf("lockregotel: %w", err)
	}
	if done != nil {
		// The callback keeps the registry (held reads it) for as long as
		// the provider lives: a closed registry is let go. Not from the
		// callback: the SDK holds the lock that Unregister takes while it
		// runs callbacks.
		go func() {
			<-done
			_ = observing.Unregister()
		}()
	}
	if m.keys {
		m.live.byKey = map[string]int64{}
		return m, nil
	}
	m.plain = recordWith(m.base...)
	m.acquired = map[acquireKind][]metric.RecordOption{}
	for _, k := range []acquireKind{
		{lockreg.OutcomeAcquired, lockreg.PathRedis},
		{lockreg.OutcomeAcquired, lockreg.PathHandoff},
		{lockreg.OutcomeAcquired, lockreg.PathGrant},
		{lockreg.OutcomeNotObtained, ""},
		{lockreg.OutcomeClosed, ""},
		{lockreg.OutcomeError, ""},
	} {
		m.acquired[k] = recordWith(m.with(k.attributes()...)...)
	}
	return m, nil
}

// with is the attributes of a measurement: the base ones and extra.
func (m *metrics) with(extra ...attribute.KeyValue) []attribute.KeyValue {
	return append(append(make([]attribute.KeyValue, 0, len(m.base)+len(extra)+1), m.base...), extra...)
}

// attrs is the attributes of a measurement of key: with's, and the key
// with WithLockKeys.
func (m *metrics) attrs(key string, extra ...attribute.KeyValue) []attribute.KeyValue {
	attrs := m.with(extra...)
	if m.keys {
		attrs = append(attrs, keyAttr.String(key))
	}
	return attrs
}

func (k acquireKind) attributes() []attribute.KeyValue {
	if k.path == "" {
		return []attribute.KeyValue{outcomeAttr.String(string(k.outcome))}
	}
	return []attribute.KeyValue{outcomeAttr.String(string(k.outcome)), pathAttr.String(string(k.path))}
}

func (m *metrics) acquireDone(ctx context.Context, e lockreg.AcquireEvent) {
	kind := acquireKind{e.Outcome, e.Path}
	opts, ok := m.acquired[kind]
	if !ok {
		opts = recordWith(m.attrs(e.Key, kind.attributes()...)...)
	}
	m.acquireDuration.Record(ctx, e.Wait.Seconds(), opts...)
	if m.keys && e.Outcome == lockreg.OutcomeAcquired {
		m.live.add(e.Key, 1)
	}
}

func (m *metrics) releaseDone(ctx context.Context, e lockreg.ReleaseEvent) {
	if errors.Is(e.Err, lockreg.ErrNotHeld) {
		return // released before: this release ended no hold
	}
	if m.keys {
		m.live.add(e.Key, -1)
	}
	switch {
	case e.WasLost: // its loss was measured
	case e.FoundLost != 0:
		// The release found the hold lost, and is the first to know.
		m.ended(ctx, e.Key, e.FoundLost.String(), e.Held)
	case m.keys:
		m.holdDuration.Record(ctx, e.Held.Seconds(), recordWith(m.attrs(e.Key)...)...)
	default:
		m.holdDuration.Record(ctx, e.Held.Seconds(), m.plain...)
	}
}

func (m *metrics) lose(e lockreg.LossEvent) {
	m.ended(context.Background(), e.Key, e.Cause.String(), e.Held)
}

// ended measures a hold of key lost for cause after held.
func (m *metrics) ended(ctx context.Context, key, cause string, held time.Duration) {
	set := metric.WithAttributeSet(attribute.NewSet(m.attrs(key, causeAttr.String(cause))...))
	m.lost.Add(ctx, 1, set)
	m.holdDuration.Record(ctx, held.Seconds(), set)
}

// observe reports the live holds and the Redis calls, as metrics are
// collected.
func (m *metrics) observe(_ context.Context, o metric.Observer) error {
	m.calls.each(func(op lockreg.RedisOp, n int64) {
		o.ObserveInt64(m.redisCalls, n, metric.WithAttributes(m.with(operationAttr.String(string(op)))...))
	})
	if !m.keys {
		o.ObserveInt64(m.holds, m.held(), metric.WithAttributes(m.base...))
		return nil
	}
	for key, n := range m.live.perKey() {
		o.ObserveInt64(m.holds, n, metric.WithAttributes(m.attrs(key)...))
	}
	return nil
}
