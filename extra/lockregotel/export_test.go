package lockregotel

import "github.com/lockreg/lockreg"

// MetricsHooks and TracingHooks are the hooks that InstrumentMetrics and
// InstrumentTracing add to a registry of namespace: the benchmarks call
// them as a registry would.
func MetricsHooks(namespace string, opts []Option) (lockreg.Hooks, error) {
	return metricsHooks(namespace, func() int64 { return 0 }, nil, opts)
}

var TracingHooks = tracingHooks
