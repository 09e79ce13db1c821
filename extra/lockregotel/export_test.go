package lockregotel

// MetricsHooks and TracingHooks are the hooks that InstrumentMetrics and
// InstrumentTracing add to a registry of registryKey: the benchmarks call
// them as a registry would.
var MetricsHooks, TracingHooks = metricsHooks, tracingHooks
