//go:build linux

package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"syscall"
	"time"
)

// The wiretap watches the lock client's connections at the socket, below
// go-redis, for the renewals no hook sees: where a held key is tracked,
// the library renews it by renew.lua on its tracking connection, a client
// of its own made from the lock client's options, which carry the Dialer
// but not the hooks. The tracker's hook sees every other call, so the tap
// reports only those renewals, told apart by renew.lua's third argument
// ("1": read the keys again), and leaves the rest alone.
//
// A tapped connection parses the RESP requests written on it and the
// replies read from it, and pairs them in order. It never blocks or
// changes the bytes: on anything it cannot follow, and from a command on
// whose replies no longer pair with requests one to one (a subscription,
// an unsubscription, MONITOR, CLIENT REPLY: see unpaired), it stops
// tapping.

// maxPending bounds the part of a message a tap keeps while the rest is
// on its way; a larger one stops the tap (the library's calls are small).
const maxPending = 1 << 20

// errConfused: the bytes are not RESP the tap can follow.
var errConfused = errors.New("wiretap: not RESP it can follow")

// tapDialer wraps dial so that every connection it returns reports the
// renewals on it to renewed.
func tapDialer(dial func(ctx context.Context, network, addr string) (net.Conn, error), renewed func(keys []any, replies []int64, sent int64)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		tap := &tappedConn{Conn: c, renewed: renewed}
		if _, ok := c.(syscall.Conn); ok {
			// go-redis peeks at the socket of an idle connection to tell
			// it is healthy: the tap holds back no bytes, so it may.
			return tappedSyscallConn{tap}, nil
		}
		return tap, nil
	}
}

// tappedConn is a connection under the wiretap.
type tappedConn struct {
	net.Conn
	renewed func(keys []any, replies []int64, sent int64)

	mu       sync.Mutex // requests are written and replies read on different goroutines
	off      bool
	requests stream
	replies  stream
	// writtenAt is when the Write holding the first pending request byte
	// began (unix ns).
	writtenAt int64
	calls     []call // sent and not answered yet, oldest from head
	head      int
	args      [][]byte // the request being read, reused
	// answered are the renewals paired with their replies by the Read
	// under way, reported once it lets go of mu.
	answered []call
}

// call is a request waiting for its reply: a tracked renewal of keys, sent
// at sent, or (keys nil) any other call; once answered, replies holds the
// renewal's reply.
type call struct {
	keys    []any
	sent    int64
	replies []int64
}

// tappedSyscallConn is a tappedConn whose socket go-redis can reach.
type tappedSyscallConn struct{ *tappedConn }

func (c tappedSyscallConn) SyscallConn() (syscall.RawConn, error) {
	return c.Conn.(syscall.Conn).SyscallConn()
}

func (c *tappedConn) Write(p []byte) (int, error) {
	// Read before writing: the reply may be read as soon as it is sent.
	c.mu.Lock()
	if !c.off {
		now := time.Now().UnixNano()
		if len(c.requests.buf) == 0 {
			c.writtenAt = now
		}
		c.stopIf(c.requests.feed(p, func(b []byte) (int, error) {
			n, err := c.request(b)
			if n > 0 {
				c.writtenAt = now // the next request begins in this Write
			}
			return n, err
		}))
	}
	c.mu.Unlock()
	return c.Conn.Write(p)
}

func (c *tappedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.mu.Lock()
		var answered []call
		if !c.off {
			err := c.replies.feed(p[:n], c.reply)
			answered, c.answered = c.answered, nil
			c.stopIf(err)
		}
		c.mu.Unlock()
		// Reported with mu let go: the report writes out an event, which
		// must hold up neither a Write nor the next Read.
		for _, r := range answered {
			c.renewed(r.keys, r.replies, r.sent)
		}
	}
	return n, err
}

