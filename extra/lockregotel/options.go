package lockregotel

import (
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// An Option configures InstrumentMetrics or InstrumentTracing. Both take
// every option, as go-redis's do, and ignore the provider that is not
// theirs.
type Option func(*config)

type config struct {
	mp       metric.MeterProvider
	tp       trace.TracerProvider
	registry string // the namespace
	attrs    []attribute.KeyValue
	keys     bool
}

func newConfig(namespace string, opts []Option) config {
	c := config{mp: otel.GetMeterProvider(), tp: otel.GetTracerProvider(), registry: namespace}
	for _, opt := range opts {
		if opt != nil {
			opt(&c)
		}
	}
	return c
}

// baseAttributes are the attributes of every measurement and span: the
// registry's, then WithAttributes'.
func (c *config) baseAttributes() []attribute.KeyValue {
	return append([]attribute.KeyValue{registryAttr.String(c.registry)}, c.attrs...)
}

// WithMeterProvider makes InstrumentMetrics take its meter from mp rather
// than from otel.GetMeterProvider().
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) {
		if mp != nil { // a provider left nil (telemetry off) keeps the global one
			c.mp = mp
		}
	}
}

// WithTracerProvider makes InstrumentTracing take its tracer from tp rather
// than from otel.GetTracerProvider().
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) {
		if tp != nil { // as WithMeterProvider
			c.tp = tp
		}
	}
}

// WithAttributes adds attrs to every measurement and span, as
// redisotel.WithAttributes does: the service's or the deployment's, say.
func WithAttributes(attrs ...attribute.KeyValue) Option {
	return func(c *config) { c.attrs = append(c.attrs, attrs...) }
}

// WithLockKeys records each lock's key as the lockreg.key attribute, on
// measurements and spans, and leaves it in spans' error descriptions.
// Without it, keys appear nowhere: every key would make a series of its
// own, and a key may name a customer or an order.
func WithLockKeys() Option {
	return func(c *config) { c.keys = true }
}
