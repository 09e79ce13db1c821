package lockreg

import (
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/lockreg/lockreg/internal/protocol"
)

// Registry hands out distributed locks that share one Redis namespace and
// one client id. Create one per process and namespace with
// New, and Shutdown (or Close) it when done.
type Registry struct {
	client    redis.UniversalClient
	namespace string
	clientID  string // the value of every Redis key this registry holds
	cfg       config
	peer      *protocol.Peer // the calls it makes, spelled as the wire protocol has them
	locals    localLocks     // the local side of every key held or waited for
	batcher   batcher        // acquisitions' and releases' calls, coalesced
	stats     counters
	// callsEndAtDeadline says that the client ends its calls at their
	// context's deadline (go-redis's ContextTimeoutEnabled): see
	// acquisition.firstAttemptHere.
	callsEndAtDeadline bool
	notes              notifications // the subscription (notify.go)
	grants             grants        // the grants it takes and gives back (grant.go)
	contention         contention    // keys seen contended, releases to yield after (contention.go)
	life               lifecycle     // from New to Close (shutdown.go)
	tracking           tracking      // what tells holders at once that their keys changed (tracking.go)
	servers            serverCheck   // whether the servers may evict lock keys (servers.go)
	hooks              hookList      // what AddHooks added (hooks.go)
	owner              ownerRecord   // the name inspectors see (owner.go)
	forcing            ownForces     // its own forced unlocks in flight (forceunlock.go)
}

// New creates a registry whose locks live in Redis under namespace. The
// registry gets a random client id: registries in any process that share a
// namespace exclude each other; registries with different namespaces
// never interfere. (Those of one namespace on two databases of one
// server do not exclude each other, but hear each other's notes, which
// costs them round trips: docs/PROTOCOL.md, Databases of one server.) On
// a *redis.ClusterClient, the registry pipelines calls on each node's
// client (internal/protocol's runClusterPipeline says why): hooks added with OnNewNode see them, hooks added to the
// ClusterClient itself see only its single calls. No client's hooks see
// the calls on the registry's tracking connections (its reads of held keys,
// the renewals of tracked keys), which Hooks.RedisCalls counts.
func New(client redis.UniversalClient, namespace string, opts ...Option) (*Registry, error) {
	cfg, err := newConfig(client, namespace, opts)
	if err != nil {
		return nil, err
	}
	clientID := uuid.NewString()
	r := &Registry{
		client:    client,
		namespace: namespace,
		clientID:  clientID,
		cfg:       cfg,
		peer: protocol.NewPeer(scripts, protocol.Config{
			Namespace: namespace, ClientID: clientID,
			Lease: cfg.expireAfter, RetryInterval: cfg.retryInterval, GrantLease: cfg.grantLease(), Notify: cfg.pubSub,
			Owner: cfg.owner, OwnerTTL: cfg.ownerTTL(), Since: time.Now(),
		}),
		locals:             newLocalLocks(),
		batcher:            batcher{client: client},
		callsEndAtDeadline: endsCallsAtDeadline(client),
		grants:             newGrants(cfg.grantLease()),
		contention:         newContention(&cfg),
	}
	r.notes.names = r.peer.Channels()
	r.life.init()
	r.servers.init()
	r.goBackground(r.watch)
	r.goBackground(r.checkServers)
	if _, single := client.(*redis.Client); single {
		r.trackerFor("") // tracking is up before the first hold, as a rule
	}
	return r, nil
}

// Key returns the namespace the registry was made with: the prefix
// of its locks in Redis.
func (r *Registry) Key() string { return r.namespace }

// OwnerID returns the registry's client id: the value of every Redis key
// it holds, which Inspect reports as LockInfo.OwnerID, so that a caller
// can tell its own holds from others' (and free one of them only while
// it is its own, with ForceUnlockHeldBy).
func (r *Registry) OwnerID() string { return r.clientID }

// endsCallsAtDeadline reports whether client ends its calls at their
// context's deadline, as go-redis's clients do with ContextTimeoutEnabled.
// Other implementations of UniversalClient are not assumed to.
func endsCallsAtDeadline(client redis.UniversalClient) bool {
	switch c := client.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

// Obtain returns the lock for key, which may be any non-empty string (binary
// included). It is cheap and keeps nothing in the registry: locks for the
// same key, obtained at any time, share one state. The lock of an empty
// key holds nothing: its acquisitions fail with ErrInvalidKey (and Lock,
// which can report nothing, panics with it).
func (r *Registry) Obtain(key string) *Lock {
	return &Lock{r: r, key: key}
}
