package protocol

import (
	"errors"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// A registry learns at once that a held key changed through Redis's
// server-assisted client-side caching (CLIENT TRACKING), in its default
// mode: Redis remembers which keys a tracking connection read, and when
// one of them changes (a write of any client, an expiry, an eviction, a
// flush) sends that connection's redirect target one invalidation,
// forgetting the key until it is read again. A registry keeps, per server,
// a connection subscribed to InvalidationChannel (the target, speaking
// RESP2, where invalidations arrive as messages on that channel) and a
// tracking connection that redirects to it and reads each held key once:
// Arm. An invalidation names keys that changed; the registry reads them
// again on the tracking connection, which tells whether the key is still
// its own and, by the same read, tracks it again.

// InvalidationChannel is where Redis sends the invalidations of a
// tracking connection that redirects to a RESP2 connection.
const InvalidationChannel = "__redis__:invalidate"

// ClientIDArgs asks Redis for the connection's id, which a tracking
// connection redirects to.
var ClientIDArgs = []any{"client", "id"}

// TrackingArgs turns tracking on for the connection that sends them,
// redirecting the invalidations to the connection of id. NOLOOP spares
// it the invalidations of its own writes.
func TrackingArgs(redirectTo int64) []any {
	return []any{"client", "tracking", "on", "redirect", strconv.FormatInt(redirectTo, 10), "noloop"}
}

// TargetGone reports whether CLIENT TRACKING was refused because the
// connection it redirects to is gone: it is reconnecting (a restart, a
// killed connection), and tracking can go on once it is back.
func TargetGone(err error) bool {
	return replyStarts(err, "ERR The client ID you want redirect to does not exist")
}

// TargetProbe is published by a new tracking connection on the registry's
// forced-unlock channel, which only its targets subscribe to: its reply,
// the number of subscribers that heard it on that server, is 0 if the
// target is on another server, where the id redirected to is not the
// target's. Its payload, "p", is a note of no kind a registry knows, and
// so ignored.
func (p *Peer) TargetProbe() []any {
	return []any{"publish", ForcedChannel(p.namespace, p.clientID), "p"}
}

// Arm reads lockKey on the tracking connection, so that Redis tracks it
// from now on: read its reply with ReadOwner.
func (p *Peer) Arm(lockKey string) *Call { return p.CheckOwner(lockKey) }

// ReadInvalidation reads an invalidation message: the keys that changed.
// A flush (FLUSHALL, FLUSHDB) invalidates every key with one message
// whose payload is null, which go-redis reports as an error of the
// subscription's read instead: see FlushedAll.
func ReadInvalidation(msg *redis.Message) (keys []string, ok bool) {
	if msg.Channel != InvalidationChannel {
		return nil, false
	}
	if msg.PayloadSlice != nil {
		return msg.PayloadSlice, true
	}
	return []string{msg.Payload}, true
}

// FlushedAll reports whether an error of a read of the invalidation
// subscription is the null invalidation of a flush: go-redis v9 cannot
// read a message whose payload is null, and says so with this error,
// after reading the whole message (the connection stays in step).
func FlushedAll(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "redis: unsupported pubsub message payload: <nil>")
}

// Eviction is what a server's INFO memory says of its eviction policy.
type Eviction struct {
	Policy   string // maxmemory-policy
	MaxBytes int64  // maxmemory, 0 for none
}

// Evicts reports whether the server may evict lock keys: with a memory
// limit, every policy but noeviction evicts keys with a time to live, as
// lock keys are (the volatile-* policies), or any key (allkeys-*).
func (e Eviction) Evicts() bool { return e.MaxBytes > 0 && e.Policy != "noeviction" }

// ReadEviction reads the eviction policy from INFO memory's reply.
func ReadEviction(info string) (Eviction, error) {
	var e Eviction
	var found int
	for line := range strings.SplitSeq(info, "\n") {
		name, value, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch name {
		case "maxmemory_policy":
			e.Policy = value
			found++
		case "maxmemory":
			n, err := strconv.ParseInt(value, 10, 64)
			if err != nil {
				return Eviction{}, errors.New("INFO memory: maxmemory is not a number")
			}
			e.MaxBytes = n
			found++
		}
	}
	if found < 2 {
		return Eviction{}, errors.New("INFO memory names no maxmemory and maxmemory_policy")
	}
	return e, nil
}

// RenewsNatively reports whether a server, by its INFO server reply, has
// SET ... IFEQ for RenewOne: Valkey 8.1 or later, Redis 8.4 or later.
func RenewsNatively(info string) bool {
	fields := map[string]string{}
	for line := range strings.SplitSeq(info, "\n") {
		if name, value, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			fields[name] = value
		}
	}
	if v, ok := fields["valkey_version"]; ok {
		return atLeast(v, 8, 1)
	}
	return fields["server_name"] != "valkey" && atLeast(fields["redis_version"], 8, 4)
}

// atLeast reports whether version, "major.minor.patch", is at least
// major.minor.
func atLeast(version string, major, minor int) bool {
	parts := strings.SplitN(version, ".", 3)
	if len(parts) < 2 {
		return false
	}
	ma, err1 := strconv.Atoi(parts[0])
	mi, err2 := strconv.Atoi(parts[1])
	return err1 == nil && err2 == nil && (ma > major || ma == major && mi >= minor)
}

// EvictedKeys reads evicted_keys from INFO stats' reply, or -1.
func EvictedKeys(info string) int64 {
	for line := range strings.SplitSeq(info, "\n") {
		if value, ok := strings.CutPrefix(strings.TrimSpace(line), "evicted_keys:"); ok {
			if n, err := strconv.ParseInt(value, 10, 64); err == nil {
				return n
			}
		}
	}
	return -1
}