// stopIf stops the tap if err is set. Called with mu held.
func (c *tappedConn) stopIf(err error) {
	if err != nil {
		c.off = true
		c.requests.buf, c.replies.buf, c.calls, c.args, c.answered = nil, nil, nil, nil, nil
	}
}

// request takes the request at the start of b and returns its length, 0
// if b holds only part of it. Called with mu held.
func (c *tappedConn) request(b []byte) (int, error) {
	n, at, typ, err := value(b)
	if err != nil || n == 0 {
		return 0, err
	}
	if typ != '*' || at != 0 {
		return 0, errConfused
	}
	// A whole array, checked by value: a count, then bulk strings.
	l, next, _ := line(b)
	count, _ := atoi(l[1:])
	c.args = c.args[:0]
	for range count {
		l, w, _ := line(b[next:])
		size, _ := atoi(l[1:])
		if l[0] != '$' || size < 0 {
			return 0, errConfused
		}
		next += w
		c.args = append(c.args, b[next:next+int(size)])
		next += int(size) + 2
	}
	if len(c.args) == 0 {
		return 0, errConfused
	}
	switch name := c.args[0]; {
	case unpaired(c.args):
		return 0, errSubscribed
	case bytes.EqualFold(name, []byte("evalsha")), bytes.EqualFold(name, []byte("eval")):
		c.push(call{keys: trackedRenewal(c.args), sent: c.writtenAt})
	default:
		c.push(call{})
	}
	return n, nil
}

// errSubscribed: replies no longer follow requests.
var errSubscribed = errors.New("wiretap: subscribed")

// unpaired reports whether the request args starts a run of replies that
// no longer answer requests one to one: a subscription, whose messages
// come unasked; an unsubscription, answered once per channel (RESP2) or
// by a push, which answers no request (RESP3); MONITOR; CLIENT REPLY,
// which leaves requests unanswered.
func unpaired(args [][]byte) bool {
	if bytes.EqualFold(args[0], []byte("client")) {
		return len(args) > 1 && bytes.EqualFold(args[1], []byte("reply"))
	}
	for _, name := range unpairedCommands {
		if bytes.EqualFold(args[0], []byte(name)) {
			return true
		}
	}
	return false
}

var unpairedCommands = [...]string{"subscribe", "psubscribe", "ssubscribe", "unsubscribe", "punsubscribe", "sunsubscribe", "monitor"}

// trackedRenewal returns the keys of args if they are a renew.lua call on
// a tracking connection (EVALSHA or EVAL, script, n, n keys, client id,
// lease, "1"), else nil.
func trackedRenewal(args [][]byte) []any {
	if len(args) < 7 || string(args[len(args)-1]) != "1" {
		return nil
	}
	n, ok := atoi(args[2])
	if !ok || int(n) != len(args)-6 {
		return nil
	}
	keys := make([]any, n)
	for i := range keys {
		keys[i] = string(args[3+i])
	}
	return keys
}

// push queues a request for its reply, reusing the room of those
// answered once all are, or many. Called with mu held.
func (c *tappedConn) push(r call) {
	if c.head > 0 && (c.head == len(c.calls) || c.head >= 1024) {
		c.calls, c.head = c.calls[:copy(c.calls, c.calls[c.head:])], 0
	}
	c.calls = append(c.calls, r)
}

// reply takes the reply at the start of b, pairs it with the oldest
// request waiting, and returns its length, 0 if b holds only part of it.
// Called with mu held.
func (c *tappedConn) reply(b []byte) (int, error) {
	n, at, typ, err := value(b)
	if err != nil || n == 0 || typ == '>' { // a push answers no request
		return n, err
	}
	if c.head == len(c.calls) {
		return 0, errConfused // a reply to nothing
	}
	r := c.calls[c.head]
	c.calls[c.head] = call{}
	c.head++
	if r.keys != nil && typ == '*' {
		if replies, ok := integers(b[at:n], len(r.keys)); ok {
			r.replies = replies
			c.answered = append(c.answered, r)
		}
	}
	return n, nil
}

