package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/otlptranslator"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/lockreg/lockreg"
	"github.com/lockreg/lockreg/extra/lockregotel"
)

// serveMetrics instruments the registries with lockregotel, and serves
// their metrics at http://addr/metrics through OpenTelemetry's Prometheus
// exporter until stop is called.
func serveMetrics(addr string, registries []*lockreg.Registry, stderr io.Writer) (stop func(), err error) {
	// A Prometheus registry of its own, without the Go runtime's metrics
	// that the default one adds: the page shows lockreg's. Names in
	// Prometheus's style (lockreg_acquire_duration_seconds), which every
	// Prometheus reads, whatever the exporter's default; no scope labels,
	// as the page has one scope.
	gatherer := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(gatherer),
		otelprom.WithTranslationStrategy(otlptranslator.UnderscoreEscapingWithSuffixes), otelprom.WithoutScopeInfo())
	if err != nil {
		return nil, err
	}
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	for _, r := range registries {
		if err := lockregotel.InstrumentMetrics(r, lockregotel.WithMeterProvider(provider)); err != nil {
			return nil, errors.Join(err, provider.Shutdown(context.Background()))
		}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, errors.Join(err, provider.Shutdown(context.Background()))
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	server := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = server.Serve(ln) // ErrServerClosed, once stop shuts it down
	}()
	fmt.Fprintf(stderr, "lockdemo: serving metrics at http://%s/metrics\n", ln.Addr())
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = server.Shutdown(ctx)
		<-served
		_ = provider.Shutdown(ctx)
	}, nil
}
