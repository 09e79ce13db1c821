package faultproxy

import (
	"net"
	"time"
)

// Stall stops every connection through the proxy from passing bytes, in
// either direction, until Resume: bytes sent meanwhile wait, as on a link
// that stopped delivering, and arrive after Resume, in order. A router
// also holds back the answer to a client that connects meanwhile, so its
// dial waits too. Connections stay open: a client that gives up closes its
// own, and the server sees that after everything sent before it.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stall == nil && !p.closed {
		p.stall = make(chan struct{})
	}
}

// Resume ends a stall.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.resume()
}

// resume ends a stall. Called with mu held.
func (p *Proxy) resume() {
	if p.stall != nil {
		close(p.stall)
		p.stall = nil
	}
}

// Delay adds latency to every piece of data through the proxy from now
// on, drawn for each uniformly between lo and hi, in both directions; the
// pieces of a stream still arrive in order. Delay(0, 0) ends it; what is
// under way keeps the latency it got.
func (p *Proxy) Delay(lo, hi time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay = [2]time.Duration{lo, max(lo, hi)}
}

// ResetConns resets every connection through the proxy, both the client's
// and the server's (a TCP RST, as a load balancer that drops its
// connections sends), and returns how many client connections there were.
// Bytes in flight are lost.
func (p *Proxy) ResetConns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	for l := range p.links {
		l.mu.Lock()
		for _, c := range []net.Conn{l.client, l.server} {
			if tc, ok := c.(*net.TCPConn); ok {
				// Linger 0: Close sends RST instead of FIN.
				_ = tc.SetLinger(0)
			}
		}
		l.mu.Unlock()
		l.abort()
	}
	return len(p.links)
}
