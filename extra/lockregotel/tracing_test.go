package lockregotel_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/lockreg/lockreg"
	"github.com/lockreg/lockreg/extra/lockregotel"
	"github.com/lockreg/lockreg/internal/redistest"
)

// spans records the spans of the registries instrumented with it.
type spans struct {
	recorder *tracetest.SpanRecorder
	provider *sdktrace.TracerProvider
}

func newSpans(t *testing.T) *spans {
	recorder := tracetest.NewSpanRecorder()
	provider := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recorder))
	t.Cleanup(func() { require.NoError(t, provider.Shutdown(context.Background())) })
	return &spans{recorder: recorder, provider: provider}
}

// instrument is InstrumentTracing for r, into s, with opts.
func (s *spans) instrument(t *testing.T, r *lockreg.Registry, opts ...lockregotel.Option) {
	t.Helper()
	opts = append([]lockregotel.Option{lockregotel.WithTracerProvider(s.provider)}, opts...)
	require.NoError(t, lockregotel.InstrumentTracing(r, opts...))
}

// parent starts the caller's span, which lockreg's spans are children of.
func (s *spans) parent(ctx context.Context) (context.Context, trace.Span) {
	return s.provider.Tracer("test").Start(ctx, "request")
}

// cycle acquires and releases k on r, under the caller's span, and
// returns lockregotel's two spans.
func (s *spans) cycle(t *testing.T, r *lockreg.Registry) []sdktrace.ReadOnlySpan {
	t.Helper()
	ctx, parent := s.parent(context.Background())
	h, err := r.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	require.NoError(t, h.Release(ctx))
	parent.End()
	ended := s.ended()
	require.Len(t, ended, 2)
	return ended
}

// ended returns the spans ended so far, the callers' left out.
func (s *spans) ended() []sdktrace.ReadOnlySpan {
	var ended []sdktrace.ReadOnlySpan
	for _, span := range s.recorder.Ended() {
		if span.InstrumentationScope().Name == "github.com/lockreg/lockreg/extra/lockregotel" {
			ended = append(ended, span)
		}
	}
	return ended
}

// attrsOf is a span's attributes by name.
func attrsOf(span sdktrace.ReadOnlySpan) map[string]string {
	attrs := map[string]string{}
	for _, kv := range span.Attributes() {
		attrs[string(kv.Key)] = kv.Value.Emit()
	}
	return attrs
}

// eventsOf is the names of a span's events, in order.
func eventsOf(span sdktrace.ReadOnlySpan) []string {
	var names []string
	for _, e := range span.Events() {
		names = append(names, e.Name)
	}
	return names
}

// TestSpansOfAcquisitionsAndReleases: an acquisition and a release, each a
// child of the caller's span; reentrant ones make no span, by a goroutine
// or through Do's context.
func TestSpansOfAcquisitionsAndReleases(t *testing.T) {
	r, namespace := newRegistry(t, redistest.Shared(t).Client(t))
	s := newSpans(t)
	s.instrument(t, r)
	ctx, parent := s.parent(context.Background())

	lock := r.Obtain("k")
	require.NoError(t, lock.LockContext(ctx))
	require.NoError(t, lock.LockContext(ctx))
	require.NoError(t, lock.UnlockContext(ctx))
	require.NoError(t, lock.UnlockContext(ctx))
	require.NoError(t, r.Do(ctx, "d", func(ctx context.Context) error {
		return r.Do(ctx, "d", func(context.Context) error { return nil })
	}))
	parent.End()

	ended := s.ended()
	require.Len(t, ended, 4)
	for i, name := range []string{"lockreg.acquire", "lockreg.release", "lockreg.acquire", "lockreg.release"} {
		span := ended[i]
		require.Equal(t, name, span.Name())
		require.Equal(t, parent.SpanContext().SpanID(), span.Parent().SpanID(), "a child of the caller's span")
		require.Equal(t, trace.SpanKindInternal, span.SpanKind())
		require.Equal(t, codes.Unset, span.Status().Code)
		want := map[string]string{"lockreg.registry": namespace}
		if name == "lockreg.acquire" {
			want["lockreg.outcome"], want["lockreg.path"] = "acquired", "redis"
			require.Equal(t, []string{"lockreg.attempt"}, eventsOf(span))
		}
		require.Equal(t, want, attrsOf(span))
	}
}

