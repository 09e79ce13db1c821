package faultproxy

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockreg/lockreg/internal/redistest"
)

// A stall passes no byte until Resume, then delivers what was sent
// meanwhile, in order, even from a client that gave up on its reply and
// closed its connection.
func TestStallHoldsBytesUntilResume(t *testing.T) {
	ctx := context.Background()
	p, direct := startOn(t)
	patient := dialRaw(t, p.Addr())
	impatient := redis.NewClient(&redis.Options{Addr: p.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	defer impatient.Close()
	if err := impatient.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	p.Stall()
	if _, err := patient.Write([]byte("SET patient 1\r\n")); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if err := impatient.Set(short, "impatient", 1, 0).Err(); err == nil {
		t.Fatal("a SET through a stalled proxy succeeded")
	}
	time.Sleep(300 * time.Millisecond) // time the bytes would need to pass, were they let through
	if n := direct.Exists(ctx, "patient", "impatient").Val(); n != 0 {
		t.Fatalf("%d of the SETs reached Redis during the stall", n)
	}

	p.Resume()
	if got := roundTrip(t, patient, "GET patient\r\n", len("+OK\r\n$1\r\n1\r\n")); got != "+OK\r\n$1\r\n1\r\n" {
		t.Fatalf("after Resume: %q, want the SET's reply, then the GET's", got)
	}
	deadline := time.Now().Add(5 * time.Second)
	for direct.Exists(ctx, "impatient").Val() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the SET of the client that gave up never reached Redis")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A router holds back the answer to a dial during a stall.
func TestStallHoldsNewConnections(t *testing.T) {
	srv := redistest.Start(t)
	r := startRouter(t)
	r.Stall()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if c, err := Dialer(r.Addr())(ctx, "tcp", srv.Addr()); err == nil {
		_ = c.Close()
		t.Fatal("a dial through a stalled router succeeded")
	}
	r.Resume()
	c, err := Dialer(r.Addr())(context.Background(), "tcp", srv.Addr())
	if err != nil {
		t.Fatalf("dial after Resume: %v", err)
	}
	_ = c.Close()
}

// Delay adds at least its lower bound each way, and keeps every stream in
// order whatever each piece drew.
func TestDelayAddsLatencyInOrder(t *testing.T) {
	p, _ := startOn(t)
	conn := dialRaw(t, p.Addr())
	const lo = 20 * time.Millisecond
	p.Delay(lo, 5*lo)
	start := time.Now()
	var want strings.Builder
	for i := range 20 {
		// One write each, so that they reach the proxy as pieces of
		// their own, each with its own delay.
		if _, err := conn.Write([]byte("INCR n\r\n")); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&want, ":%d\r\n", i+1)
	}
	if got := roundTrip(t, conn, "", want.Len()); got != want.String() {
		t.Fatalf("replies %q, want %q", got, want.String())
	}
	if rtt := time.Since(start); rtt < 2*lo {
		t.Errorf("the INCRs were answered in %v through a delay of at least %v each way", rtt, lo)
	}
	p.Delay(0, 0)
	if got := roundTrip(t, conn, "PING\r\n", len("+PONG\r\n")); got != "+PONG\r\n" {
		t.Fatalf("PING after the delay: %q", got)
	}
}

// ResetConns sends both the client and Redis a TCP reset, and new
// connections work.
func TestResetConnsResetsBothSides(t *testing.T) {
	ctx := context.Background()
	p, direct := startOn(t)
	conn := dialRaw(t, p.Addr())
	before := len(clientList(t, direct))
	if n := p.ResetConns(); n != 1 {
		t.Fatalf("reset %d connections, want 1", n)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("the client read %v, want a connection reset", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(clientList(t, direct)) >= before {
		if time.Now().After(deadline) {
			t.Fatal("Redis still lists the proxied connection")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := client(t, p).Ping(ctx).Err(); err != nil {
		t.Fatalf("a new connection after the reset: %v", err)
	}
}

func clientList(t *testing.T, c *redis.Client) []string {
	t.Helper()
	list, err := c.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(list), "\n")
}
