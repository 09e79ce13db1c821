package lockreg

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg/internal/redistest"
)

// A connection can die without a word: its peer's host vanished, or a NAT
// or load balancer dropped its state. Writes then go into the void and
// reads see nothing. These tests make a registry's connections so, and
// check that its subscriptions come back.

// silentConn is a connection that can go silent: its writes are dropped,
// and its reads return nothing (what Redis sends is read and dropped).
// subscribed says that it sent a SUBSCRIBE; tracking, a CLIENT TRACKING.
type silentConn struct {
	net.Conn
	silent, subscribed, tracking atomic.Bool
}

func (c *silentConn) Write(p []byte) (int, error) {
	if c.silent.Load() {
		return len(p), nil
	}
	if bytes.Contains(bytes.ToLower(p), []byte("subscribe")) {
		c.subscribed.Store(true)
	}
	if bytes.Contains(bytes.ToLower(p), []byte("tracking\r\n$2\r\non\r\n")) {
		c.tracking.Store(true)
	}
	return c.Conn.Write(p)
}

func (c *silentConn) Read(p []byte) (int, error) {
	for {
		n, err := c.Conn.Read(p)
		if err != nil || !c.silent.Load() {
			return n, err
		}
	}
}

// silencer dials connections that it can silence, all at once.
type silencer struct {
	mu    sync.Mutex
	conns []*silentConn
}

func (s *silencer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	sc := &silentConn{Conn: c}
	s.mu.Lock()
	s.conns = append(s.conns, sc)
	s.mu.Unlock()
	return sc, nil
}

// silenceSubscriptions silences the connections dialled so far that
// subscribed; later ones work.
func (s *silencer) silenceSubscriptions() {
	s.silence(func(c *silentConn) *atomic.Bool { return &c.subscribed })
}

// silenceTracking silences the tracking connections dialled so far.
func (s *silencer) silenceTracking() {
	s.silence(func(c *silentConn) *atomic.Bool { return &c.tracking })
}

// silence silences the connections dialled so far whose flag is set.
func (s *silencer) silence(flag func(*silentConn) *atomic.Bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		if flag(c).Load() {
			c.silent.Store(true)
		}
	}
}

// silenceable returns a client of srv whose connections silencer can
// silence, with subscriptionCheck short, so that a silence is found in
// well under a second.
func silenceable(t *testing.T, srv *redistest.Server) (*redis.Client, *silencer) {
	check := subscriptionCheck
	subscriptionCheck = 200 * time.Millisecond
	t.Cleanup(func() { subscriptionCheck = check }) // after the registries' Close
	s := new(silencer)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), Dialer: s.dial})
	t.Cleanup(func() { _ = client.Close() })
	return client, s
}

// The registry's subscription died silently while it waited: it
// subscribes again, and the grant of the next release reaches it, rather
// than its waiters polling for good.
func TestASubscriptionWhoseConnectionDiedSilentlyComesBack(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	client, s := silenceable(t, srv)
	held := newRegistry(t, srv.Client(t)).Obtain("k")
	held.Lock()
	waiter := newRegistry(t, client, WithRetryInterval(20*time.Second)) // only a grant or a wake-up is heard in time
	taken, hold := make(chan struct{}), make(chan *Hold, 1)
	go func() {
		h, err := waiter.Obtain("k").Acquire(ctx)
		if err == nil {
			close(taken)
		}
		hold <- h
	}()
	waitUntilWaiting(t, waiter)
	waiter.notes.mu.Lock()
	first := waiter.notes.sub
	waiter.notes.mu.Unlock()

	s.silenceSubscriptions()
	require.Eventually(t, func() bool {
		waiter.notes.mu.Lock()
		defer waiter.notes.mu.Unlock()
		return waiter.notes.sub != nil && waiter.notes.sub != first
	}, 10*time.Second, 10*time.Millisecond, "a new subscription")
	held.Unlock()
	requireFires(t, taken, 5*time.Second, "the release reaches the waiter")
	require.NoError(t, (<-hold).Release(ctx))
}

// A tracker's target died silently: a new one takes over, with a new
// tracking connection, and a holder still learns at once that its key was
// deleted, not at its next renewal.
func TestATrackerWhoseTargetDiedSilentlyComesBack(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	client, s := silenceable(t, srv)
	// Without pub/sub, the target's is the only subscription, and the
	// first read after the silence is the new tracking connection's.
	r := newRegistry(t, client, WithPubSub(false))
	reads := trackingReads(r)
	h, err := r.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return reads.Load() >= 1 }, 5*time.Second, time.Millisecond, "the key is armed")
	tr := r.tracking.single.Load()
	target, before := tr.subID.Load(), reads.Load()

	s.silenceSubscriptions()
	require.Eventually(t, func() bool { return tr.subID.Load() != target }, 10*time.Second, 10*time.Millisecond, "a new target")
	require.Eventually(t, func() bool { return reads.Load() > before }, 10*time.Second, time.Millisecond, "the new tracking connection reads the key")
	requireOpen(t, h.Lost(), "the silence lost no key")
	require.NoError(t, srv.Client(t).Del(ctx, h.redisKey()).Err())
	requireFires(t, h.Lost(), blindLimit, "the holder learns at once that its key was deleted")
	// The new connection's check of every held key, which finds a key gone
	// for the connection's cause (restart), may run after the DEL.
	h.mu.Lock()
	defer h.mu.Unlock()
	require.Contains(t, []LossCause{LossDeleted, LossRestart}, h.cause)
}

