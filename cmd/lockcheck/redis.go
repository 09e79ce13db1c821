//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisServer is a redis-server on a fixed loopback port. Unlike
// internal/redistest it can be killed and started again on the same port
// outside of a test, and it dies with lockcheck (Pdeathsig), so that not
// even a kill -9 of lockcheck leaves it behind.
type redisServer struct {
	bin, dir, port string
	cmd            *exec.Cmd
	exited         chan struct{}
}

func startRedis() (*redisServer, error) {
	bin := os.Getenv("REDIS_SERVER")
	if bin == "" {
		bin = "redis-server"
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("redis-server not found (%v); install it (Debian/Ubuntu: apt-get install -y redis-server, or run `make test`, which does) or set REDIS_SERVER", err)
	}
	dir, err := os.MkdirTemp("", "lockcheck-redis-")
	if err != nil {
		return nil, err
	}
	// A free port can be taken by someone else before redis-server binds it.
	for range 5 {
		var port int
		if port, err = freePort(); err != nil {
			break
		}
		s := &redisServer{bin: path, dir: dir, port: strconv.Itoa(port)}
		if err = s.launch(); err == nil {
			return s, nil
		}
	}
	_ = os.RemoveAll(dir)
	return nil, err
}

func (s *redisServer) addr() string { return net.JoinHostPort("127.0.0.1", s.port) }

func (s *redisServer) launch() error {
	logFile := filepath.Join(s.dir, "redis-"+s.port+".log")
	cmd := exec.Command(s.bin,
		"--port", s.port, "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir,
		"--logfile", logFile, "--daemonize", "no",
		"--enable-debug-command", "local", // DEBUG SLEEP is one of the faults
	)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", s.bin, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	s.cmd, s.exited = cmd, exited
	if err := s.waitReady(); err != nil {
		s.kill()
		log, _ := os.ReadFile(logFile)
		return fmt.Errorf("redis-server on %s did not start: %w\n%s", s.addr(), err, log)
	}
	return nil
}

func (s *redisServer) waitReady() error {
	c := redis.NewClient(&redis.Options{Addr: s.addr(), MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
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
		case <-s.exited:
			return errors.New("the process exited")
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return err
		}
	}
}

// kill is a crash: no shutdown, and with no persistence every key is gone.
func (s *redisServer) kill() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
	s.cmd = nil
}

// restart crashes the server and starts it again, empty, on the same port.
// down is taken before the kill and up once the new server answers.
func (s *redisServer) restart() (down, up time.Time, err error) {
	down = time.Now()
	s.kill()
	// The port is ours until another process on this shared machine binds
	// it in the moment it is free; try a few times before giving up.
	for range 20 {
		if err = s.launch(); err == nil {
			return down, time.Now(), nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return down, time.Time{}, err
}

// close stops the server for good and removes its data dir.
func (s *redisServer) close() {
	s.kill()
	_ = os.RemoveAll(s.dir)
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
