package faultproxy

import (
	"bytes"
	"context"
	"math/rand/v2"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestCountsCommands(t *testing.T) {
	p := start(t)
	c := client(t, p)
	ctx := context.Background()
	if n := p.Commands(); n != 0 {
		t.Fatalf("after ResetCommands: %d commands, want 0", n)
	}
	for i := range 3 {
		if err := c.Set(ctx, "k"+string(rune('a'+i)), i, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if n := p.Commands(); n != 3 {
		t.Fatalf("after 3 SETs: %d commands, want 3", n)
	}
	cmds, err := c.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for range 5 {
			pipe.Incr(ctx, "counter")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := cmds[4].(*redis.IntCmd).Val(); got != 5 {
		t.Fatalf("5th INCR of the pipeline = %d, want 5", got)
	}
	if n := p.Commands(); n != 8 {
		t.Fatalf("after a pipeline of 5 INCRs: %d commands, want 8", n)
	}
	if v, err := c.Eval(ctx, "return redis.call('GET', KEYS[1])", []string{"counter"}).Result(); err != nil || v != "5" {
		t.Fatalf("EVAL = %v, %v; want 5", v, err)
	}
	if n := p.Commands(); n != 9 {
		t.Fatalf("after EVAL: %d commands, want 9", n)
	}
	p.ResetCommands()
	if n := p.Commands(); n != 0 {
		t.Fatalf("after ResetCommands: %d commands, want 0", n)
	}
}

// A 1 MiB value spans many reads of the proxy's 32 KiB buffer; it must
// count once and arrive intact both ways.
func TestLargeValue(t *testing.T) {
	p := start(t)
	c := client(t, p)
	ctx := context.Background()
	value := make([]byte, 1<<20)
	for i := range value {
		// Bytes that look like RESP must not confuse the parser.
		value[i] = "*$\r\n0123456789"[i%14]
	}
	if err := c.Set(ctx, "big", value, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n := p.Commands(); n != 1 {
		t.Fatalf("after a 1 MiB SET: %d commands, want 1", n)
	}
	got, err := c.Get(ctx, "big").Bytes()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, value) {
		t.Fatalf("GET returned %d bytes that differ from the %d set", len(got), len(value))
	}
	if err := c.Set(ctx, "small", "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n := p.Commands(); n != 3 {
		t.Fatalf("after SET, GET, SET: %d commands, want 3", n)
	}
}

// Inline commands, sent by hand, count too; blank lines do not.
func TestInlineCommands(t *testing.T) {
	p := start(t)
	conn, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("PING\r\n\r\nSET a 1\r\n*1\r\n$4\r\nPING\r\n")); err != nil {
		t.Fatal(err)
	}
	want := "+PONG\r\n+OK\r\n+PONG\r\n"
	got := make([]byte, 0, len(want))
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 64)
	for len(got) < len(want) {
		n, err := conn.Read(buf)
		if err != nil {
			t.Fatalf("read %q, then: %v", got, err)
		}
		got = append(got, buf[:n]...)
	}
	if string(got) != want {
		t.Fatalf("replies %q, want %q", got, want)
	}
	if n := p.Commands(); n != 3 {
		t.Fatalf("%d commands, want 3", n)
	}
}

// The parser's count does not depend on how the stream is cut.
func TestParserSplits(t *testing.T) {
	stream := strings.Join([]string{
		"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$12\r\n*1\r\n$4\r\nPING\r\n", // a value that looks like a command
		"*0\r\n",  // empty array: not a command
		"*-1\r\n", // null array: not a command
		"PING\r\n",
		"\r\n", // blank inline line: not a command
		"  \n", // blank too
		"ECHO hi\n",
		"*2\r\n$4\r\nECHO\r\n$-1\r\n",    // null bulk element
		"*2\r\n$4\r\nECHO\r\n:12\r\n",    // integer element
		"*2\r\n$4\r\nECHO\r\n$0\r\n\r\n", // empty bulk
		"*1\r\n$10\r\nPING\r\nPING\r\n",  // CRLFs inside a bulk string
		"*2\r\n$3\r\nGET\r\n$3\r\n\x00\xff\n\r\n", // binary
	}, "")
	const want = 8
	var whole parser
	if n := whole.feed([]byte(stream)); n != want {
		t.Fatalf("whole stream: %d commands, want %d", n, want)
	}
	var bytewise parser
	var n int64
	for i := range len(stream) {
		n += bytewise.feed([]byte{stream[i]})
	}
	if n != want {
		t.Fatalf("byte by byte: %d commands, want %d", n, want)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 1000 {
		var ps parser
		var n int64
		for rest := stream; rest != ""; {
			k := 1 + rng.IntN(min(len(rest), 20))
			n += ps.feed([]byte(rest[:k]))
			rest = rest[k:]
		}
		if n != want {
			t.Fatalf("random pieces: %d commands, want %d", n, want)
		}
	}
}
