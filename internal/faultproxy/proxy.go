// Package faultproxy is a TCP proxy between Redis clients and servers on
// this machine. It counts the commands clients send (see Commands), for
// measuring how many commands a lock puts on the wire, and it can stall,
// slow down and reset the connections through it (see Stall, Delay and
// ResetConns), for checking a lock under network faults.
//
// A proxy from Start forwards every connection to one server. A router
// from StartRouter forwards each connection to the server its client
// names as it connects, so that one router can stand between a client
// and every server the client discovers (Redis Cluster nodes, the primary
// Sentinel names): Dialer is the client's side of that.
//
// Bytes pass through as they are. Only loopback servers are served:
// faults are for this machine's tests, never for a real network.
package faultproxy

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy forwards connections from its loopback address to Redis servers.
type Proxy struct {
	ln       net.Listener
	target   string // "": a router
	commands atomic.Int64

	mu     sync.Mutex // guards the fields below
	links  map[*link]struct{}
	closed bool
	stall  chan struct{} // closed when the stall ends; nil if none
	delay  [2]time.Duration
	wg     sync.WaitGroup
}

// Start listens on a free loopback port and forwards every connection to
// target (host:port, on a loopback address).
func Start(target string) (*Proxy, error) {
	if err := checkLoopback(target); err != nil {
		return nil, err
	}
	return listen(target)
}

// StartRouter listens on a free loopback port and forwards each
// connection to the loopback address its client names (see Dialer).
func StartRouter() (*Proxy, error) { return listen("") }

func listen(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: %w", err)
	}
	p := &Proxy{ln: ln, target: target, links: make(map[*link]struct{})}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// checkLoopback refuses addresses that are not an IP loopback address and
// a port.
func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("faultproxy: %w", err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("faultproxy: %s is not a loopback address", addr)
	}
	return nil
}

// Addr is the address clients connect to.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Commands is the number of complete commands clients sent since Start or
// the last ResetCommands. A command is counted before it is forwarded, so
// once its reply has arrived it is in the count.
func (p *Proxy) Commands() int64 { return p.commands.Load() }

// ResetCommands sets the count to zero.
func (p *Proxy) ResetCommands() { p.commands.Store(0) }

// Close stops listening, ends any stall, closes every connection, and
// waits for the proxy's goroutines to end.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.wg.Wait()
		return nil
	}
	p.closed = true
	p.resume()
	err := p.ln.Close()
	for l := range p.links {
		l.abort()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

// link is one client connection and the server connection it is
// forwarded to, once there is one.
type link struct {
	client net.Conn
	once   sync.Once
	dead   chan struct{} // closed by abort

	mu     sync.Mutex
	server net.Conn
}

// abort closes both connections at once, from whichever side failed.
func (l *link) abort() {
	l.once.Do(func() {
		close(l.dead)
		_ = l.client.Close()
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.server != nil {
			_ = l.server.Close()
		}
	})
}

// connected sets the link's server connection; it reports false, closing
// server, if the link was aborted meanwhile.
func (l *link) connected(server net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.dead:
		_ = server.Close()
		return false
	default:
		l.server = server
		return true
	}
}

// track adds l to the links Close aborts; it reports false, aborting l,
// once the proxy is closed.
func (p *Proxy) track(l *link) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		l.abort()
		return false
	}
	p.links[l] = struct{}{}
	return true
}

func (p *Proxy) untrack(l *link) {
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
	l.abort()
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
		p.wg.Add(1)
		go p.serve(client)
	}
}

// serve forwards one client connection to a new connection to its server,
// and the server's replies back, until both sides are done.
func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	l := &link{client: client, dead: make(chan struct{})}
	if !p.track(l) {
		return
	}
	defer p.untrack(l)
	server, ok := p.connect(l)
	if !ok {
		return
	}
	replies := make(chan struct{})
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer close(replies)
		p.forward(l, client, server, false)
	}()
	p.forward(l, server, client, true)
	<-replies
}