// callSpans notes, through its go-redis hook, the span in the context of
// each call the client sends, as redisotel's would parent its spans.
type callSpans struct {
	mu  sync.Mutex
	ids []trace.SpanID
}

func (c *callSpans) note(ctx context.Context) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ids = append(c.ids, trace.SpanContextFromContext(ctx).SpanID())
}

func (c *callSpans) hook() redis.Hook {
	return redistest.Hook{
		Process: func(next redis.ProcessHook) redis.ProcessHook {
			return func(ctx context.Context, cmd redis.Cmder) error {
				c.note(ctx)
				return next(ctx, cmd)
			}
		},
		ProcessPipeline: func(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
			return func(ctx context.Context, cmds []redis.Cmder) error {
				c.note(ctx)
				return next(ctx, cmds)
			}
		},
	}
}

// TestRedisCallsAreChildrenOfTheSpans: the calls an acquisition and a
// release send carry their spans in their contexts.
func TestRedisCallsAreChildrenOfTheSpans(t *testing.T) {
	calls := &callSpans{}
	r, _ := newRegistry(t, redistest.Shared(t).Client(t, calls.hook()))
	s := newSpans(t)
	s.instrument(t, r)
	ended := s.cycle(t, r)
	calls.mu.Lock()
	defer calls.mu.Unlock()
	for _, span := range ended {
		require.Contains(t, calls.ids, span.SpanContext().SpanID(), span.Name())
	}
	require.NotContains(t, calls.ids, ended[0].Parent().SpanID(), "the caller's span")
}

// TestSpansOfAGrant: an acquisition that waited for another registry,
// which granted it the key.
func TestSpansOfAGrant(t *testing.T) {
	ctx := context.Background()
	r, other, namespace, _ := contenders(t)
	s := newSpans(t)
	s.instrument(t, r)

	held, err := other.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	granted := acquireIn(t, ctx, r, "k")
	// Its second attempt fails once it subscribed: it hears grants.
	waitsInRedis(t, r, 1)
	require.NoError(t, held.Release(ctx))
	h := <-granted
	require.NotNil(t, h)

	ended := s.ended()
	require.Len(t, ended, 1)
	require.Equal(t, map[string]string{"lockreg.registry": namespace, "lockreg.outcome": "acquired", "lockreg.path": "grant"}, attrsOf(ended[0]))
	events := eventsOf(ended[0])
	require.GreaterOrEqual(t, len(events), 3, "attempts, then the grant")
	require.Equal(t, "lockreg.grant", events[len(events)-1])
	for _, e := range events[:len(events)-1] {
		require.Equal(t, "lockreg.attempt", e)
	}
	require.NoError(t, h.Release(ctx))
}

// TestSpansOfFailures: a timeout, and the release of a hold that Close
// lost, end in an error status that names the cause but not the key.
func TestSpansOfFailures(t *testing.T) {
	ctx := context.Background()
	r, other, namespace, _ := contenders(t, lockreg.WithRetryInterval(20*time.Millisecond))
	s := newSpans(t)
	s.instrument(t, r)

	timesOut(t, r, other, "order-42")
	h, err := r.Obtain("order-43").Acquire(ctx)
	require.NoError(t, err)
	require.NoError(t, r.Close())
	require.ErrorIs(t, h.Release(ctx), lockreg.ErrLockLost)

	ended := s.ended()
	require.Len(t, ended, 3)
	notObtained, lost := ended[0], ended[2]
	require.Equal(t, map[string]string{"lockreg.registry": namespace, "lockreg.outcome": "not_obtained"}, attrsOf(notObtained))
	require.Contains(t, eventsOf(notObtained), "lockreg.attempt")
	require.Equal(t, codes.Error, notObtained.Status().Code)
	require.Equal(t, `lockreg: lock not obtained: key "…": context deadline exceeded`, notObtained.Status().Description)
	require.Equal(t, "lockreg.release", lost.Name())
	require.Equal(t, codes.Error, lost.Status().Code)
	require.Equal(t, `lockreg: lock lost: key "…": the registry was closed`, lost.Status().Description)
}

