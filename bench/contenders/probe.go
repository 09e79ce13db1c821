package contenders

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockreg/lockreg"
)

// Probe timestamps, in one process, the moments of a hand-off between
// processes that a lock's API does not show (S4's hand-off split): when
// a call made with a context that carries armed CallTimes was sent and
// its reply read (a go-redis hook), and when a message that the probe
// looks for reached one of the client's connections (each connection the
// client dials, its subscription's included, is wrapped, and every read
// is scanned for pub/sub messages). It changes no library: lockreg gets
// its hooks (Hooks.AcquireDone) and its client the go-redis hook.
type Probe struct {
	wanted func(payload []byte) bool
	heard  atomic.Int64 // unix ns: the last read that brought a wanted message
}

// NewProbe makes a probe that looks for the messages whose payload wanted
// accepts (LockRegGrant, FloorBaton).
func NewProbe(wanted func(payload []byte) bool) *Probe { return &Probe{wanted: wanted} }

// LockRegGrant accepts lockreg's grant notes, 'g<token>:<client id>:<key>'
// (internal/protocol/notes.go), published on the grantee's own channel.
func LockRegGrant(payload []byte) bool {
	return len(payload) > 1 && payload[0] == 'g' && payload[1] >= '0' && payload[1] <= '9'
}

// FloorBaton accepts the hand-off floor's baton.
func FloorBaton(payload []byte) bool { return string(payload) == floorBaton }

// Heard returns when (unix ns) the process last read a wanted message, 0
// before the first.
func (p *Probe) Heard() int64 { return p.heard.Load() }

// Hook is the go-redis hook that times the calls of armed CallTimes and
// wraps the client's connections. Add it before the client dials.
func (p *Probe) Hook() redis.Hook { return probeHook{p} }

// LockRegHooks tell the CallTimes of an acquisition's context how it took
// its key.
func (p *Probe) LockRegHooks() lockreg.Hooks {
	return lockreg.Hooks{AcquireDone: func(ctx context.Context, e lockreg.AcquireEvent) {
		if ct := callTimesOf(ctx); ct != nil && e.Outcome == lockreg.OutcomeAcquired {
			ct.path.Store(pathCodes[e.Path])
		}
	}}
}

var pathCodes = map[lockreg.Path]int32{lockreg.PathRedis: 1, lockreg.PathHandoff: 2, lockreg.PathGrant: 3}

// CallTimes is what the probe saw of one goroutine's calls: when the
// first call made while armed was sent and the last one's reply read, and
// how its last acquisition took its key (lockreg's only). Safe for
// concurrent use: a lock may send a caller's call from another goroutine.
type CallTimes struct {
	armed         atomic.Bool
	sent, replied atomic.Int64
	path          atomic.Int32
}

type callTimesKey struct{}

// WithCallTimes returns ctx carrying ct, for the probe's hooks.
func WithCallTimes(ctx context.Context, ct *CallTimes) context.Context {
	return context.WithValue(ctx, callTimesKey{}, ct)
}

func callTimesOf(ctx context.Context) *CallTimes {
	ct, _ := ctx.Value(callTimesKey{}).(*CallTimes)
	return ct
}

// Arm starts timing the calls made with ct's context.
func (ct *CallTimes) Arm() {
	ct.sent.Store(0)
	ct.replied.Store(0)
	ct.armed.Store(true)
}

// Disarm stops timing and returns when the first call since Arm was sent
// and the last reply read (unix ns; 0 if no call went out).
func (ct *CallTimes) Disarm() (sent, replied int64) {
	ct.armed.Store(false)
	return ct.sent.Load(), ct.replied.Load()
}

// TakePath returns how the last acquisition took its key ("redis",
// "handoff", "grant"; "" if not told) and forgets it.
func (ct *CallTimes) TakePath() string {
	switch ct.path.Swap(0) {
	case 1:
		return string(lockreg.PathRedis)
	case 2:
		return string(lockreg.PathHandoff)
	case 3:
		return string(lockreg.PathGrant)
	}
	return ""
}

func (ct *CallTimes) timed(call func() error) error {
	ct.sent.CompareAndSwap(0, time.Now().UnixNano())
	err := call()
	ct.replied.Store(time.Now().UnixNano())
	return err
}

type probeHook struct{ p *Probe }

func (h probeHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &probedConn{Conn: conn, p: h.p}, nil
	}
}

func (h probeHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if ct := callTimesOf(ctx); ct != nil && ct.armed.Load() {
			return ct.timed(func() error { return next(ctx, cmd) })
		}
		return next(ctx, cmd)
	}
}

func (h probeHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if ct := callTimesOf(ctx); ct != nil && ct.armed.Load() {
			return ct.timed(func() error { return next(ctx, cmds) })
		}
		return next(ctx, cmds)
	}
}

// probedConn is a connection whose reads the probe scans.
type probedConn struct {
	net.Conn
	p *Probe
}

func (c *probedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		now := time.Now().UnixNano()
		if scanMessages(b[:n], c.p.wanted) {
			c.p.heard.Store(now)
		}
	}
	return n, err
}

// scanMessages reports whether buf, bytes as read from a connection,
// holds a pub/sub message (RESP2 or RESP3: "message", the channel, the
// payload, each a bulk string) whose payload wanted accepts. A payload
// cut by the end of the read is judged on what arrived.
func scanMessages(buf []byte, wanted func([]byte) bool) bool {
	marker := []byte("$7\r\nmessage\r\n")
	for {
		i := bytes.Index(buf, marker)
		if i < 0 {
			return false
		}
		buf = buf[i+len(marker):]
		_, rest, err := bulk(buf)
		if err != nil {
			continue
		}
		payload, _, err := bulk(rest)
		if err == nil && wanted(payload) {
			return true
		}
	}
}

// bulk reads a RESP bulk string off the start of buf: its bytes (those
// that arrived, if cut) and what follows.
func bulk(buf []byte) (s, rest []byte, err error) {
	end := bytes.Index(buf, []byte("\r\n"))
	if len(buf) == 0 || buf[0] != '$' || end < 0 {
		return nil, buf, errors.New("not a bulk string")
	}
	n, err := strconv.Atoi(string(buf[1:end]))
	if err != nil || n < 0 {
		return nil, buf, errors.New("not a bulk string")
	}
	buf = buf[end+2:]
	if len(buf) < n {
		return buf, nil, nil
	}
	rest = buf[n:]
	if len(rest) >= 2 {
		rest = rest[2:]
	}
	return buf[:n], rest, nil
}

// NewProbedLockReg is lockreg with its defaults, as LockReg, its client
// and registry probed by p: the hand-off split's lockreg.
func NewProbedLockReg(addr string, p *Probe) (Contender, error) {
	client := redis.NewClient(&redis.Options{Addr: addr})
	client.AddHook(p.Hook())
	reg, err := lockreg.New(client, "bench")
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	reg.AddHooks(p.LockRegHooks())
	return &lockReg{client: client, reg: reg}, nil
}
