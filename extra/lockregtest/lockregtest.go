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
)

// Lease is the lease of the registries the kit makes, unless their
// options say otherwise (lockreg.WithExpireAfter): short, so that a key
// a closed registry left behind frees within seconds, and so that their
// renewals, every second, notice what CLIENT TRACKING would have told at
// once; long enough that a test stalled for up to two seconds, on a
// loaded machine, keeps its holds.
const Lease = 3 * time.Second

// How long Lose waits: for the holder's subscription, which the holder
// opens in the background once it holds a key (milliseconds, unless the
// machine is loaded), where it has no tracking to hear of the forced
// unlock by (a holder with pub/sub off on the embedded server never has
// either, and waits it all); and for the holder to be told of its loss,
// which takes milliseconds, or up to a renewal interval (Lease/3) with
// pub/sub off.
const (
	subscriptionWait = time.Second
	loseTimeout      = 5 * time.Second
)

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
			t.Fatalf("lockregtest: NewAt(%q): %v", redacted(addr), err)
		}
	}
	if err := ping(*options); err != nil {
		t.Fatalf("lockregtest: NewAt(%q): no Redis answers there: %v", redacted(addr), err)
	}
	srv := &redisServer{options: *options}
	return srv.newRegistry(t, newNamespace(), opts)
}