// TestSpansKeepALongKeyOut: lockreg's errors print a key longer than 200
// bytes cut, with its length; without WithLockKeys that stays out of the
// status too.
func TestSpansKeepALongKeyOut(t *testing.T) {
	r, other, _, _ := contenders(t, lockreg.WithRetryInterval(20*time.Millisecond))
	s := newSpans(t)
	s.instrument(t, r)
	timesOut(t, r, other, "customer-alice@example.com/"+strings.Repeat("x", 250))
	ended := s.ended()
	require.Len(t, ended, 1)
	require.Equal(t, `lockreg: lock not obtained: key "…": context deadline exceeded`, ended[0].Status().Description)
}

// TestSpansKeepTheKeyOutOfRedisKeyNames: an error that names one of the
// lock's keys in Redis (<namespace>:{<key>}:queue, say: a queue or a
// marker of another type, made by hand, fails the call naming it) keeps
// the key out of the status without WithLockKeys, as a quoted key is.
func TestSpansKeepTheKeyOutOfRedisKeyNames(t *testing.T) {
	ctx := context.Background()
	r, other, namespace, client := contenders(t)
	s := newSpans(t)
	s.instrument(t, r)
	const key = "order-{42}" // braces are escaped in Redis keys
	lock := namespace + ":{order-%7B42%7D}"
	t.Cleanup(func() { client.Del(ctx, lock+":queue", lock+":waiting") })

	held, err := other.Obtain(key).Acquire(ctx)
	require.NoError(t, err)
	require.NoError(t, client.Set(ctx, lock+":queue", "x", 0).Err())
	short, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = r.Obtain(key).Acquire(short)
	require.ErrorIs(t, err, lockreg.ErrRedis)
	require.ErrorContains(t, err, lock+":queue", "the error names the queue")
	require.NoError(t, client.Del(ctx, lock+":queue").Err())
	require.NoError(t, held.Release(ctx))

	h, err := r.Obtain(key).Acquire(ctx)
	require.NoError(t, err)
	require.NoError(t, client.HSet(ctx, lock+":waiting", "field", "value").Err())
	err = h.Release(ctx)
	require.ErrorIs(t, err, lockreg.ErrRedis)
	require.ErrorContains(t, err, lock+":waiting", "the error names the marker")

	ended := s.ended()
	require.Len(t, ended, 3)
	for _, span := range []sdktrace.ReadOnlySpan{ended[0], ended[2]} {
		require.Equal(t, codes.Error, span.Status().Code, span.Name())
		require.NotContains(t, span.Status().Description, "42", span.Name())
		require.Contains(t, span.Status().Description, namespace+":{…}", span.Name())
	}
}

// TestSpansKeepALongKeyOutOfRedisKeyNames: lockreg cuts a long key in
// the keys in Redis that an error names, as where it quotes it; without
// WithLockKeys neither form reaches the status.
func TestSpansKeepALongKeyOutOfRedisKeyNames(t *testing.T) {
	ctx := context.Background()
	r, other, namespace, client := contenders(t)
	s := newSpans(t)
	s.instrument(t, r)
	key := "customer-alice@example.com/" + strings.Repeat("x", 250)
	queue := namespace + ":{" + key + "}:queue"
	t.Cleanup(func() { client.Del(ctx, queue) })

	held, err := other.Obtain(key).Acquire(ctx)
	require.NoError(t, err)
	require.NoError(t, client.Set(ctx, queue, "x", 0).Err())
	short, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = r.Obtain(key).Acquire(short)
	require.ErrorIs(t, err, lockreg.ErrRedis)
	require.ErrorContains(t, err, ":queue", "the error names the queue")
	require.NoError(t, held.Release(ctx))

	ended := s.ended()
	require.Len(t, ended, 1)
	require.NotContains(t, ended[0].Status().Description, "alice")
	require.Contains(t, ended[0].Status().Description, namespace+":{…}:queue")
}

