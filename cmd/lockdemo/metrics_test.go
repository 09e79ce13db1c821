package main

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// TestRunServesMetricsUntilInterrupted: with -metrics and -keep-serving,
// the demo's acquisitions and holds show on /metrics while it runs and
// after the work, until it is interrupted (here, until ctx ends).
func TestRunServesMetricsUntilInterrupted(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	ctx, interrupt := context.WithCancel(context.Background())
	defer interrupt()
	var stdout, stderr strings.Builder
	exited := make(chan int, 1)
	go func() {
		exited <- run(ctx, []string{"-services", "3", "-workers", "4", "-increments", "10", "-metrics", addr, "-keep-serving"}, &stdout, &stderr)
	}()

	// Every acquisition ended and every hold with it: the work is over.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	var page map[string]*dto.MetricFamily
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("/metrics never showed 120 acquisitions and holds ended: %v", page)
		}
		page = scrape(t, client, "http://"+addr+"/metrics")
		if page != nil && sum(page, "lockreg_acquire_duration_seconds") == 120 && sum(page, "lockreg_hold_duration_seconds") == 120 {
			break
		}
	}
	// A collection runs the gauge's callback before it reads the
	// histograms: the one that saw the last release's hold end may have
	// read the holds before that release was done. The next collection
	// begins after it.
	page = scrape(t, client, "http://"+addr+"/metrics")
	if got := sum(page, "lockreg_holds"); got != 0 {
		t.Errorf("lockreg_holds = %v after the work, want 0", got)
	}
	if got := sum(page, "lockreg_redis_calls_total"); got == 0 {
		t.Error("lockreg_redis_calls_total is 0")
	}
	select {
	case code := <-exited:
		t.Fatalf("run exited %d before it was interrupted\nstderr:\n%s", code, &stderr)
	case <-time.After(100 * time.Millisecond):
	}
	interrupt()
	if code := <-exited; code != 0 {
		t.Fatalf("run exited %d\nstdout:\n%s\nstderr:\n%s", code, &stdout, &stderr)
	}
	for _, want := range []string{"serving metrics at http://" + addr + "/metrics", "serving metrics until interrupted"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, &stderr)
		}
	}
	if !strings.Contains(stdout.String(), "expected 120, actual 120") {
		t.Errorf("report:\n%s", &stdout)
	}
}

// scrape reads url's metrics, or nil if it cannot yet.
func scrape(t *testing.T, client *http.Client, url string) map[string]*dto.MetricFamily {
	resp, err := client.Get(url)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("%s: %v", url, err)
	}
	return families
}

// sum adds up a family's samples: its counters, gauges, or histograms'
// counts.
func sum(families map[string]*dto.MetricFamily, name string) float64 {
	var total float64
	for _, m := range families[name].GetMetric() {
		total += m.GetCounter().GetValue() + m.GetGauge().GetValue() + float64(m.GetHistogram().GetSampleCount())
	}
	return total
}