// A tracking connection that the server closed (CLIENT KILL here; its
// idle timeout or maxmemory-clients alike) tells its target nothing, and
// the keys it read are tracked no more: its PING finds it gone within
// about trackingCheck, and a new one checks every held key. Unchecked, a
// change would go untold until the next renewal (lease/3: 10s here).
func TestAHolderWhoseTrackingConnectionWasClosedLearnsOfAChangeSoon(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	r := newRegistry(t, srv.Client(t))
	reads := trackingReads(r)
	h, err := r.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	tr := r.tracking.single.Load()
	require.Eventually(t, func() bool {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		return reads.Load() >= 1 && len(tr.queue) == 0 && !tr.timerSet
	}, 5*time.Second, time.Millisecond, "the key is armed, and the tracker idle: nothing but the check uses the connection")

	var tracking []string
	for _, line := range strings.Split(admin.ClientList(ctx).Val(), "\n") {
		var id, flags string
		for _, field := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(field, "id="); ok {
				id = v
			}
			if v, ok := strings.CutPrefix(field, "flags="); ok {
				flags = v
			}
		}
		if strings.Contains(flags, "t") {
			tracking = append(tracking, id)
		}
	}
	require.Len(t, tracking, 1, "the registry's tracking connection")
	require.NoError(t, admin.Do(ctx, "client", "kill", "id", tracking[0]).Err())
	require.NoError(t, admin.Del(ctx, h.redisKey()).Err())
	took := requireFires(t, h.Lost(), 3*trackingCheck, "the holder learns of the DEL once the closed connection is found")
	h.mu.Lock()
	t.Logf("told after %v, cause %v", took, h.cause)
	h.mu.Unlock()
}

// TestATargetMovedWhileItSubscribesKeepsTrackingOn: moveTarget closes the
// target's subscription when a tracking connection finds no target (after
// a restart, the tracking connection may reconnect before the target
// does); a close that lands before the subscription's confirmations came
// is no refusal of tracking by the server, which would leave every later
// change of a held key to its renewal.
func TestATargetMovedWhileItSubscribesKeepsTrackingOn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	r := newRegistry(t, srv.Client(t))
	h, err := r.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	requireTracking(t, r)
	tr := r.tracking.single.Load()
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end) && !tr.refused.Load(); {
		tr.moveTarget()
		time.Sleep(100 * time.Microsecond)
	}
	require.False(t, tr.refused.Load(), "a target closed while it subscribed turned tracking off")
	require.True(t, r.Stats().Tracking)
	require.Eventually(t, tr.up.Load, 5*time.Second, time.Millisecond, "the target subscribed again")
	require.NoError(t, admin.Del(ctx, h.redisKey()).Err())
	requireFires(t, h.Lost(), 3*trackingCheck, "the holder learns of the DEL")
}

// TestARenewalOutlivesASilentTrackingConnection: renewals of tracked keys
// go on the tracking connection, but its silence (a dead peer, a dropped
// NAT entry) must not keep them from the registry's client for longer
// than the lease allows: a read there waits for go-redis's ReadTimeout
// (3 s), longer than this lease.
func TestARenewalOutlivesASilentTrackingConnection(t *testing.T) {
	ctx := context.Background()
	client, silencer := silenceable(t, redistest.Start(t))
	const lease = 1500 * time.Millisecond
	r := newRegistry(t, client, WithExpireAfter(lease))
	h, err := r.Obtain("k").Acquire(ctx)
	require.NoError(t, err)
	requireTracking(t, r)
	time.Sleep(lease / 2) // armed, and renewed on the tracking connection
	silencer.silenceTracking()
	select {
	case <-h.Lost():
		t.Fatalf("the hold was lost: %v", h.Err())
	case <-time.After(2 * lease):
	}
}

// TestARefusedSubscriptionIsWarnedOfOnce: an ACL without SUBSCRIBE (or a
// proxy without pub/sub) refuses the registry's subscription for good:
// waiters then poll, and holders hear of a restart only at their next
// renewal. That is said once, as a warning, and not at each later try.
func TestARefusedSubscriptionIsWarnedOfOnce(t *testing.T) {
	ctx := context.Background()
	client := aclClient(t, redistest.Start(t), "+@all", "-subscribe")
	logs := &syncBuffer{}
	r := newRegistry(t, client, WithLogger(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	for range 2 {
		r.notes.subscribeAfter.Store(0) // try again at once
		h, err := r.Obtain("k").Acquire(ctx)
		require.NoError(t, err)
		require.Eventually(t, func() bool { return r.notes.subscribeAfter.Load() != 0 && !r.notes.subscribing.Load() },
			5*time.Second, time.Millisecond, "the registry tried to subscribe")
		require.NoError(t, h.Release(ctx))
	}
	require.Equal(t, 1, strings.Count(logs.String(), "subscription refused"), logs.String())
}
