// Package lockregotel reports what a lockreg registry does as OpenTelemetry
// metrics and traces, as go-redis's extra/redisotel does for a Redis
// client. It builds on the registry's hooks (lockreg.Registry.AddHooks), so
// a registry that is not instrumented pays nothing for it.
//
//	registry, err := lockreg.New(client, "myapp:orders")
//	...
//	if err := lockregotel.InstrumentMetrics(registry); err != nil {
//		return err
//	}
//	if err := lockregotel.InstrumentTracing(registry); err != nil {
//		return err
//	}
//
// Instrument each registry once: a second time into the same provider
// returns ErrInstrumented, and changes nothing. The providers are the
// global ones (otel.GetMeterProvider, otel.GetTracerProvider) unless
// WithMeterProvider or WithTracerProvider name others (a nil one keeps the
// global provider, and a nil Option is ignored).
//
// # Metrics
//
//   - lockreg.acquire.duration, a histogram (s): acquisitions, from the
//     call to their end, waiting included; lockreg.outcome (acquired,
//     not_obtained, closed, error) and, when acquired, lockreg.path
//     (redis, handoff, grant).
//   - lockreg.hold.duration, a histogram (s): holds, from their
//     acquisition to their release or loss; lockreg.cause if lost.
//   - lockreg.holds, an observed up-down counter: holds acquired and not
//     released yet. A lost hold counts until its owner releases it, as in
//     Stats, and so do holds taken before the registry was instrumented.
//     With WithLockKeys it counts, by key, only the holds acquired since
//     (the hooks tell their keys), and a key held no more has no series.
//   - lockreg.lost, a counter: holds lost; lockreg.cause (expired,
//     max_hold, deleted, restart, closed, forced, overwritten, flushed,
//     evicted, as lockreg.LossCause names them). A loss that the hold's
//     release found first counts then, by the cause it found
//     (lockreg.ReleaseEvent.FoundLost): expired or max_hold if its lease
//     ran out; if Redis said the key was not the registry's, deleted, or
//     overwritten or forced where the registry can tell; or the cause that
//     the read confirming a local hand-off found.
//   - lockreg.redis.calls, an observed counter: calls sent to Redis;
//     lockreg.operation (acquire, release, renew, token, withdraw, check,
//     track, as lockreg.RedisOp names them).
//
// Every instrument carries lockreg.registry, the registry's namespace
// (lockreg.Registry.Key), and the attributes of WithAttributes.
// Reentrant acquisitions (a goroutine taking its own hold again, a Do
// nested in a Do of the key) cost nothing and are not reported. Lock keys
// become attributes (lockreg.key) only with WithLockKeys: a series per
// key is what breaks metric backends.
//
// # Prometheus
//
// OpenTelemetry's Prometheus exporter (otelprom below:
// go.opentelemetry.io/otel/exporters/prometheus) names the instruments in
// Prometheus's style (lockreg_holds, lockreg_lost_total,
// lockreg_acquire_duration_seconds, ...) and their attributes as labels
// (lockreg_registry, lockreg_cause, ...). By default it also labels every
// series with the instrumentation scope, this package:
//
//	lockreg_holds{lockreg_registry="myapp:orders",otel_scope_name="github.com/lockreg/lockreg/extra/lockregotel",otel_scope_schema_url="",otel_scope_version=""} 0
//
// Every lockreg_ series comes from this one scope, so those labels tell
// nothing apart. WithoutScopeInfo drops them, as cmd/lockdemo does; a
// translation strategy set explicitly keeps the names in Prometheus's
// style whatever the exporter's default:
//
//	exporter, err := otelprom.New(otelprom.WithoutScopeInfo(),
//		otelprom.WithTranslationStrategy(otlptranslator.UnderscoreEscapingWithSuffixes))
//	...
//	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
//	err = lockregotel.InstrumentMetrics(registry, lockregotel.WithMeterProvider(provider))
//
// The series above then reads:
//
//	lockreg_holds{lockreg_registry="myapp:orders"} 0
//
// # Traces
//
// Each acquisition makes a lockreg.acquire span, a child of the span in
// the caller's context, with a lockreg.attempt event per attempt to take
// the key in Redis and a lockreg.grant event when another registry's
// release granted the key; it ends with the lockreg.outcome and
// lockreg.path attributes, and an error status naming the cause when the
// key was not obtained. Each release makes a lockreg.release span. The
// calls to Redis they send carry their span in their context, so that
// redisotel's spans of them are its children (unless other goroutines'
// calls share their pipeline). The key is an attribute, and stays in
// error descriptions, only with WithLockKeys.
package lockregotel
