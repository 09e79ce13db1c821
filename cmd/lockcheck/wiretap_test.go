//go:build linux

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/lockreg/lockreg"
	"github.com/lockreg/lockreg/internal/redistest"
)

// scriptedConn is a connection that takes whatever is written to it and
// reads, in turn, the chunks of its script.
type scriptedConn struct {
	net.Conn
	chunks [][]byte
}

func (c *scriptedConn) Write(p []byte) (int, error) { return len(p), nil }

func (c *scriptedConn) Read(p []byte) (int, error) {
	if len(c.chunks) == 0 {
		return 0, io.EOF
	}
	n := copy(p, c.chunks[0])
	if c.chunks[0] = c.chunks[0][n:]; len(c.chunks[0]) == 0 {
		c.chunks = c.chunks[1:]
	}
	return n, nil
}

// reported is a renewal the tap reported.
type reported struct {
	keys    []any
	replies []int64
}

// tapScript writes requests, in writes cut every cut bytes, to a tapped
// connection whose replies are replies, read in chunks of cut bytes, and
// returns the renewals it reported.
func tapScript(t *testing.T, requests, replies string, cut int) []reported {
	t.Helper()
	chunks := func(s string) (out [][]byte) {
		for len(s) > 0 {
			n := min(cut, len(s))
			out, s = append(out, []byte(s[:n])), s[n:]
		}
		return out
	}
	var got []reported
	before := time.Now().UnixNano()
	dial := tapDialer(func(context.Context, string, string) (net.Conn, error) {
		return &scriptedConn{chunks: chunks(replies)}, nil
	}, func(keys []any, replies []int64, sent int64) {
		if sent < before || sent > time.Now().UnixNano() {
			t.Errorf("renewal of %v sent at %d, not while the test ran", keys, sent)
		}
		got = append(got, reported{keys, replies})
	})
	c, err := dial(context.Background(), "tcp", "redis")
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range chunks(requests) {
		if _, err := c.Write(w); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := io.Copy(io.Discard, c); err != nil {
		t.Fatal(err)
	}
	return got
}

// command is a request as go-redis writes it.
func command(args ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	return b.String()
}

// The pipeline both tests send: a tracked renewal of two keys, a renewal
// from the registry's client (two arguments: the hook's), a tracked
// renewal by EVAL, and another call.
var tappedPipeline = command("evalsha", "abc", "2", "r:{a}", "r:{b}", "id", "300", "1") +
	command("evalsha", "abc", "1", "r:{c}", "id", "300") +
	command("get", "x\r\n") +
	command("eval", "return 1", "1", "r:{d}", "id", "300", "1") +
	command("ping")

var tappedWant = []reported{
	{[]any{"r:{a}", "r:{b}"}, []int64{1, 2}},
	{[]any{"r:{d}"}, []int64{0}},
}

func TestWiretapPairsRenewalsWithTheirReplies(t *testing.T) {
	for _, tc := range []struct{ name, replies string }{
		{"RESP2", "*2\r\n:1\r\n:2\r\n" + "*1\r\n:1\r\n" + "$-1\r\n" + "*1\r\n:0\r\n" + "+PONG\r\n"},
		{"RESP3", "*2\r\n:1\r\n:2\r\n" +
			// An invalidation pushed between replies, and an attribute
			// before one.
			">2\r\n$10\r\ninvalidate\r\n*1\r\n$5\r\nr:{c}\r\n" +
			"|1\r\n+key-popularity\r\n%1\r\n$5\r\nr:{c}\r\n,0.5\r\n" + "*1\r\n:1\r\n" +
			"$4\r\na\r\nb\r\n" +
			"*1\r\n:0\r\n" +
			"|1\r\n+ttl\r\n_\r\n" + "%1\r\n+ok\r\n#t\r\n"},
	} {
		for _, cut := range []int{1, 5, 1 << 20} {
			t.Run(fmt.Sprintf("%s/%d", tc.name, cut), func(t *testing.T) {
				if got := tapScript(t, tappedPipeline, tc.replies, cut); !reflect.DeepEqual(got, tappedWant) {
					t.Errorf("reported %v, want %v", got, tappedWant)
				}
			})
		}
	}
}

// TestWiretapStops: from a subscription, or a reply it cannot follow, on,
// a connection is not tapped.
func TestWiretapStops(t *testing.T) {
	renewal := command("evalsha", "abc", "1", "r:{a}", "id", "300", "1")
	for name, script := range map[string]struct{ requests, replies string }{
		"subscribed":   {command("subscribe", "__redis__:invalidate") + renewal, "*3\r\n$9\r\nsubscribe\r\n$20\r\n__redis__:invalidate\r\n:1\r\n*1\r\n:1\r\n"},
		"confused":     {command("ping") + renewal, "PONG\r\n*1\r\n:1\r\n"},
		"unrequested":  {renewal, "+OK\r\n*1\r\n:1\r\n*1\r\n:1\r\n"},
		"inline":       {"PING\r\n" + renewal, "+PONG\r\n*1\r\n:1\r\n"},
		"streamed":     {command("ping") + renewal, "$?\r\n;4\r\nPONG\r\n;0\r\n*1\r\n:1\r\n"},
		"bad bulk end": {command("get", "x") + renewal, "$1\r\nab\r\n*1\r\n:1\r\n"},
	} {
		t.Run(name, func(t *testing.T) {
			if got := tapScript(t, script.requests, script.replies, 3); len(got) != 0 {
				t.Errorf("reported %v", got)
			}
		})
	}
}

// TestWiretapSeesTrackedRenewals holds a key for several leases on a real
// server, with the lock client the workers make but without the tracker's
// hook: the renewals the tracker then sees are those the tap reported,
// renew.lua's calls on the tracking connection.
func TestWiretapSeesTrackedRenewals(t *testing.T) {
	const registry, lease = "wiretap", 300 * time.Millisecond
	var buf bytes.Buffer
	out := &emitter{w: bufio.NewWriter(&buf)}
	tracker := newLeaseTracker(registry, []string{"k"}, out)
	srv := redistest.Start(t)
	client := newLockClient(workerConfig{Topology: topoSingle, LockAddrs: []string{srv.Addr()}}, "", tracker)
	defer client.Close()
	reg, err := lockreg.New(client, registry, lockreg.WithExpireAfter(lease), lockreg.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	lock := reg.Obtain("k")
	lock.Lock()
	time.Sleep(time.Second)
	lock.Unlock()
	_ = reg.Close()

	out.mu.Lock()
	defer out.mu.Unlock()
	renewals := 0
	for line := range bytes.Lines(buf.Bytes()) {
		var ev event
		if err := json.Unmarshal(line, &ev); err != nil {
			t.Fatal(err)
		}
		if ev.E == "renew" && ev.Key == "k" && ev.At <= ev.Done {
			renewals++
		}
	}
	// Over a second, a renewal each third of the lease or so.
	if renewals < 2 {
		t.Errorf("%d renewals reported of a key held for three leases, want 2 or more:\n%s", renewals, buf.String())
	}
}

// TestWiretapStopsWhereRepliesNoLongerPairWithRequests: an UNSUBSCRIBE
// answers once per channel (RESP2), or by a push (RESP3), and CLIENT REPLY
// OFF or SKIP leaves requests unanswered; paired in order from there on, a
// renewal would take the reply of another call, one that renewed where it
// had not.
func TestWiretapStopsWhereRepliesNoLongerPairWithRequests(t *testing.T) {
	renew := func(key string) string { return command("evalsha", "abc", "1", key, "id", "300", "1") }
	for name, script := range map[string]struct{ requests, replies string }{
		"RESP2 unsubscribe": {
			command("unsubscribe", "a", "b") + renew("r:{x}") + renew("r:{y}"),
			"*3\r\n$11\r\nunsubscribe\r\n$1\r\na\r\n:0\r\n" + "*3\r\n$11\r\nunsubscribe\r\n$1\r\nb\r\n:0\r\n" +
				"*1\r\n:1\r\n" + "*1\r\n:0\r\n",
		},
		"RESP3 unsubscribe": {
			command("unsubscribe") + renew("r:{x}") + renew("r:{y}"),
			">3\r\n$11\r\nunsubscribe\r\n_\r\n:0\r\n" + "*1\r\n:0\r\n" + "*1\r\n:1\r\n",
		},
		"RESP3 punsubscribe": {
			command("PUNSUBSCRIBE") + renew("r:{x}") + renew("r:{y}"),
			">3\r\n$12\r\npunsubscribe\r\n_\r\n:0\r\n" + "*1\r\n:0\r\n" + "*1\r\n:1\r\n",
		},
		"client reply off": {
			command("client", "reply", "off") + renew("r:{x}") + command("client", "reply", "on") + renew("r:{y}"),
			"+OK\r\n" + "*1\r\n:1\r\n",
		},
		"client reply skip": {
			command("CLIENT", "REPLY", "SKIP") + renew("r:{w}") + renew("r:{x}") + renew("r:{y}"),
			"*1\r\n:0\r\n" + "*1\r\n:1\r\n",
		},
	} {
		t.Run(name, func(t *testing.T) {
			for _, cut := range []int{1, 7, 1 << 20} {
				if got := tapScript(t, script.requests, script.replies, cut); len(got) != 0 {
					t.Errorf("cut %d: reported %v", cut, got)
				}
			}
		})
	}
}

// TestWiretapWritesWhileARenewalIsReported: reporting a renewal (the
// tracker's emitter writes and flushes a line) holds up neither the
// connection's writes nor its reads.
func TestWiretapWritesWhileARenewalIsReported(t *testing.T) {
	client, server := net.Pipe()
	defer server.Close()
	reporting, release := make(chan struct{}), make(chan struct{})
	c, _ := tapDialer(func(context.Context, string, string) (net.Conn, error) { return client, nil },
		func([]any, []int64, int64) {
			close(reporting)
			<-release
		})(context.Background(), "tcp", "redis")
	defer c.Close()
	defer close(release)
	go func() { _, _ = io.Copy(io.Discard, server) }()
	if _, err := c.Write([]byte(command("evalsha", "abc", "1", "r:{a}", "id", "300", "1"))); err != nil {
		t.Fatal(err)
	}
	go func() {
		_, _ = server.Write([]byte("*1\r\n:1\r\n"))
		_, _ = server.Write([]byte("+PONG\r\n"))
	}()
	go func() { _, _ = c.Read(make([]byte, 64)) }()
	<-reporting
	wrote := make(chan error, 1)
	go func() {
		_, err := c.Write([]byte(command("ping")))
		wrote <- err
	}()
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("a write waited for a renewal's report")
	}
}
