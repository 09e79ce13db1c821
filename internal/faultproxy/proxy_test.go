package faultproxy

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/lockreg/lockreg/internal/redistest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(redistest.M(m)) }

// client is a one-connection go-redis client through p, with its
// handshake done and the count reset. go-redis (9.23) runs pipelines on a
// pool of their own, whose first use dials and handshakes (HELLO, CLIENT
// SETINFO twice) again; PipelinePoolSize -1 keeps them on the one
// connection.
func client(t *testing.T, p *Proxy) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: p.Addr(), PoolSize: 1, PipelinePoolSize: -1})
	t.Cleanup(func() { _ = c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("PING through the proxy: %v", err)
	}
	p.ResetCommands()
	return c
}

func start(t *testing.T) *Proxy {
	t.Helper()
	p, _ := startOn(t)
	return p
}

// startOn starts a private Redis with a proxy to it, and returns both.
func startOn(t *testing.T) (*Proxy, *redis.Client) {
	t.Helper()
	srv := redistest.Start(t)
	p, err := Start(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p, srv.Client(t)
}

// Close ends every connection and goroutine, and clients see the
// connection go.
func TestClose(t *testing.T) {
	p := start(t)
	conn := dialRaw(t, p.Addr())
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write([]byte("PING\r\n")); err == nil {
		if n, err := conn.Read(make([]byte, 16)); err == nil {
			t.Fatalf("read %d bytes through a closed proxy", n)
		}
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// dialRaw connects to addr, a proxy, and checks that a PING gets through.
func dialRaw(t *testing.T, addr string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	if got := roundTrip(t, conn, "PING\r\n", len("+PONG\r\n")); got != "+PONG\r\n" {
		t.Fatalf("PING through the proxy: %q", got)
	}
	return conn
}

// roundTrip writes req to conn and reads n bytes of reply, within 5s.
func roundTrip(t *testing.T, conn net.Conn, req string, n int) string {
	t.Helper()
	if _, err := conn.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	defer conn.SetReadDeadline(time.Time{})
	got := make([]byte, n)
	if _, err := io.ReadFull(conn, got); err != nil {
		t.Fatalf("reply to %q: %q, then %v", req, got, err)
	}
	return string(got)
}

func TestServesLoopbackOnly(t *testing.T) {
	for _, target := range []string{"10.0.0.1:6379", "example.com:6379", "6379"} {
		if p, err := Start(target); err == nil {
			_ = p.Close()
			t.Errorf("Start(%q) succeeded; want it refused", target)
		}
	}
}
