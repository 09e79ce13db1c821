package faultproxy

import (
	"math/rand/v2"
	"net"
	"time"
)

// depth is how many pieces of a stream a link holds while their delivery
// waits (a stall or a delay); beyond, the proxy stops reading, and the
// sender's socket buffers fill as on a real link.
const depth = 64

// piece is what one read of a connection returned, and when it is due at
// the other end.
type piece struct {
	b   []byte
	due time.Time
}

// forward copies src to dst through the proxy's faults until src ends,
// counting the commands in it if count. A clean end is passed on as a
// half close once every byte before it is delivered, as TCP would; an
// error on either side aborts the link.
func (p *Proxy) forward(l *link, dst, src net.Conn, count bool) {
	pieces := make(chan piece, depth)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer close(pieces)
		var ps parser
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				// Count before forwarding: a command whose reply the
				// client has seen is counted. The parser only reads buf.
				if count {
					if c := ps.feed(buf[:n]); c > 0 {
						p.commands.Add(c)
					}
				}
				select {
				case pieces <- piece{b: append([]byte(nil), buf[:n]...), due: time.Now().Add(p.latency())}:
				case <-l.dead:
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	for pc := range pieces {
		if !p.deliverable(l, pc.due) {
			continue // aborted: drain, so the reader ends
		}
		if _, err := dst.Write(pc.b); err != nil {
			l.abort()
		}
	}
	select {
	case <-l.dead:
	default:
		closeWrite(dst)
	}
}

// deliverable waits until no stall holds the link back and due has come,
// and reports false if the link was aborted meanwhile.
func (p *Proxy) deliverable(l *link, due time.Time) bool {
	if !p.await(l.dead) {
		return false
	}
	if wait := time.Until(due); wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-t.C:
		case <-l.dead:
			return false
		}
	}
	// A stall may have begun during the delay.
	return p.await(l.dead)
}

// await waits while the proxy is stalled; it reports false if dead closed
// first.
func (p *Proxy) await(dead <-chan struct{}) bool {
	for {
		p.mu.Lock()
		stall := p.stall
		p.mu.Unlock()
		if stall == nil {
			select {
			case <-dead:
				return false
			default:
				return true
			}
		}
		select {
		case <-stall:
		case <-dead:
			return false
		}
	}
}

// latency is the delay a piece read now gets: none, or one drawn
// uniformly from the range Delay set.
func (p *Proxy) latency() time.Duration {
	p.mu.Lock()
	lo, hi := p.delay[0], p.delay[1]
	p.mu.Unlock()
	if hi <= 0 {
		return 0
	}
	return lo + rand.N(hi-lo+1)
}

func closeWrite(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
		return
	}
	_ = c.Close()
}
