// Command e2e checks lockreg's metrics end to end, as make e2e-metrics
// runs it from the repository root: cmd/lockdemo, on a real redis-server,
// serves them with -metrics; a real Prometheus server scrapes it; the
// figures Prometheus's HTTP API returns must be those the demo reported.
// It stops everything it started, and exits 1 on any failure.
//
// It needs redis-server and prometheus on PATH (or REDIS_SERVER and
// PROMETHEUS), which make e2e-metrics installs when missing.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/lockreg/lockreg/internal/redistest"
)

// The demo's work: services x workers x increments acquisitions.
const (
	services, workers, increments = 4, 8, 60
	registryKey                   = "lockdemo" // the demo's default
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e-metrics: FAIL: %v\n", err)
		os.Exit(1)
	}
	fmt.Println("e2e-metrics: PASS")
}

func run(ctx context.Context) error {
	prometheus, err := exec.LookPath(envOr("PROMETHEUS", "prometheus"))
	if err != nil {
		return fmt.Errorf("prometheus not found (%w): make e2e-metrics installs it", err)
	}
	dir, err := os.MkdirTemp("", "lockreg-e2e-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	demo := filepath.Join(dir, "lockdemo")
	if out, err := exec.CommandContext(ctx, envOr("GO", "go"), "build", "-o", demo, "github.com/lockreg/lockreg/cmd/lockdemo").CombinedOutput(); err != nil {
		return fmt.Errorf("build the demo: %w\n%s", err, out)
	}
	redis, err := redistest.Launch()
	if err != nil {
		return err
	}
	defer redis.Shutdown()
	demoAddr, promAddr := freeAddr(), freeAddr()
	if demoAddr == "" || promAddr == "" {
		return errors.New("no free port on 127.0.0.1")
	}

	// Prometheus first, so that it scrapes the demo while it works too.
	config := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(config, []byte(fmt.Sprintf(`global:
  scrape_interval: 1s
scrape_configs:
  - job_name: lockdemo
    static_configs:
      - targets: [%q]
`, demoAddr)), 0o600); err != nil {
		return err
	}
	prom, err := start(exec.Command(prometheus, "--config.file="+config, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+promAddr, "--log.level=warn"), os.Stderr)
	if err != nil {
		return err
	}
	defer prom.stop(syscall.SIGTERM)
	if err := waitReady(ctx, "http://"+promAddr+"/-/ready", prom); err != nil {
		return fmt.Errorf("prometheus: %w", err)
	}

	stdout, err := os.Create(filepath.Join(dir, "report"))
	if err != nil {
		return err
	}
	defer stdout.Close()
	demoProc, err := start(exec.Command(demo, "-redis", "redis://"+redis.Addr()+"/0", "-registry", registryKey,
		"-services", strconv.Itoa(services), "-workers", strconv.Itoa(workers), "-increments", strconv.Itoa(increments),
		"-metrics", demoAddr, "-keep-serving"), stdout)
	if err != nil {
		return err
	}
	demoStopped := false
	defer func() {
		if !demoStopped {
			_ = demoProc.stop(os.Interrupt)
		}
	}()
	rep, err := awaitReport(ctx, stdout.Name(), demoProc)
	if err != nil {
		return err
	}
	fmt.Printf("the demo reported %d acquisitions and %d acquire, %d release Redis calls\n", rep.acquisitions, rep.acquireCalls, rep.releaseCalls)
	if want := int64(services * workers * increments); rep.acquisitions != want {
		return fmt.Errorf("the demo made %d acquisitions, want %d", rep.acquisitions, want)
	}

	if err := awaitQueries(ctx, "http://"+promAddr, []check{
		{`sum(lockreg_acquire_duration_seconds_count{lockreg_registry="lockdemo"})`, rep.acquisitions},
		{`sum(lockreg_acquire_duration_seconds_count{lockreg_outcome="acquired"})`, rep.acquisitions},
		{`sum(lockreg_hold_duration_seconds_count)`, rep.acquisitions},
		{`sum(lockreg_holds{lockreg_registry="lockdemo"})`, 0},
		{`sum(lockreg_redis_calls_total{lockreg_operation="acquire"})`, rep.acquireCalls},
		{`sum(lockreg_redis_calls_total{lockreg_operation="release"})`, rep.releaseCalls},
	}); err != nil {
		return err
	}
	if err := printPage(ctx, "http://"+demoAddr+"/metrics"); err != nil {
		return err
	}
	demoStopped = true
	if err := demoProc.stop(os.Interrupt); err != nil {
		return fmt.Errorf("the demo, interrupted: %w", err)
	}
	return nil
}

func envOr(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}

// freeAddr is a loopback address with a port free now, or "".
func freeAddr() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return ""
	}
	defer ln.Close()
	return ln.Addr().String()
}

// process is a process the check started.
type process struct {
	cmd    *exec.Cmd
	exited chan struct{}
	err    error // once exited is closed
}

