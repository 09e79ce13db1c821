package protocol

import (
	"strconv"
	"time"
)

// Config is what the protocol needs to know of a registry.
type Config struct {
	Namespace string
	ClientID  string // the value of every lock key the registry holds
	Lease     time.Duration
	// RetryInterval is how often a waiting registry attempts: its mark
	// lasts two of them, so that each attempt renews it in time.
	RetryInterval time.Duration
	// GrantLease is the lease of a key granted to the registry, or 0 if it
	// takes no grants.
	GrantLease time.Duration
	// Notify says that the registry's releases publish on the namespace's
	// release channel (pub/sub on).
	Notify bool
	// Owner is the registry's owner name; OwnerTTL how long its owner hash
	// outlives its last refresh; Since when the registry was made.
	Owner    string
	OwnerTTL time.Duration
	Since    time.Time
}

// Peer is one registry as the protocol sees it: the calls it makes and
// the arguments it sends with them, boxed once, as boxing a string into an
// argument costs an allocation per call (and go-redis copies what it is
// given).
type Peer struct {
	scripts   *Scripts
	namespace string
	clientID  string
	channel   string // the release channel, or "" when releases publish nothing
	// clientIDArg, leaseArg and channelArg are the client id, the lease in
	// ms and the channel, boxed.
	clientIDArg, leaseArg, channelArg any
	// obtain are obtain.lua's arguments, by whether the attempt will wait
	// (it then marks the registry if it fails) and whether an earlier one
	// marked it (a success withdraws the mark).
	obtain [2][2][]any
	// ownerAndLease are token.lua's and renew.lua's; ownerOnly, release.lua's
	// when nobody is expected to wait; renewTracked, renew.lua's on a
	// tracking connection.
	ownerAndLease, ownerOnly, renewTracked []any
	// mark is the registry's waiting mark: its client id, and if it takes
	// grants, ':<grant lease in ms>'. markMs is how long a mark lasts.
	mark, markMs string
	grantMs      int64
	ownerKey     string
	ownerFields  []any // the owner hash's fields and values, for HSET
	ownerTTLms   int64
}

// NewPeer makes the protocol's side of a registry of cfg, using scripts.
func NewPeer(scripts *Scripts, cfg Config) *Peer {
	p := &Peer{
		scripts:     scripts,
		namespace:   cfg.Namespace,
		clientID:    cfg.ClientID,
		clientIDArg: cfg.ClientID,
		leaseArg:    ms(cfg.Lease),
		grantMs:     cfg.GrantLease.Milliseconds(),
		mark:        cfg.ClientID,
		markMs:      ms(max(2*cfg.RetryInterval, 2*time.Millisecond)),
		ownerKey:    OwnerKey(cfg.Namespace, cfg.ClientID),
		ownerTTLms:  cfg.OwnerTTL.Milliseconds(),
	}
	if cfg.Notify {
		p.channel = ReleaseChannel(cfg.Namespace)
	}
	p.channelArg = p.channel
	if cfg.GrantLease > 0 {
		p.mark += ":" + strconv.FormatInt(p.grantMs, 10)
	}
	// An attempt that will not wait (TryLock's) leaves no mark: nobody
	// would answer a wake-up, and its mark, served first, would cost a
	// real waiter its grant.
	// The mark argument is the mark a waiting attempt sets, wherever a
	// success withdraws one (wasMarked '1'): an attempt that will not wait
	// but was marked, which no acquisition makes today (one that will not
	// wait never has a mark), would else withdraw the bare client id and
	// leave the real mark for releases to grant the key to.
	markMs := [2]string{"0", p.markMs}
	marks := [2]string{cfg.ClientID, p.mark}
	for wait := range 2 {
		for marked, wasMarked := range []string{"0", "1"} {
			p.obtain[wait][marked] = []any{p.clientIDArg, p.leaseArg, markMs[wait], wasMarked, marks[max(wait, marked)]}
		}
	}
	p.ownerAndLease = []any{p.clientIDArg, p.leaseArg}
	p.ownerOnly = []any{p.clientIDArg}
	p.renewTracked = []any{p.clientIDArg, p.leaseArg, "1"}
	p.ownerFields = []any{"hset", p.ownerKey, ownerNameField, cfg.Owner, ownerSinceField, strconv.FormatInt(cfg.Since.UnixMilli(), 10)}
	return p
}

