package lockregtest

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/alicebob/miniredis/v2/server"
	"github.com/redis/go-redis/v9"

	"github.com/lockreg/lockreg"
	"github.com/lockreg/lockreg/internal/redact"
)

// Lease is the lease of the registries the kit makes, unless their
// options say otherwise (lockreg.WithExpireAfter): short, so that a key
// a closed registry left behind frees within seconds, and so that their
// renewals, every second, notice what CLIENT TRACKING would have told at
// once; long enough that a test stalled for up to two seconds, on a
// loaded machine, keeps its holds.
const Lease = 3 * time.Second

// pingTimeout bounds NewAt's check that a Redis answers at its address.
const pingTimeout = 5 * time.Second

// New returns a registry on a Redis server embedded in the test process
// (miniredis), a server of its own, in a namespace of its own. It needs no
// redis-server. The registry, its client and the server are closed when
// the test ends (t.Cleanup). opts apply after the kit's own: a lease of
// Lease, an owner name (the test's name and the registry's number in the
// test: "TestPack#1"), and a logger that writes warnings and errors to
// the test's output.
func New(t testing.TB, opts ...lockreg.Option) *lockreg.Registry {
	t.Helper()
	return newEmbedded(t, nil, opts)
}

// newEmbedded is New; hook, if not nil, sees each command first, as
// miniredis's pre-hooks do, for the kit's own tests.
func newEmbedded(t testing.TB, hook server.Hook, opts []lockreg.Option) *lockreg.Registry {
	t.Helper()
	mr := miniredis.NewMiniRedis()
	// miniredis freezes TTLs unless told otherwise; leases must run out on
	// the wall clock, as on Redis.
	mr.ClockTTL(true)
	if err := mr.Start(); err != nil {
		t.Fatalf("lockregtest: start the embedded Redis: %v", err)
	}
	t.Cleanup(mr.Close)
	mr.Server().SetPreHook(func(peer *server.Peer, cmd string, args ...string) bool {
		return hook != nil && hook(peer, cmd, args...) || answerInfoMemory(peer, cmd, args...)
	})
	srv := &redisServer{options: redis.Options{Addr: mr.Addr()}, embedded: true}
	return srv.newRegistry(t, newNamespace(), opts)
}

// NewAt is New on the Redis server at addr, "host:port" or a redis:// or
// rediss:// URL, rather than an embedded one: for the tests that need
// Redis itself. Each call takes a namespace of its own, so tests may
// share a server; the keys of its locks expire a lease after the test.
// It fails the test at once if no Redis answers a PING at addr (nothing
// listens, a wrong password), rather than leave the test's acquisitions
// retrying until their contexts end.
func NewAt(t testing.TB, addr string, opts ...lockreg.Option) *lockreg.Registry {
	t.Helper()
	options := &redis.Options{Addr: addr}
	if strings.Contains(addr, "://") {
		var err error
		if options, err = redis.ParseURL(addr); err != nil {
			t.Fatalf("lockregtest: NewAt(%q): %v", redact.URL(addr), unparsable(addr, err))
		}
	}
	if err := ping(*options); err != nil {
		t.Fatalf("lockregtest: NewAt(%q): no Redis answers there: %v", redact.URL(addr), err)
	}
	srv := &redisServer{options: *options}
	return srv.newRegistry(t, newNamespace(), opts)
}

// unparsable is why ParseURL refused addr, unless it has a password,
// which url.Parse's errors quote, in part or whole.
func unparsable(addr string, err error) error {
	var parse *url.Error
	if redact.HasPassword(addr) && errors.As(err, &parse) {
		return errors.New("not a URL; percent-encode the password")
	}
	return err
}

// ping sends a PING to the server of options, on a client of its own.
func ping(options redis.Options) error {
	c := redis.NewClient(&options)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), pingTimeout)
	defer cancel()
	return c.Ping(ctx).Err()
}

// Another returns another registry on r's server, in r's namespace, with
// a client of its own: the two exclude each other, and pass keys between
// them, as the registries of two processes do. opts apply after the
// kit's own, as in New (r's options are not inherited). It is closed when
// the test ends; t is r's test or one of its subtests. r must come from
// this package (New, NewAt, NewPair, Another).
func Another(t testing.TB, r *lockreg.Registry, opts ...lockreg.Option) *lockreg.Registry {
	t.Helper()
	s := kitState(t, "Another", r)
	return s.srv.newRegistry(t, r.Key(), opts)
}

