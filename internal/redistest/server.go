// Package redistest runs real redis-server processes for lockreg's tests and
// benchmarks.
//
// A test gets a server from Shared (one per test binary, or the server named
// by REDIS_ADDR) or from Start (a private one the test may stop and restart).
// The binary is redis-server from PATH, or REDIS_SERVER (and redis-sentinel,
// or REDIS_SENTINEL, for StartSentinelGroup), or those of the server that
// LOCKREG_SERVER names (see ServerEnv). Servers listen on a free
// loopback port, keep no data on disk, and stop when the test (or, for the
// shared one, the test binary) ends.
package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is a redis-server process, or an external server from REDIS_ADDR.
type Server struct {
	addr string
	// proc is nil for an external server.
	proc *process
	bin  string
	dir  string
	conf string   // a config file passed before the arguments, or ""
	args []string // extra redis-server arguments, kept for Restart
}

type process struct {
	cmd    *exec.Cmd
	exited chan struct{}
}

var shared struct {
	sync.Mutex
	srv *Server
	err error
}

// Shared returns the server every test of the binary shares: REDIS_ADDR if
// set, otherwise a redis-server started on first use and stopped by M. Tests
// sharing it must use their own keys (a registryKey named after the test).
func Shared(tb testing.TB) *Server {
	tb.Helper()
	s, err := sharedServer()
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// SharedAddr is the shared server's address, for Example functions, which
// have no testing.TB. It panics if no server can be had.
func SharedAddr() string {
	s, err := sharedServer()
	if err != nil {
		panic(err)
	}
	return s.addr
}

func sharedServer() (*Server, error) {
	shared.Lock()
	defer shared.Unlock()
	if shared.srv == nil && shared.err == nil {
		if addr := os.Getenv("REDIS_ADDR"); addr != "" {
			shared.srv = &Server{addr: addr}
		} else {
			shared.srv, shared.err = start()
		}
	}
	return shared.srv, shared.err
}

// Start starts a private redis-server for one test, stopped when the test
// ends. Tests that stop or restart Redis use it, even when REDIS_ADDR is set.
func Start(tb testing.TB) *Server {
	tb.Helper()
	s, err := start()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.close)
	return s
}

// Launch starts a redis-server outside of a test (for the bench/ harness);
// Shutdown stops it.
func Launch() (*Server, error) { return start() }

// Shutdown stops a server from Launch and removes its data dir.
func (s *Server) Shutdown() { s.close() }

// M wraps a test binary's testing.M so that go-redis logs nothing (see
// quietLogger), and the shared server stops after the tests and before
// goleak looks for leaked goroutines:
//
//	goleak.VerifyTestMain(redistest.M(m))
func M(m *testing.M) interface{ Run() int } { return mainRunner{m} }

type mainRunner struct{ m *testing.M }

func (r mainRunner) Run() int {
	redis.SetLogger(quietLogger{})
	code := r.m.Run()
	shared.Lock()
	defer shared.Unlock()
	if shared.srv != nil {
		shared.srv.close()
	}
	return code
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return s.addr }

// Client returns a new client of the server, closed when the test ends.
func (s *Server) Client(tb testing.TB, hooks ...redis.Hook) *redis.Client {
	tb.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.addr})
	for _, h := range hooks {
		c.AddHook(h)
	}
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// Stop stops the server, which loses all its data (there is no persistence).
func (s *Server) Stop(tb testing.TB) {
	tb.Helper()
	if s.proc == nil {
		tb.Fatal("redistest: cannot stop the external server of REDIS_ADDR; use redistest.Start")
	}
	s.stop()
}

// Restart starts the stopped server again on the same address, empty.
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	if s.proc == nil && s.bin == "" {
		tb.Fatal("redistest: cannot restart the external server of REDIS_ADDR; use redistest.Start")
	}
	s.stop()
	if err := s.Relaunch(); err != nil {
		tb.Fatal(err)
	}
}