// redacted is addr with the password of a URL left out, for failures.
func redacted(addr string) string {
	if u, err := url.Parse(addr); err == nil && strings.Contains(addr, "://") {
		return u.Redacted()
	}
	return addr
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

// Lose makes r lose the hold it has on key, as an operator's
// lockreg.Registry.ForceUnlock does: the key is deleted, the fencing
// token raised past the holder's, the key's waiters (of r or another
// registry) woken, and r told. Lose returns once r signalled the hold
// lost, for lockreg.LossForced: its Lost channel is closed, the context
// of the Do that holds it has ended with a cause matching
// lockreg.ErrLockLost, and its Release returns ErrLockLost. That takes
// milliseconds: r hears of it by pub/sub. Only a registry on the embedded
// server with WithPubSub(false) hears nothing: it finds its key gone
// (lockreg.LossDeleted) at its next renewal, within a third of its lease.
//
// Lose fails the test, as t.Fatal does (so call it from the test's
// goroutine), if r does not hold key (it never took it, released it, or
// lost it already), if r was not made by this package, or if r is not
// told within 5 seconds.
func Lose(t testing.TB, r *lockreg.Registry, key string) {
	t.Helper()
	s := kitState(t, "Lose", r)
	ctx, cancel := context.WithTimeout(context.Background(), loseTimeout)
	defer cancel()
	info, err := r.Inspect(ctx, key)
	if err != nil {
		t.Fatalf("lockregtest.Lose: %v", err)
	}
	if !s.holds(key) {
		t.Fatalf("lockregtest.Lose: %s does not hold %q (%s)", s.owner, key, holder(info, r.OwnerID()))
	}
	if !info.Held || info.OwnerID != r.OwnerID() {
		t.Fatalf("lockregtest.Lose: %s holds %q, but in Redis %s: its hold is lost already, and it has not noticed yet", s.owner, key, holder(info, r.OwnerID()))
	}
	// r hears of a forced unlock by pub/sub, once it has subscribed (in
	// the background, as it first holds a key); on the embedded server,
	// which has no CLIENT TRACKING, by nothing else until its next renewal.
	hears := s.awaitSubscription(ctx, r, info.OwnerID)
	lost := s.expectLoss(key)
	// Only while r holds it: another registry may take it meanwhile.
	forced, err := r.ForceUnlockHeldBy(ctx, key, r.OwnerID())
	switch {
	case err != nil:
		t.Fatalf("lockregtest.Lose: %v", err)
	case !forced:
		t.Fatalf("lockregtest.Lose: %q was released, or changed hands, while Lose forced it open", key)
	}
	select {
	case <-lost:
	case <-ctx.Done():
		why := ""
		if !hears {
			why = ": it has neither CLIENT TRACKING (the embedded server has none) nor a subscription yet (WithPubSub(false) makes none), and finds its key gone at its next renewal, a third of its lease"
		}
		t.Fatalf("lockregtest.Lose: %q was forced open, but %s did not signal its hold lost within %v%s", key, s.owner, loseTimeout, why)
	}
}

// holder says who holds a lock, as Inspect reported it, to a registry of
// client id self that has no live hold of it.
func holder(info lockreg.LockInfo, self string) string {
	switch {
	case !info.Held:
		return "nobody holds it"
	case info.OwnerID == self:
		// Close leaves its keys to their leases.
		return "its key is in Redis still, left by a hold that ended unreleased: its registry was closed, or it lost the hold"
	case info.Owner != "":
		return "it is held by " + info.Owner
	}
	return "it is held by the registry of client id " + info.OwnerID
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

// states are the kit's registries, each with what the kit knows of it.
var states sync.Map // *lockreg.Registry → *state

// kitState returns what the kit knows of r, or fails the test of fn if r
// is not one of its registries.
func kitState(t testing.TB, fn string, r *lockreg.Registry) *state {
	t.Helper()
	if r == nil {
		t.Fatalf("lockregtest.%s: the registry is nil", fn)
	}
	s, ok := states.Load(r)
	if !ok {
		t.Fatalf("lockregtest.%s: the registry %q was not made by lockregtest, or its test has ended", fn, r.Key())
	}
	return s.(*state)
}

// state is what the kit knows of one of its registries: its server, its
// client, and its holds, by its hooks.
type state struct {
	srv    *redisServer
	client *redis.Client
	owner  string // its owner name, as the kit gave it

	mu sync.Mutex // guards what follows
	// held counts the registry's live holds by key: acquired, and neither
	// released nor signalled lost. One at most, but a hand-off between
	// two local holders may be told in either order.
	held map[string]int
	// losses are closed when a hold of their key is signalled lost, for
	// Lose.
	losses map[string]chan struct{}
}

// hooks keep held up to date, and tell Lose of losses.
func (s *state) hooks() lockreg.Hooks {
	return lockreg.Hooks{
		AcquireDone: func(_ context.Context, e lockreg.AcquireEvent) {
			if e.Outcome == lockreg.OutcomeAcquired {
				s.count(e.Key, 1)
			}
		},
		ReleaseDone: func(_ context.Context, e lockreg.ReleaseEvent) {
			// A hold lost first was counted out by its loss; a second
			// Release of a hold changes nothing.
			if !e.WasLost && !errors.Is(e.Err, lockreg.ErrNotHeld) {
				s.count(e.Key, -1)
			}
		},
		Lost: func(e lockreg.LossEvent) {
			s.count(e.Key, -1)
			s.mu.Lock()
			defer s.mu.Unlock()
			if lost, ok := s.losses[e.Key]; ok {
				close(lost)
				delete(s.losses, e.Key)
			}
		},
	}
}

func (s *state) count(key string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held[key] += n; s.held[key] == 0 {
		delete(s.held, key)
	}
}

// holds reports whether the registry has a live hold on key.
func (s *state) holds(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held[key] > 0
}

// expectLoss returns a channel that is closed when a hold on key is next
// signalled lost.
func (s *state) expectLoss(key string) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	lost, ok := s.losses[key]
	if !ok {
		lost = make(chan struct{})
		s.losses[key] = lost
	}
	return lost
}

// awaitSubscription waits, for subscriptionWait at most, until r, the
// registry of clientID, hears of a forced unlock at once: it has
// subscribed to its notifications (its grant channel, docs/PROTOCOL.md,
// subscribed to in one SUBSCRIBE with the channel of forced unlocks), or
// has tracking on; it reports which. A registry with pub/sub off never
// subscribes.
func (s *state) awaitSubscription(ctx context.Context, r *lockreg.Registry, clientID string) bool {
	channel := r.Key() + ":released:" + clientID
	ctx, cancel := context.WithTimeout(ctx, subscriptionWait)
	defer cancel()
	for !r.Stats().Tracking {
		n, err := s.client.PubSubNumSub(ctx, channel).Result()
		if err == nil && n[channel] > 0 {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(2 * time.Millisecond):
		}
	}
	return true
}
