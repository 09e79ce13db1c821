package faultproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"
)

// A router's client opens each connection with the address it wants, on a
// line of its own; the router dials it and answers "+" on a line, or "-"
// and the error, then forwards. The dial takes at most dialTimeout.
const dialTimeout = 5 * time.Second

// maxLine bounds the address line a router reads.
const maxLine = 256

// connect dials l's server: the proxy's target, or the one l's client
// names to a router, which it then answers. It reports false, with l
// aborted, if that failed.
func (p *Proxy) connect(l *link) (net.Conn, bool) {
	target := p.target
	if target == "" {
		_ = l.client.SetReadDeadline(time.Now().Add(dialTimeout))
		line, err := readLine(l.client)
		_ = l.client.SetReadDeadline(time.Time{})
		if err != nil {
			l.abort()
			return nil, false
		}
		if err := checkLoopback(line); err != nil {
			p.answer(l, err)
			return nil, false
		}
		target = line
	}
	server, err := net.DialTimeout("tcp", target, dialTimeout)
	if err != nil {
		p.answer(l, err)
		return nil, false
	}
	if !l.connected(server) {
		return nil, false
	}
	if p.target == "" && !p.answer(l, nil) {
		return nil, false
	}
	return server, true
}

// answer tells a router's client how its dial went, once no stall holds
// the link back; it reports false, with l aborted, if that failed or err
// is not nil.
func (p *Proxy) answer(l *link, err error) bool {
	reply := "+\n"
	if err != nil {
		reply = "-" + strings.ReplaceAll(err.Error(), "\n", " ") + "\n"
	}
	if !p.await(l.dead) {
		return false
	}
	if _, werr := io.WriteString(l.client, reply); werr != nil || err != nil {
		l.abort()
		return false
	}
	return true
}

// readLine reads up to a newline, a byte at a time: what follows belongs
// to the stream.
func readLine(r io.Reader) (string, error) {
	var line []byte
	b := make([]byte, 1)
	for len(line) < maxLine {
		if _, err := io.ReadFull(r, b); err != nil {
			return "", err
		}
		if b[0] == '\n' {
			return string(line), nil
		}
		line = append(line, b[0])
	}
	return "", errors.New("faultproxy: address line too long")
}

// Dialer returns a dial function for go-redis (the Dialer of
// redis.Options, ClusterOptions and FailoverOptions) that reaches every
// address through the router at router. The connection it returns reports
// the address asked for as its RemoteAddr, as a direct one would:
// go-redis tells connections to a demoted primary by that address.
func Dialer(router string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		remote, err := net.ResolveTCPAddr(network, addr)
		if err != nil {
			return nil, err
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, network, router)
		if err != nil {
			return nil, err
		}
		if deadline, ok := ctx.Deadline(); ok {
			_ = c.SetDeadline(deadline)
		}
		reply, err := hello(c, addr)
		if err == nil && reply != "+" {
			err = fmt.Errorf("faultproxy: dial %s: %s", addr, strings.TrimPrefix(reply, "-"))
		}
		if err != nil {
			_ = c.Close()
			return nil, err
		}
		_ = c.SetDeadline(time.Time{})
		return &routed{TCPConn: c.(*net.TCPConn), remote: remote}, nil
	}
}

// hello names addr to the router on c and returns its answer.
func hello(c net.Conn, addr string) (string, error) {
	if _, err := io.WriteString(c, addr+"\n"); err != nil {
		return "", err
	}
	return readLine(c)
}

// routed is a connection through a router, which reports the server's
// address as its remote one. It keeps the TCP connection's other methods
// (go-redis checks pooled connections through SyscallConn).
type routed struct {
	*net.TCPConn
	remote net.Addr
}

func (c *routed) RemoteAddr() net.Addr { return c.remote }