// Crash ends a server from Launch with SIGKILL, as Kill does in a test.
func (s *Server) Crash() {
	if p := s.proc; p != nil {
		s.proc = nil
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// Relaunch starts a stopped or crashed server from Launch again on its
// address, empty. The port is free for anyone while the server is down, so
// it tries for a second before giving up.
func (s *Server) Relaunch() error {
	var err error
	for range 20 {
		if err = s.launch(); err == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return err
}

// StartReplica starts a private redis-server replicating primary, and waits
// until the replication link is up.
func StartReplica(tb testing.TB, primary *Server) *Server {
	tb.Helper()
	s, err := LaunchReplica(primary)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.close)
	return s
}

// LaunchReplica is StartReplica outside of a test; Shutdown stops the
// replica.
func LaunchReplica(primary *Server) (*Server, error) {
	s, err := start(replicaOf(primary)...)
	if err != nil {
		return nil, err
	}
	if err := s.awaitLink(primary); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

// RelaunchReplicaOf starts a stopped or crashed server again on its
// address, empty, as a replica of primary, and waits until the
// replication link is up: how a failed primary comes back once another
// took its place.
func (s *Server) RelaunchReplicaOf(primary *Server) error {
	s.args = replicaOf(primary)
	if err := s.Relaunch(); err != nil {
		return err
	}
	return s.awaitLink(primary)
}

func replicaOf(primary *Server) []string {
	host, port, _ := net.SplitHostPort(primary.addr)
	return []string{"--replicaof", host, port}
}

// awaitLink waits until the server's replication link to primary is up.
func (s *Server) awaitLink(primary *Server) error {
	c := redis.NewClient(&redis.Options{Addr: s.addr})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, _ := c.Info(context.Background(), "replication").Result()
		if strings.Contains(info, "master_link_status:up") {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redistest: replica %s never linked to %s:\n%s", s.addr, primary.addr, info)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func start(args ...string) (*Server, error) {
	bin, err := program("REDIS_SERVER", "redis-server")
	if err != nil {
		return nil, err
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("redistest: redis-server not found (%v); install it (Debian/Ubuntu: apt-get install -y redis-server, or run `make test`, which does), set REDIS_SERVER to its path, or set REDIS_ADDR to a running server", err)
	}
	return startProcess(path, "", args...)
}

// startProcess runs bin on a free port with a data dir of its own. A
// non-empty conf is written to a config file in that dir and passed first,
// where redis-sentinel wants it (Sentinel rewrites it, so it cannot be a
// shared or read-only file).
func startProcess(bin, conf string, args ...string) (*Server, error) {
	dir, err := os.MkdirTemp("", "redistest-")
	if err != nil {
		return nil, fmt.Errorf("redistest: %w", err)
	}
	confFile := ""
	if conf != "" {
		confFile = filepath.Join(dir, "redis.conf")
		if err := os.WriteFile(confFile, []byte(conf), 0o600); err != nil {
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("redistest: %w", err)
		}
	}
	var lastErr error
	// A free port can be taken by someone else before redis-server binds it.
	for range 5 {
		port, err := freePort()
		if err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
		s := &Server{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), bin: bin, dir: dir, conf: confFile, args: args}
		if lastErr = s.launch(); lastErr == nil {
			return s, nil
		}
	}
	_ = os.RemoveAll(dir)
	return nil, lastErr
}

func (s *Server) launch() error {
	_, port, _ := net.SplitHostPort(s.addr)
	logFile := s.logFile()
	var args []string
	if s.conf != "" {
		args = append(args, s.conf)
	}
	args = append(append(args,
		"--port", port, "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir,
		"--logfile", logFile, "--daemonize", "no",
		"--enable-debug-command", "local", // DEBUG SLEEP, for fault tests
		"--repl-diskless-sync-delay", "0", // replicas sync at once
	), s.args...)
	cmd := exec.Command(s.bin, args...)
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("redistest: start %s: %w", s.bin, err)
	}
	p := &process{cmd: cmd, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.exited)
	}()
	s.proc = p
	if err := s.waitReady(p); err != nil {
		s.stop()
		log, _ := os.ReadFile(logFile)
		return fmt.Errorf("redistest: redis-server on %s did not start: %w\n%s", s.addr, err, log)
	}
	return nil
}

func (s *Server) logFile() string {
	_, port, _ := net.SplitHostPort(s.addr)
	return filepath.Join(s.dir, "redis-"+port+".log")
}

func (s *Server) waitReady(p *process) error {
	c := redis.NewClient(&redis.Options{Addr: s.addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-p.exited:
			return errors.New("the process exited")
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return err
		}
	}
}

// Kill ends the server with SIGKILL, as a crash would: no shutdown, no last
// word to clients or replicas. Restart starts it again, empty.
func (s *Server) Kill(tb testing.TB) {
	tb.Helper()
	if s.proc == nil {
		tb.Fatal("redistest: cannot kill a stopped server or the external server of REDIS_ADDR; use redistest.Start")
	}
	s.Crash()
}

// Pause freezes the process with SIGSTOP, as a long stall would: it keeps
// its connections but reads and answers nothing until Resume.
func (s *Server) Pause(tb testing.TB) { s.signal(tb, syscall.SIGSTOP) }

// Resume lets a paused server go on.
func (s *Server) Resume(tb testing.TB) { s.signal(tb, syscall.SIGCONT) }

func (s *Server) signal(tb testing.TB, sig syscall.Signal) {
	tb.Helper()
	if err := s.Signal(sig); err != nil {
		tb.Fatal(err)
	}
}

// Signal sends sig to a server from Launch: SIGSTOP and SIGCONT pause and
// resume it, as Pause and Resume do in a test.
func (s *Server) Signal(sig syscall.Signal) error {
	if s.proc == nil {
		return fmt.Errorf("redistest: cannot send %v to a stopped server or the external server of REDIS_ADDR", sig)
	}
	if err := s.proc.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("redistest: send %v to the server on %s: %w", sig, s.addr, err)
	}
	return nil
}

// Pid is the process id of a server from Launch, or 0 for a stopped
// server or the external server of REDIS_ADDR (the bench/ harness gives
// it real-time priority with -realtime).
func (s *Server) Pid() int {
	if s.proc == nil {
		return 0
	}
	return s.proc.cmd.Process.Pid
}

// stop terminates the process and waits for it; it keeps the data dir for a
// restart. For the external server it does nothing.
func (s *Server) stop() {
	p := s.proc
	if p == nil {
		return
	}
	s.proc = nil
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	// A paused server would only act on SIGTERM once resumed.
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	select {
	case <-p.exited:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// close stops the server for good and removes its data dir.
func (s *Server) close() {
	s.stop()
	if s.dir != "" {
		_ = os.RemoveAll(s.dir)
	}
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("redistest: find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// quietLogger drops go-redis's own log lines in tests. Tests stop, pause,
// kill and fail over servers on purpose, and go-redis reports each failed
// dial and dropped connection that follows on stderr: thousands of lines
// that buried the test output. Tests assert what happened; the library's
// own logger (slog) is untouched.
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}