func ms(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

// ClientID is the registry's client id.
func (p *Peer) ClientID() string { return p.clientID }

// Keys are the keys of key's lock in the registry's namespace.
func (p *Peer) Keys(key string) Keys { return LockKeys(p.namespace, key) }

// Channels are the channels the registry subscribes to: the namespace's
// release channel, and its own grant channel if it takes grants.
func (p *Peer) Channels() []string {
	if p.channel == "" {
		return nil
	}
	if p.grantMs > 0 {
		return []string{p.channel, GrantChannel(p.namespace, p.clientID)}
	}
	return []string{p.channel}
}

// TrackingChannels are the channels a tracking connection's target
// subscribes to: the invalidations, and the registry's forced unlocks,
// which forceunlock.lua publishes there before the DEL that invalidates
// the key, so that the target reads the cause first.
func (p *Peer) TrackingChannels() []string {
	return []string{InvalidationChannel, ForcedChannel(p.namespace, p.clientID)}
}

// SetIfFree is the plain SET NX PX that takes a free key, the least Redis
// can do for it: read its reply with ReadSetIfFree. An acquisition's first
// attempt on a key that looks free sends it rather than obtain.lua.
func (p *Peer) SetIfFree(k Keys) Call {
	return Call{Args: []any{"set", k.Lock(), p.clientIDArg, "px", p.leaseArg, "nx"}}
}

// Obtain is obtain.lua: it takes the key if it is free or this registry's
// already; else, if wait is set, it marks the registry as waiting. marked
// says that an earlier attempt marked it, which a success withdraws. Read
// its reply with ReadObtain.
func (p *Peer) Obtain(k Keys, wait, marked bool) Call {
	return Call{Script: p.scripts.obtain, Keys: k.all(), Args: p.obtain[b2i(wait)][b2i(marked)]}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Release is what a release.lua call sends besides the registry's own.
type Release struct {
	// Full sends every argument. Without it release.lua gets the client id
	// alone: an uncontended release then costs Redis about as much as the
	// minimal owner-checked GET and DEL; one that finds a waiter changes
	// nothing and answers NeedsArguments. HandedOut and GiveBack imply it.
	Full bool
	// HandedOut is the last fencing token handed out locally, or 0: the
	// stored token must not fall behind it.
	HandedOut int64
	// GiveBack is the token of a grant to this registry that nobody here
	// took, to give back, or 0. The key's last token must still be that
	// one and its time to live within the grant lease, or the release
	// spares the key (a hold of this registry took it since).
	GiveBack int64
	// MarkNext marks this registry as waiting in a release that grants
	// the key, for a goroutine of its own that waits behind the release.
	// It goes only with every argument (Full): a release that finds a
	// waiter without them is sent again with them.
	MarkNext bool
}

// Release is release.lua for the lock key of k, whose key in its registry
// is key: it deletes the key if it is this registry's, or grants it to the
// registry that has waited longest. Read its reply with ReadRelease.
func (p *Peer) Release(k Keys, key string, o Release) Call {
	if !(o.Full || o.HandedOut != 0 || o.GiveBack != 0) {
		return Call{Script: p.scripts.release, Keys: k.lockAndMarker(), Args: p.ownerOnly}
	}
	c := Call{Script: p.scripts.release, Keys: k.all()}
	c.Args = []any{p.clientIDArg, o.HandedOut, p.leaseArg, p.channelArg, key}
	switch {
	case o.GiveBack != 0:
		c.Args = append(c.Args, strconv.FormatInt(o.GiveBack, 10)+":"+strconv.FormatInt(p.grantMs, 10))
	case o.MarkNext:
		c.Args = append(c.Args, "", p.mark, p.markMs)
	}
	return c
}

// RaiseFence is raisefence.lua, on the fence of k alone: it raises the
// stored token to handedOut, the last token a hold handed out locally, if
// it is behind. A release whose call on every key Redis refuses while the
// key's slot migrates (SlotMigrating) makes it before its call on the lock
// key alone (Call.OnLockKeyOnly), which cannot reach the fence.
func (p *Peer) RaiseFence(k Keys, handedOut int64) Call {
	return Call{Script: p.scripts.raiseFence, Keys: []string{k.Fence()}, Args: []any{handedOut, p.leaseArg}}
}

// Renew is renew.lua: it extends the lease of each of lockKeys (one slot's
// on Redis Cluster) that is still this registry's. Read its reply with
// ReadRenew.
func (p *Peer) Renew(lockKeys []string) Call {
	return Call{Script: p.scripts.renew, Keys: lockKeys, Args: p.ownerAndLease}
}

// RenewFor is Renew of one key with a lease of its own, at least a
// millisecond: a hold whose lease is fixed (renewal off, or past
// WithMaxHold) has its key's time to live set to what is left of it.
func (p *Peer) RenewFor(lockKey string, lease time.Duration) Call {
	return Call{Script: p.scripts.renew, Keys: []string{lockKey}, Args: []any{p.clientIDArg, max(lease.Milliseconds(), 1)}}
}

// RenewTracked is Renew for a call on the registry's tracking connection
// of the keys' server: the script reads the keys it renewed again, which
// tracks them again. Read its reply with ReadRenew.
func (p *Peer) RenewTracked(lockKeys []string) Call {
	return Call{Script: p.scripts.renew, Keys: lockKeys, Args: p.renewTracked}
}

// RenewOne renews one key natively where the server has SET ... IFEQ
// (Valkey 8.1, Redis 8.4): it sets the key again to the client id with the
// lease only if it holds the client id, which is renew.lua's rule for one
// key, in a command about four times cheaper for the server
// (docs/BENCHMARKS.md, Native commands). A key that is gone stays gone.
// Read its reply with ReadRenewOne.
func (p *Peer) RenewOne(lockKey string) Call {
	return Call{Args: []any{"set", lockKey, p.clientIDArg, "ifeq", p.clientIDArg, "px", p.leaseArg}}
}

// DrawToken is token.lua: it draws the hold's fencing token if the key is
// still this registry's. Read its reply with ReadToken.
func (p *Peer) DrawToken(k Keys) Call {
	return Call{Script: p.scripts.token, Keys: k.lockAndFence(), Args: p.ownerAndLease}
}

// Withdraw are the calls that withdraw the registry's mark on k, so that
// releases stop granting it the key.
func (p *Peer) Withdraw(k Keys) []*Call {
	return []*Call{
		{Args: []any{"zrem", k.Marker(), p.mark}},
		{Args: []any{"zrem", k.Queue(), p.mark}},
	}
}

// LastToken reads the key's last fencing token: read its reply with
// ReadToken (redis.Nil: none is stored).
func (p *Peer) LastToken(k Keys) *Call { return &Call{Args: []any{"get", k.Fence()}} }

// CheckOwner reads who holds lockKey: read its reply with ReadOwner.
func (p *Peer) CheckOwner(lockKey string) *Call { return &Call{Args: []any{"get", lockKey}} }

// ForceUnlock is forceunlock.lua for key, whose lock keys are k: it
// deletes the key whoever holds it, or only if the registry of client id
// only does (unless only is ""), raising the fence margin past the last
// token and the clock, for at least fenceTTL, tells the holder and wakes
// the waiters. Read its reply with ReadForceUnlock.
func (p *Peer) ForceUnlock(k Keys, key string, margin int64, fenceTTL time.Duration, only string) Call {
	return Call{Script: p.scripts.forceUnlock, Keys: k.lockAndFence(), Args: []any{ReleaseChannel(p.namespace), key, margin, fenceTTL.Milliseconds(), p.namespace + forcedInfix, only}}
}

// ForceUnlockFence is forceunlock.lua on the fence of k alone: it raises
// the fence as ForceUnlock does, and frees nothing. A forced unlock whose
// call on every key Redis refuses while the key's slot migrates
// (SlotMigrating) makes it before its call on the lock key alone
// (Call.OnLockKeyOnly), which cannot reach the fence.
func (p *Peer) ForceUnlockFence(k Keys, margin int64, fenceTTL time.Duration) Call {
	return Call{Script: p.scripts.forceUnlock, Keys: []string{k.Fence()}, Args: []any{"", "", margin, fenceTTL.Milliseconds(), "", "", "1"}}
}

// RefreshOwner are the calls that write the registry's owner hash and set
// its time to live.
func (p *Peer) RefreshOwner() []*Call {
	return []*Call{
		{Args: p.ownerFields},
		{Args: []any{"pexpire", p.ownerKey, p.ownerTTLms}},
	}
}
