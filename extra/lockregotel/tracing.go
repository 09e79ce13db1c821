package lockregotel

import (
	"context"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/lockreg/lockreg"
	"github.com/lockreg/lockreg/internal/keytext"
	"github.com/lockreg/lockreg/internal/protocol"
)

// InstrumentTracing traces what reg does as the spans described in the
// package documentation, from now on. Instrument a registry once: a second
// time into the same tracer provider returns ErrInstrumented.
func InstrumentTracing(reg *lockreg.Registry, opts ...Option) error {
	if reg == nil {
		return ErrNoRegistry
	}
	if _, err := instrumentOnce(reg, newConfig(reg.Key(), opts).tp); err != nil {
		return err
	}
	reg.AddHooks(tracingHooks(reg.Key(), opts))
	return nil
}

// tracingHooks are the hooks that InstrumentTracing adds to a registry of
// namespace.
func tracingHooks(namespace string, opts []Option) lockreg.Hooks {
	c := newConfig(namespace, opts)
	t := &tracing{
		tracer:    c.tp.Tracer(scope),
		namespace: namespace,
		start:     []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(c.baseAttributes()...)},
		keys:      c.keys,
	}
	return lockreg.Hooks{
		AcquireStart:   t.acquireStart,
		AcquireAttempt: t.attempt,
		AcquireDone:    t.acquireDone,
		ReleaseStart:   t.releaseStart,
		ReleaseDone:    t.releaseDone,
	}
}

// tracing makes a registry's spans.
type tracing struct {
	tracer    trace.Tracer
	start     []trace.SpanStartOption // every span's
	keys      bool                    // WithLockKeys
	namespace string                  // the registry's, in the Redis keys that errors name
}

// spanKey keys a tracing's span in the context of the acquisition or
// release it frames: another hook may start a span of its own after it,
// which then is ctx's current span.
type spanKey struct{ t *tracing }

// begin starts the span name for key, a child of ctx's span, and returns
// its context: the hooks that follow find the span there, and so do the
// spans of the Redis calls made meanwhile.
func (t *tracing) begin(ctx context.Context, name, key string) context.Context {
	opts := t.start
	if t.keys {
		opts = append(opts[:len(opts):len(opts)], trace.WithAttributes(keyAttr.String(key)))
	}
	ctx, span := t.tracer.Start(ctx, name, opts...)
	return context.WithValue(ctx, spanKey{t}, span)
}

// span returns the span that begin put in ctx, or a span that records
// nothing.
func (t *tracing) span(ctx context.Context) trace.Span {
	if span, ok := ctx.Value(spanKey{t}).(trace.Span); ok {
		return span
	}
	return trace.SpanFromContext(context.Background())
}

func (t *tracing) acquireStart(ctx context.Context, key string) context.Context {
	return t.begin(ctx, "lockreg.acquire", key)
}

func (t *tracing) releaseStart(ctx context.Context, key string) context.Context {
	return t.begin(ctx, "lockreg.release", key)
}

// attempt, acquireDone and releaseDone find their span in ctx, where
// acquireStart or releaseStart put it.
func (t *tracing) attempt(ctx context.Context, _ string) {
	t.span(ctx).AddEvent("lockreg.attempt")
}

func (t *tracing) acquireDone(ctx context.Context, e lockreg.AcquireEvent) {
	span := t.span(ctx)
	span.SetAttributes(outcomeAttr.String(string(e.Outcome)))
	if e.Outcome == lockreg.OutcomeAcquired {
		span.SetAttributes(pathAttr.String(string(e.Path)))
		if e.Path == lockreg.PathGrant {
			span.AddEvent("lockreg.grant")
		}
	} else {
		t.fail(span, e.Key, e.Err)
	}
	span.End()
}

func (t *tracing) releaseDone(ctx context.Context, e lockreg.ReleaseEvent) {
	span := t.span(ctx)
	if e.Err != nil {
		t.fail(span, e.Key, e.Err)
	}
	span.End()
}

// fail sets span's status to an error described by err's message, in
// which lockreg quotes the key, whole or, if long, cut (keytext.Short),
// and may name one of the lock's keys in Redis, <namespace>:{<key>} and a
// suffix (a queue or a marker of another type fails a call naming it),
// the key in it whole or, if long, cut alike (Keys.PrintedLock): the key
// stays out of both without WithLockKeys.
func (t *tracing) fail(span trace.Span, key string, err error) {
	msg := err.Error()
	if !t.keys {
		keys := protocol.LockKeys(t.namespace, key)
		msg = strings.ReplaceAll(msg, keys.Lock(), t.namespace+":{…}")
		if printed, cut := keys.PrintedLock(t.namespace); cut {
			msg = strings.ReplaceAll(msg, printed, t.namespace+":{…}")
		}
		msg = strings.ReplaceAll(msg, strconv.Quote(key), `"…"`)
		msg = strings.ReplaceAll(msg, strconv.Quote(keytext.Short(key)), `"…"`)
	}
	span.SetStatus(codes.Error, msg)
}
