package lockregotel

import (
	"reflect"
	"runtime"
	"sync"
	"weak"

	"github.com/lockreg/lockreg"
)

// instrumented records which registries report to which providers: a
// registry instrumented twice into one provider would count every
// measurement twice (the observed ones too, as the SDK adds up the
// callbacks' observations) and make two spans of every acquisition. A
// registry is held weakly, and its records go with it.
var instrumented struct {
	mu   sync.Mutex
	done map[instrumentation]bool
}

// instrumentation is a registry reporting to a provider.
type instrumentation struct {
	registry weak.Pointer[lockreg.Registry]
	provider any // a metric.MeterProvider or a trace.TracerProvider
}

// instrumentOnce records that reg reports to provider, and returns
// ErrInstrumented if it did already; forget takes the record back, for
// an instrumentation that failed. A provider of a type that cannot be
// compared (no SDK's is) cannot be told apart: it is let through.
func instrumentOnce(reg *lockreg.Registry, provider any) (forget func(), err error) {
	if t := reflect.TypeOf(provider); t == nil || !t.Comparable() {
		return func() {}, nil
	}
	key := instrumentation{registry: weak.Make(reg), provider: provider}
	instrumented.mu.Lock()
	defer instrumented.mu.Unlock()
	if instrumented.done[key] {
		return nil, ErrInstrumented
	}
	if instrumented.done == nil {
		instrumented.done = map[instrumentation]bool{}
	}
	instrumented.done[key] = true
	cleanup := runtime.AddCleanup(reg, forgetInstrumentation, key)
	return func() {
		cleanup.Stop()
		forgetInstrumentation(key)
	}, nil
}

func forgetInstrumentation(key instrumentation) {
	instrumented.mu.Lock()
	defer instrumented.mu.Unlock()
	delete(instrumented.done, key)
}