// TestSpansWithLockKeysAndAttributes: with WithLockKeys spans name their
// key, in attributes and error descriptions; WithAttributes' go on all.
func TestSpansWithLockKeysAndAttributes(t *testing.T) {
	r, other, namespace, _ := contenders(t)
	s := newSpans(t)
	s.instrument(t, r, lockregotel.WithLockKeys(), lockregotel.WithAttributes(attribute.String("deployment", "blue")))

	timesOut(t, r, other, "order-42")

	ended := s.ended()
	require.Len(t, ended, 1)
	require.Equal(t, map[string]string{
		"lockreg.registry": namespace, "lockreg.key": "order-42", "deployment": "blue", "lockreg.outcome": "not_obtained",
	}, attrsOf(ended[0]))
	require.Equal(t, `lockreg: lock not obtained: key "order-42": context deadline exceeded`, ended[0].Status().Description)
}

// TestSpansBesideAnotherHooksSpan: a hook of the user's own that starts a
// span of its own, after lockregotel's, leaves lockregotel's spans whole.
func TestSpansBesideAnotherHooksSpan(t *testing.T) {
	r, namespace := newRegistry(t, redistest.Shared(t).Client(t))
	s := newSpans(t)
	s.instrument(t, r)
	tracer := s.provider.Tracer("mine")
	r.AddHooks(lockreg.Hooks{
		AcquireStart: func(ctx context.Context, _ string) context.Context {
			ctx, _ = tracer.Start(ctx, "mine.acquire")
			return ctx
		},
		ReleaseStart: func(ctx context.Context, _ string) context.Context {
			ctx, _ = tracer.Start(ctx, "mine.release")
			return ctx
		},
	})
	ended := s.cycle(t, r)
	require.Equal(t, "lockreg.acquire", ended[0].Name())
	require.Equal(t, map[string]string{"lockreg.registry": namespace, "lockreg.outcome": "acquired", "lockreg.path": "redis"}, attrsOf(ended[0]))
	require.Equal(t, "lockreg.release", ended[1].Name())
	for _, span := range s.recorder.Ended() {
		if span.InstrumentationScope().Name == "mine" {
			require.Empty(t, attrsOf(span), "lockregotel wrote on %s", span.Name())
		}
	}
}

// TestSpansEndWhenAPanicEndsTheirWork: an acquisition and a release that
// a panic ends (another hook's, here; a go-redis hook's would do the
// same) end their spans all the same, and the panic goes on to the
// caller. An acquisition cut short is an error; a release whose
// ReleaseStart hook panicked is done all the same, and its span says
// how it went.
func TestSpansEndWhenAPanicEndsTheirWork(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		hooks  lockreg.Hooks // added after lockregotel's
		span   string        // the span the panic must not leave open
		status codes.Code
	}{
		{"in an attempt", lockreg.Hooks{AcquireAttempt: func(context.Context, string) { panic("hook") }}, "lockreg.acquire", codes.Error},
		{"as an acquisition starts", lockreg.Hooks{AcquireStart: func(context.Context, string) context.Context { panic("hook") }}, "lockreg.acquire", codes.Error},
		{"as a release starts", lockreg.Hooks{ReleaseStart: func(context.Context, string) context.Context { panic("hook") }}, "lockreg.release", codes.Unset},
		{"in a release's call", lockreg.Hooks{RedisCalls: func(op lockreg.RedisOp, _ int) {
			if op == lockreg.OpRelease {
				panic("hook")
			}
		}}, "lockreg.release", codes.Error},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, _ := newRegistry(t, redistest.Shared(t).Client(t))
			s := newSpans(t)
			h, err := r.Obtain("k").Acquire(ctx) // before the hooks: its release is the one that panics
			require.NoError(t, err)
			s.instrument(t, r)
			r.AddHooks(tc.hooks)
			require.PanicsWithValue(t, "hook", func() {
				if tc.span == "lockreg.release" {
					_ = h.Release(ctx)
				} else {
					_, _ = r.Obtain("other").Acquire(ctx)
				}
			})
			ended := s.ended()
			require.Len(t, ended, 1, "the span ended")
			require.Equal(t, tc.span, ended[0].Name())
			require.Equal(t, tc.status, ended[0].Status().Code, ended[0].Status().Description)
			require.NotContains(t, ended[0].Status().Description, `"other"`, "the key stays out")
		})
	}
}