// start starts cmd, its output to stdout and its errors to os.Stderr.
func start(cmd *exec.Cmd, stdout io.Writer) (*process, error) {
	cmd.Stdout, cmd.Stderr = stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &process{cmd: cmd, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// errExited is a process's early exit, which ends a poll at once.
var errExited = errors.New("exited early")

// exitedWith is an error matching errExited if the process exited.
func (p *process) exitedWith() error {
	select {
	case <-p.exited:
		return fmt.Errorf("%s %w (%v)", filepath.Base(p.cmd.Path), errExited, p.cmd.ProcessState)
	default:
		return nil
	}
}

// stop sends sig, then SIGKILL if the process is still there 10s later,
// and returns how it exited.
func (p *process) stop(sig os.Signal) error {
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
	return p.err
}

// waitReady waits until p's url answers 200, for 30s at the most.
func waitReady(ctx context.Context, url string, p *process) error {
	return poll(ctx, 30*time.Second, func() error {
		if err := p.exitedWith(); err != nil {
			return err
		}
		resp, err := get(ctx, url)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %s", url, resp.Status)
		}
		return nil
	})
}

// poll calls try until it succeeds, a process it waits for exits, ctx
// ends or limit passes, and then returns try's last error.
func poll(ctx context.Context, limit time.Duration, try func() error) error {
	deadline := time.Now().Add(limit)
	for {
		err := try()
		if err == nil || errors.Is(err, errExited) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func get(ctx context.Context, url string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	return http.DefaultClient.Do(req)
}

// report is what the demo printed once its work ended.
type report struct {
	acquisitions, acquireCalls, releaseCalls int64
}

var (
	acquisitionsLine = regexp.MustCompile(`(?m)^acquisitions:\s+(\d+) in `)
	callsLine        = regexp.MustCompile(`(?m)^Redis calls:\s+(\d+) acquire \(\d+ found the lock taken\), (\d+) release, `)
)

// awaitReport waits for the demo's report in the file it writes to, which
// ends with the "lost updates" line, and reads it.
func awaitReport(ctx context.Context, file string, demo *process) (report, error) {
	var text string
	err := poll(ctx, 5*time.Minute, func() error {
		if err := demo.exitedWith(); err != nil {
			return err
		}
		b, err := os.ReadFile(file)
		if text = string(b); err == nil && !strings.Contains(text, "lost updates:") {
			err = errors.New("no report from the demo")
		}
		return err
	})
	if err != nil {
		return report{}, err
	}
	fmt.Print(text)
	if !strings.Contains(text, "lost updates:        0\n") {
		return report{}, errors.New("the demo lost updates")
	}
	a, c := acquisitionsLine.FindStringSubmatch(text), callsLine.FindStringSubmatch(text)
	if a == nil || c == nil {
		return report{}, errors.New("the demo's report lacks its acquisitions or Redis calls")
	}
	var r report
	r.acquisitions, _ = strconv.ParseInt(a[1], 10, 64)
	r.acquireCalls, _ = strconv.ParseInt(c[1], 10, 64)
	r.releaseCalls, _ = strconv.ParseInt(c[2], 10, 64)
	return r, nil
}

// check is a PromQL query and the value it must return.
type check struct {
	query string
	want  int64
}

// awaitQueries waits, for a minute at the most, until every query returns
// its value from Prometheus: scrapes come every second, and the last ones
// before the work ended may lag behind it.
func awaitQueries(ctx context.Context, prometheus string, checks []check) error {
	got := make([]string, len(checks))
	err := poll(ctx, time.Minute, func() error {
		var errs []error
		for i, c := range checks {
			v, err := query(ctx, prometheus, c.query)
			got[i] = v
			if err == nil && v != strconv.FormatInt(c.want, 10) {
				err = fmt.Errorf("%s = %s, want %d", c.query, v, c.want)
			}
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	})
	for i, c := range checks {
		fmt.Printf("prometheus: %-70s = %-6s (want %d)\n", c.query, got[i], c.want)
	}
	return err
}

// query returns the single value of an instant PromQL query.
func query(ctx context.Context, prometheus, q string) (string, error) {
	resp, err := get(ctx, prometheus+"/api/v1/query?query="+url.QueryEscape(q))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var answer struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []struct {
				Value [2]any `json:"value"` // [time, "value"]
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&answer); err != nil {
		return "", fmt.Errorf("%s: %w", q, err)
	}
	switch {
	case answer.Status != "success":
		return "", fmt.Errorf("%s: %s", q, answer.Error)
	case len(answer.Data.Result) != 1:
		return "", fmt.Errorf("%s: %d series, want 1: the metric has not arrived", q, len(answer.Data.Result))
	}
	v, _ := answer.Data.Result[0].Value[1].(string)
	return v, nil
}

// printPage prints the demo's metrics page as Prometheus scrapes it, but
// the histograms' buckets.
func printPage(ctx context.Context, url string) error {
	resp, err := get(ctx, url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	fmt.Println("the scraped page, buckets left out:")
	lines := bufio.NewScanner(resp.Body)
	for lines.Scan() {
		if line := lines.Text(); !strings.Contains(line, "_bucket{") {
			fmt.Println("  " + line)
		}
	}
	return lines.Err()
}
