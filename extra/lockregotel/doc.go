// Package lockregotel reports what a lockreg registry does as OpenTelemetry
// metrics and traces, as go-redis's extra/redisotel does for a Redis
// client. It builds on the registry's hooks (lockreg.Registry.AddHooks), so
// a registry that is not instrumented pays nothing for it.
//
//	registry, err := lockreg.New(client, "myapp:orders")
//	...
//	if err := lockregotel.InstrumentMetrics(registry, lockregotel.WithRegistryKey("myapp:orders")); err != nil {
//		return err
//	}
//	if err := lockregotel.InstrumentTracing(registry, lockregotel.WithRegistryKey("myapp:orders")); err != nil {
//		return err
//	}
//
// Instrument each registry once; the providers are the global ones
// (otel.GetMeterProvider, otel.GetTracerProvider) unless WithMeterProvider
// or WithTracerProvider name others.
//
// # Metrics
//
//	lockreg.acquire.duration  histogram (s)  an acquisition, from the call to its end: lockreg.outcome
//	                                         (acquired, not_obtained, closed, error) and, when acquired,
//	                                         lockreg.path (redis, handoff, grant)
//	lockreg.hold.duration     histogram (s)  a hold, from its acquisition to its release or its loss;
//	                                         lockreg.cause when it ended lost
//	lockreg.holds             up-down counter  holds live now: acquired and not yet released (a lost
//	                          (observed)     hold counts until its owner releases it, as in Stats);
//	                                         with WithLockKeys, a key held no more has no series
//	lockreg.lost              counter        holds lost: lockreg.cause (expired, max_hold, deleted,
//	                                         restart, closed, ...; unknown for a loss its release found)
//	lockreg.redis.calls       counter        calls sent to Redis: lockreg.operation (acquire, release,
//	                                         renew, token, withdraw, check)
//
// Every instrument carries lockreg.registry, the registryKey, and the
// attributes of WithAttributes. Reentrant acquisitions (a goroutine taking
// its own hold again, a Do nested in a Do of the key) cost nothing and are
// not reported. Lock keys become attributes (lockreg.key) only with
// WithLockKeys: a series per key is what breaks metric backends.
//
// # Traces
//
// Each acquisition makes a lockreg.acquire span, a child of the span in
// the caller's context, with a lockreg.attempt event per attempt to take
// the key in Redis and a lockreg.grant event when another registry's
// release granted the key; it ends with the lockreg.outcome and
// lockreg.path attributes, and an error status naming the cause when the
// key was not obtained. Each release makes a lockreg.release span. Redis
// calls made meanwhile (by redisotel, say) are children of these spans.
// The key is an attribute, and stays in error descriptions, only with
// WithLockKeys.
package lockregotel
