package lockregotel_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/lockreg/lockreg/extra/lockregotel"
	"github.com/lockreg/lockreg/internal/redistest"
)

func TestInstrumentRefusesNoRegistry(t *testing.T) {
	require.ErrorIs(t, lockregotel.InstrumentMetrics(nil), lockregotel.ErrNoRegistry)
	require.ErrorIs(t, lockregotel.InstrumentTracing(nil), lockregotel.ErrNoRegistry)
}

// TestProvidersDefaultToTheGlobalOnes: without WithMeterProvider and
// WithTracerProvider, or with nil providers (telemetry switched off by a
// variable left nil), measurements and spans go to otel's global
// providers, with the registry's namespace.
func TestProvidersDefaultToTheGlobalOnes(t *testing.T) {
	r, namespace := newRegistry(t, redistest.Shared(t).Client(t))
	m, s := newMeters(t, namespace), newSpans(t)
	otel.SetMeterProvider(m.provider)
	otel.SetTracerProvider(s.provider)
	t.Cleanup(func() {
		otel.SetMeterProvider(metricnoop.NewMeterProvider())
		otel.SetTracerProvider(tracenoop.NewTracerProvider())
	})
	require.NoError(t, lockregotel.InstrumentMetrics(r, lockregotel.WithMeterProvider(nil)))
	require.NoError(t, lockregotel.InstrumentTracing(r, lockregotel.WithTracerProvider(nil), nil))
	require.NoError(t, r.Do(context.Background(), "k", func(context.Context) error { return nil }))

	require.EqualValues(t, 1, total(t, m.collect(t)["lockreg.acquire.duration"]).count)
	ended := s.ended()
	require.Len(t, ended, 2)
	for _, span := range ended {
		require.Equal(t, namespace, attrsOf(span)["lockreg.registry"], span.Name())
	}
}

// TestInstrumentingARegistryTwiceIsRefused: a second InstrumentMetrics or
// InstrumentTracing of a registry into the same provider would count
// every measurement twice, or trace every acquisition in two spans: it is
// refused, and changes nothing. Another provider is another report.
func TestInstrumentingARegistryTwiceIsRefused(t *testing.T) {
	r, namespace := newRegistry(t, redistest.Shared(t).Client(t))
	m, s, elsewhere := newMeters(t, namespace), newSpans(t), newMeters(t, namespace)
	m.instrument(t, r)
	s.instrument(t, r)
	elsewhere.instrument(t, r)
	require.ErrorIs(t, lockregotel.InstrumentMetrics(r, lockregotel.WithMeterProvider(m.provider)), lockregotel.ErrInstrumented)
	require.ErrorIs(t, lockregotel.InstrumentTracing(r, lockregotel.WithTracerProvider(s.provider)), lockregotel.ErrInstrumented)
	require.NoError(t, r.Do(context.Background(), "k", func(context.Context) error {
		require.EqualValues(t, 1, total(t, m.collect(t)["lockreg.holds"]).value)
		return nil
	}))

	for _, meters := range []*meters{m, elsewhere} {
		points := meters.collect(t)
		require.EqualValues(t, 1, total(t, points["lockreg.acquire.duration"]).count)
		require.EqualValues(t, 1, total(t, points["lockreg.redis.calls"], "lockreg.operation", "acquire").value)
	}
	require.Len(t, s.ended(), 2, "one acquisition's span, one release's")
}