// NewPair returns two registries, as of two processes, on one new
// embedded server: New, then Another, both with opts.
func NewPair(t testing.TB, opts ...lockreg.Option) (a, b *lockreg.Registry) {
	t.Helper()
	a = New(t, opts...)
	return a, Another(t, a, opts...)
}

// redisServer is a server the kit makes registries on.
type redisServer struct {
	options  redis.Options // how to connect to it
	embedded bool          // miniredis, which the kit started
}

// made counts the registries made in each running test, by its name, to
// number their names: by test rather than by server, as each New and
// NewAt makes a server of its own.
var made struct {
	mu     sync.Mutex
	byTest map[string]int
}

// ownerName is the name of the next registry of t: its name and number.
func ownerName(t testing.TB) string {
	made.mu.Lock()
	defer made.mu.Unlock()
	if made.byTest == nil {
		made.byTest = make(map[string]int)
	}
	name := t.Name()
	if made.byTest[name] == 0 {
		t.Cleanup(func() {
			made.mu.Lock()
			delete(made.byTest, name)
			made.mu.Unlock()
		})
	}
	made.byTest[name]++
	return fmt.Sprintf("%s#%d", name, made.byTest[name])
}

// newRegistry makes a registry of namespace on s, and its client, both
// closed when the test ends.
func (s *redisServer) newRegistry(t testing.TB, namespace string, opts []lockreg.Option) *lockreg.Registry {
	t.Helper()
	owner := ownerName(t)

	options := s.options
	c := redis.NewClient(&options)
	t.Cleanup(func() { _ = c.Close() })
	var client redis.UniversalClient = c
	if s.embedded {
		client = embeddedClient{c}
	}
	out := &testOutput{w: t.Output()}
	t.Cleanup(out.close) // after the registry's Close: it may log until then
	kitOpts := []lockreg.Option{
		lockreg.WithExpireAfter(Lease),
		lockreg.WithOwner(owner),
		lockreg.WithLogger(slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelWarn, ReplaceAttr: withoutTime}))),
	}
	r, err := lockreg.New(client, namespace, append(kitOpts, opts...)...)
	if err != nil {
		t.Fatalf("lockregtest: %v", err)
	}
	st := &state{srv: s, client: c, owner: owner, held: map[string]int{}, losses: map[string]chan struct{}{}}
	r.AddHooks(st.hooks())
	states.Store(r, st)
	t.Cleanup(func() {
		_ = r.Close()
		states.Delete(r)
	})
	return r
}

// embeddedClient is the client of a registry on the embedded server.
// miniredis has no CLIENT TRACKING. On a *redis.Client, a registry finds
// that out on a connection of its own, in the background, and the news
// that a held key changed which comes meanwhile (a ForceUnlock's) waits
// for the next renewal; on a client of another type it knows from the
// start that it has no tracking, and checks such news itself, at once.
type embeddedClient struct{ *redis.Client }

// answerInfoMemory answers INFO memory (with the server section, which a
// registry reads with it), which miniredis does not, as a Redis 7.0
// without a memory limit does: a registry reads it to refuse a server
// that may evict lock keys, and miniredis never evicts. It lets miniredis
// handle every other command.
func answerInfoMemory(peer *server.Peer, cmd string, args ...string) bool {
	if cmd != "INFO" || !slices.ContainsFunc(args, func(a string) bool { return strings.EqualFold(a, "memory") }) {
		return false
	}
	peer.WriteBulk("# Server\r\nredis_version:7.0.0\r\n\r\n# Memory\r\nmaxmemory:0\r\nmaxmemory_policy:noeviction\r\n")
	return true
}

// newNamespace is a registryKey of its own, which no earlier test, of
// this process or another, used.
func newNamespace() string { return "lockregtest:" + rand.Text()[:16] }

// testOutput is a test's output, which the registry's logger writes to
// until the test's cleanup closes it, and which drops what comes after: a
// write to a finished test's output panics.
type testOutput struct {
	mu     sync.Mutex
	w      io.Writer
	closed bool
}

func (o *testOutput) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return len(p), nil
	}
	return o.w.Write(p)
}

func (o *testOutput) close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.closed = true
}

// withoutTime drops the time from the registry's log lines: the test's
// output needs none.
func withoutTime(groups []string, a slog.Attr) slog.Attr {
	if len(groups) == 0 && a.Key == slog.TimeKey {
		return slog.Attr{}
	}
	return a
}