// integers returns the elements of the array b, if they are n integers.
func integers(b []byte, n int) ([]int64, bool) {
	l, next, _ := line(b)
	if count, _ := atoi(l[1:]); int(count) != n {
		return nil, false
	}
	out := make([]int64, n)
	for i := range out {
		l, w, _ := line(b[next:])
		v, ok := atoi(l[1:])
		if l[0] != ':' || !ok {
			return nil, false
		}
		out[i] = v
		next += w
	}
	return out, true
}

// stream is one direction of a connection: the part of a message read so
// far, its buffer reused.
type stream struct{ buf []byte }

// feed hands take each whole message of what is pending followed by p;
// take returns a message's length, 0 if it is incomplete. The bytes of p
// are copied only if a message is left incomplete.
func (s *stream) feed(p []byte, take func([]byte) (int, error)) error {
	b := p
	if len(s.buf) > 0 {
		s.buf = append(s.buf, p...)
		b = s.buf
	}
	for len(b) > 0 {
		n, err := take(b)
		if err != nil {
			return err
		}
		if n == 0 {
			break
		}
		b = b[n:]
	}
	if len(b) > maxPending {
		return errConfused
	}
	s.buf = append(s.buf[:0], b...)
	return nil
}

// value returns the length of the RESP2 or RESP3 value at the start of b,
// the attributes before it included, and the offset and type of the value
// itself; n is 0 if b holds only part of it.
func value(b []byte) (n, at int, typ byte, err error) {
	// need counts the values still to read; a value's header read with
	// one left is the value itself, unless it is an attribute, whose
	// pairs come before it.
	for need := 1; need > 0; {
		l, w, err := line(b[n:])
		if err != nil || w == 0 {
			return 0, 0, 0, err
		}
		t := l[0]
		if need == 1 && typ == 0 && t != '|' {
			at, typ = n, t
		}
		n += w
		switch t {
		case '+', '-', ':', '_', '#', ',', '(':
			need--
		case '$', '!', '=':
			size, ok := atoi(l[1:])
			if !ok || size < -1 || size > maxPending {
				return 0, 0, 0, errConfused
			}
			if size >= 0 {
				end := n + int(size)
				if len(b) < end+2 {
					return 0, 0, 0, nil
				}
				if b[end] != '\r' || b[end+1] != '\n' {
					return 0, 0, 0, errConfused
				}
				n = end + 2
			}
			need--
		case '*', '~', '>', '%', '|':
			count, ok := atoi(l[1:])
			if !ok || count < -1 || count > maxPending {
				return 0, 0, 0, errConfused
			}
			count = max(count, 0) // -1: a RESP2 null array
			if t == '%' || t == '|' {
				count *= 2
			}
			if t != '|' {
				need--
			}
			need += int(count)
		default:
			return 0, 0, 0, errConfused
		}
	}
	return n, at, typ, nil
}

// line returns the line at the start of b without its CRLF, and its
// length with it; w is 0 if b holds only part of it.
func line(b []byte) (l []byte, w int, err error) {
	i := bytes.IndexByte(b, '\n')
	switch {
	case i < 0 && len(b) > maxPending:
		return nil, 0, errConfused
	case i < 0:
		return nil, 0, nil
	case i < 2 || b[i-1] != '\r':
		return nil, 0, errConfused // a line holds its type byte at least
	}
	return b[:i-1], i + 1, nil
}

// atoi parses a decimal integer, without allocating.
func atoi(b []byte) (int64, bool) {
	neg := len(b) > 0 && b[0] == '-'
	if neg {
		b = b[1:]
	}
	if len(b) == 0 || len(b) > 18 {
		return 0, false
	}
	var v int64
	for _, d := range b {
		if d < '0' || d > '9' {
			return 0, false
		}
		v = v*10 + int64(d-'0')
	}
	if neg {
		v = -v
	}
	return v, true
}
