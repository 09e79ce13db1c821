// Package proxy is a TCP proxy for Redis that counts the commands clients
// send through it, for measuring how many commands a lock puts on the wire.
//
// It parses the client-to-server stream as RESP (arrays of bulk strings, as
// go-redis and rueidis send them, and inline commands) and counts one per
// complete command; a pipeline of N commands counts N. Replies pass
// through untouched and unparsed.
package proxy

import (
	"bytes"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy forwards connections from its loopback address to a target and
// counts the commands clients send.
type Proxy struct {
	ln       net.Listener
	target   string
	commands atomic.Int64

	mu     sync.Mutex // guards conns and closed
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// Start listens on a free loopback port and forwards every connection to
// target (host:port).
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: make(map[net.Conn]struct{})}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address clients connect to.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Commands is the number of complete commands clients sent since Start or
// the last Reset. A command is counted before it is forwarded, so once its
// reply has arrived it is in the count.
func (p *Proxy) Commands() int64 { return p.commands.Load() }

// Reset sets the count to zero.
func (p *Proxy) Reset() { p.commands.Store(0) }

// Close stops listening, closes every connection, and waits for the
// proxy's goroutines to end.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.wg.Wait()
		return nil
	}
	p.closed = true
	err := p.ln.Close()
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

// track adds c to the connections Close closes; it reports false, closing
// c, once the proxy is closed.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	_ = c.Close()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return // closed
		}
		if !p.track(client) {
			return
		}
		p.wg.Add(1)
		go p.serve(client)
	}
}

// serve forwards one client connection to a new connection to the target.
func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	defer p.untrack(client)
	server, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		return
	}
	if !p.track(server) {
		return
	}
	defer p.untrack(server)

	done := make(chan struct{})
	go func() { // replies, as they are
		defer close(done)
		_, _ = io.Copy(client, server)
		closeWrite(client) // the server is done: tell the client
	}()
	p.forwardCommands(server, client)
	closeWrite(server) // the client is done: tell the server, which then closes
	<-done
}

// forwardCommands copies src to dst, counting the commands as they pass.
func (p *Proxy) forwardCommands(dst, src net.Conn) {
	var ps parser
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			// Count before forwarding: a command whose reply the client
			// has seen is counted. The parser only reads buf.
			if c := ps.feed(buf[:n]); c > 0 {
				p.commands.Add(c)
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func closeWrite(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
		return
	}
	_ = c.Close()
}

// The parser's states.
const (
	stCommand  = iota // at the start of a command
	stArrayLen        // in "*<n>\r\n", after the '*'
	stElement         // at the start of an array element
	stBulkLen         // in "$<n>\r\n", after the '$'
	stBulkBody        // in a bulk string's payload and its CRLF
	stLine            // in an array element that is not a bulk string, up to '\n'
	stInline          // in an inline command, up to '\n'
)

// maxLen caps the lengths parsed, so that garbage cannot overflow them.
const maxLen = 1 << 40

// parser counts the commands in a client's RESP stream, fed as it arrives
// in pieces of any size; a command may span pieces.
type parser struct {
	state    int
	n        int64 // the length being parsed
	neg      bool  // the length being parsed is negative
	elems    int64 // elements left in the current array
	skip     int64 // bytes left in the current bulk string, CRLF included
	nonEmpty bool  // the current inline command has a non-blank byte
}

// feed parses the next piece of the stream and returns how many commands
// it completed. As Redis does, it counts no empty arrays ("*0", "*-1") and
// no blank inline lines.
func (ps *parser) feed(b []byte) (commands int64) {
	for i := 0; i < len(b); {
		switch ps.state {
		case stCommand:
			switch b[i] {
			case '*':
				ps.state, ps.n, ps.neg = stArrayLen, 0, false
				i++
			default:
				ps.state, ps.nonEmpty = stInline, false
			}
		case stArrayLen, stBulkLen:
			c := b[i]
			i++
			switch {
			case c >= '0' && c <= '9':
				if ps.n < maxLen {
					ps.n = ps.n*10 + int64(c-'0')
				}
				continue
			case c == '-':
				ps.neg = true
				continue
			case c != '\n':
				continue // '\r', or garbage Redis would refuse
			}
			if ps.state == stArrayLen {
				if ps.neg || ps.n == 0 {
					ps.state = stCommand
				} else {
					ps.elems, ps.state = ps.n, stElement
				}
			} else if ps.neg { // a null bulk string
				commands += ps.elementDone()
			} else {
				ps.skip, ps.state = ps.n+2, stBulkBody
			}
		case stBulkBody:
			take := min(ps.skip, int64(len(b)-i))
			i += int(take)
			if ps.skip -= take; ps.skip == 0 {
				commands += ps.elementDone()
			}
		case stElement:
			if b[i] == '$' {
				ps.state, ps.n, ps.neg = stBulkLen, 0, false
			} else {
				ps.state = stLine
			}
			i++
		case stLine:
			j := bytes.IndexByte(b[i:], '\n')
			if j < 0 {
				i = len(b)
				continue
			}
			i += j + 1
			commands += ps.elementDone()
		case stInline:
			j := bytes.IndexByte(b[i:], '\n')
			end := len(b)
			if j >= 0 {
				end = i + j
			}
			if !ps.nonEmpty && len(bytes.Trim(b[i:end], " \t\r")) > 0 {
				ps.nonEmpty = true
			}
			if j < 0 {
				i = len(b)
				continue
			}
			i = end + 1
			if ps.nonEmpty {
				commands++
			}
			ps.state = stCommand
		}
	}
	return commands
}

// elementDone ends an array element and reports whether it ended the
// command.
func (ps *parser) elementDone() int64 {
	if ps.elems--; ps.elems > 0 {
		ps.state = stElement
		return 0
	}
	ps.state = stCommand
	return 1
}
