package lockregotel

// MetricsHooks and TracingHooks are the hooks that InstrumentMetrics and
// InstrumentTracing add to a registry of namespace: the benchmarks call
// them as a registry would.
var MetricsHooks, TracingHooks = metricsHooks, tracingHooks
