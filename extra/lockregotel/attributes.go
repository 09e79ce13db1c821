package lockregotel

import (
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// scope names the meter and the tracer: the module's path, as redisotel's
// do.
const scope = "github.com/lockreg/lockreg/extra/lockregotel"

// The attributes, in OpenTelemetry's dotted style under the library's
// namespace: Prometheus shows them as lockreg_outcome and so on.
const (
	registryAttr  = attribute.Key("lockreg.registry")  // the namespace
	keyAttr       = attribute.Key("lockreg.key")       // a lock's key, with WithLockKeys only
	outcomeAttr   = attribute.Key("lockreg.outcome")   // lockreg.Outcome
	pathAttr      = attribute.Key("lockreg.path")      // lockreg.Path, of acquired holds
	causeAttr     = attribute.Key("lockreg.cause")     // lockreg.LossCause
	operationAttr = attribute.Key("lockreg.operation") // lockreg.RedisOp
)

var (
	// ErrNoRegistry is returned for a nil registry.
	ErrNoRegistry = errors.New("lockregotel: no registry")
	// ErrInstrumented is returned for a registry instrumented already into
	// the same provider, whose measurements would all count twice, and
	// whose acquisitions and releases would each make two spans.
	ErrInstrumented = errors.New("lockregotel: registry instrumented already")
)

// recordWith is an attribute set as the option histograms take, made
// once, so that recording with it allocates nothing.
func recordWith(attrs ...attribute.KeyValue) []metric.RecordOption {
	return []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(attrs...))}
}
