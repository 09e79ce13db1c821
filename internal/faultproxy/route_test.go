package faultproxy

import (
	"context"
	"net"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/lockreg/lockreg/internal/redistest"
)

func startRouter(t *testing.T) *Proxy {
	t.Helper()
	r, err := StartRouter()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// One router reaches every server its clients name, and its connections
// report the server's address, as go-redis expects of a direct one.
func TestRouterReachesEachNamedServer(t *testing.T) {
	ctx := context.Background()
	r := startRouter(t)
	for _, srv := range []*redistest.Server{redistest.Start(t), redistest.Start(t)} {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Dialer: Dialer(r.Addr())})
		t.Cleanup(func() { _ = c.Close() })
		if err := c.Set(ctx, "at", srv.Addr(), 0).Err(); err != nil {
			t.Fatal(err)
		}
		if got := srv.Client(t).Get(ctx, "at").Val(); got != srv.Addr() {
			t.Fatalf("the SET through the router for %s reached the server that had %q", srv.Addr(), got)
		}
		conn, err := Dialer(r.Addr())(ctx, "tcp", srv.Addr())
		if err != nil {
			t.Fatal(err)
		}
		if got := conn.RemoteAddr().String(); got != srv.Addr() {
			t.Errorf("RemoteAddr %s, want %s", got, srv.Addr())
		}
		_ = conn.Close()
	}
}

// A router refuses addresses off this machine, and passes a failed dial
// on as the dial's error.
func TestRouterDialErrors(t *testing.T) {
	r := startRouter(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	_ = ln.Close()
	for _, addr := range []string{"10.0.0.1:6379", closed} {
		if c, err := Dialer(r.Addr())(context.Background(), "tcp", addr); err == nil {
			_ = c.Close()
			t.Errorf("dial %s through the router succeeded", addr)
		}
	}
}
