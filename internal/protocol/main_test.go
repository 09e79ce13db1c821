package protocol

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/lockreg/lockreg/internal/redistest"
)

// TestMain checks that the tests leave no goroutine behind: clients,
// subscriptions and the shared server all stop.
func TestMain(m *testing.M) { goleak.VerifyTestMain(redistest.M(m)) }

// The peers' settings unless a test says otherwise: long enough that
// nothing lapses or expires while a test runs.
const (
	testLease      = 10 * time.Second
	testRetry      = time.Second // a mark lasts two
	testGrantLease = 3 * time.Second
	testOwnerTTL   = 20 * time.Second
	// shortRetry is the retry interval of a peer whose mark must lapse
	// within a test.
	shortRetry = 20 * time.Millisecond
)

// loadScripts builds the scripts from the .lua files at the repository's
// root, as lockreg embeds them: the tests run what registries run.
func loadScripts(t testing.TB) *Scripts {
	t.Helper()
	read := func(name string) string {
		text, err := os.ReadFile(filepath.Join("..", "..", name))
		require.NoError(t, err)
		return string(text)
	}
	return NewScripts(Sources{
		DrawToken: read("drawtoken.lua"), MarkWaiting: read("markwaiting.lua"),
		Obtain: read("obtain.lua"), Release: read("release.lua"), Token: read("token.lua"),
		Renew: read("renew.lua"), ForceUnlock: read("forceunlock.lua"),
		RaiseFence: read("raisefence.lua"),
	})
}

// env is one test's view of the shared server: a client, the scripts,
// and a namespace of the test's own.
type env struct {
	t         *testing.T
	ctx       context.Context
	client    *redis.Client
	scripts   *Scripts
	namespace string
}

// newEnv's namespace is named after the test, with a suffix of its own:
// the runs of -count must not meet the keys earlier ones left to expire.
func newEnv(t *testing.T) *env {
	return &env{
		t: t, ctx: t.Context(), client: redistest.Shared(t).Client(t), scripts: loadScripts(t),
		namespace: t.Name() + ":" + uuid.NewString()[:8],
	}
}

// peer is a registry of the test's namespace with a fresh client id and
// the test settings, which edits may change.
func (e *env) peer(edits ...func(*Config)) *Peer {
	cfg := Config{
		Namespace: e.namespace, ClientID: uuid.NewString(),
		Lease: testLease, RetryInterval: testRetry, GrantLease: testGrantLease, Notify: true,
		Owner: "owner of " + e.t.Name(), OwnerTTL: testOwnerTTL, Since: time.Now(),
	}
	for _, edit := range edits {
		edit(&cfg)
	}
	return NewPeer(e.scripts, cfg)
}

// noGrants is a peer edit: the registry takes no grants.
func noGrants(cfg *Config) { cfg.GrantLease = 0 }

// lapsing is a peer edit: the registry's marks lapse within the test.
func lapsing(cfg *Config) { cfg.RetryInterval = shortRetry }

// run makes one call and returns its reply.
func (e *env) run(c Call) *redis.Cmd {
	Run(e.ctx, e.client, &c)
	return c.Cmd
}

// runAll runs calls as one pipeline and requires that each succeeds.
func (e *env) runAll(calls []*Call) {
	e.t.Helper()
	RunPipeline(e.ctx, e.client, calls)
	for _, c := range calls {
		require.NoError(e.t, c.Cmd.Err(), c.Args)
	}
}

// hold makes p take the free key k.
func (e *env) hold(p *Peer, k Keys) {
	e.t.Helper()
	held, err := ReadSetIfFree(e.run(p.SetIfFree(k)))
	require.NoError(e.t, err)
	require.True(e.t, held)
}

// wait makes p's attempt on k, which another registry holds, mark it as
// waiting, and returns the key's last token it replied.
func (e *env) wait(p *Peer, k Keys) int64 {
	e.t.Helper()
	found, err := ReadObtain(e.run(p.Obtain(k, true, false)))
	require.NoError(e.t, err)
	require.False(e.t, found.Held)
	require.Positive(e.t, found.LastToken)
	return found.LastToken
}

// release runs p's release of k (of key "k") with o.
func (e *env) release(p *Peer, k Keys, o Release) ReleaseReply {
	e.t.Helper()
	found, err := ReadRelease(e.run(p.Release(k, "k", o)))
	require.NoError(e.t, err)
	return found
}

// drawToken draws p's token for k, which p holds.
func (e *env) drawToken(p *Peer, k Keys) int64 {
	e.t.Helper()
	token, err := ReadToken(e.run(p.DrawToken(k)))
	require.NoError(e.t, err)
	require.Positive(e.t, token)
	return token
}

// owner is the lock key's value, or "" when it is gone.
func (e *env) owner(k Keys) string { return e.client.Get(e.ctx, k.Lock()).Val() }

// pttl is what is left of key's time to live (negative: none, or gone).
func (e *env) pttl(key string) time.Duration { return e.client.PTTL(e.ctx, key).Val() }

// fence is k's stored last token, 0 if none is.
func (e *env) fence(k Keys) int64 {
	token, _ := strconv.ParseInt(e.client.Get(e.ctx, k.Fence()).Val(), 10, 64)
	return token
}

// members are a sorted set's members, lowest score first.
func (e *env) members(key string) []string { return e.client.ZRange(e.ctx, key, 0, -1).Val() }

// requireMarked requires that mark is, or is not, in k's marker and queue.
func (e *env) requireMarked(k Keys, mark string, marked bool) {
	e.t.Helper()
	for _, set := range []string{k.Marker(), k.Queue()} {
		if marked {
			require.Contains(e.t, e.members(set), mark, set)
		} else {
			require.NotContains(e.t, e.members(set), mark, set)
		}
	}
}

// markOf is p's mark as the protocol spells it: the client id, and the
// grant lease if p takes grants.
func markOf(p *Peer, grantLease time.Duration) string {
	if grantLease == 0 {
		return p.ClientID()
	}
	return p.ClientID() + ":" + strconv.FormatInt(grantLease.Milliseconds(), 10)
}

// serverMicros is the server's clock (TIME) in microseconds, a token's
// unit.
func (e *env) serverMicros() int64 {
	now, err := e.client.Time(e.ctx).Result()
	require.NoError(e.t, err)
	return now.UnixMicro()
}

// subscribe subscribes to channels and waits until Redis confirmed it,
// so that nothing published after it returns is missed.
func (e *env) subscribe(channels ...string) *redis.PubSub {
	e.t.Helper()
	sub := e.client.Subscribe(e.ctx, channels...)
	e.t.Cleanup(func() { _ = sub.Close() })
	for range channels {
		msg, err := sub.ReceiveTimeout(e.ctx, time.Second)
		require.NoError(e.t, err)
		require.IsType(e.t, &redis.Subscription{}, msg)
	}
	return sub
}

// received requires that sub receives messages with these payloads on
// channel, in order.
func (e *env) received(sub *redis.PubSub, channel string, payloads ...string) {
	e.t.Helper()
	for _, want := range payloads {
		msg, err := sub.ReceiveTimeout(e.ctx, time.Second)
		require.NoError(e.t, err)
		require.Equal(e.t, &redis.Message{Channel: channel, Payload: want}, msg)
	}
}

// holder is a peer (of edits) that holds the test's key, "k", and its
// keys.
func (e *env) holder(edits ...func(*Config)) (*Peer, Keys) {
	e.t.Helper()
	p := e.peer(edits...)
	k := p.Keys("k")
	e.hold(p, k)
	return p, k
}
