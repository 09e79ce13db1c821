package lockreg

import (
	_ "embed"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// This file is the wire protocol's one home in Go: the Lua scripts, the
// order of their KEYS and ARGV, what their replies mean, the waiting mark,
// the channels and the notifications. docs/PROTOCOL.md describes it.
// Registries of every version of a namespace share it: changing a key,
// an argument's meaning, the mark or a payload breaks a rolling deploy.

var (
	//go:embed drawtoken.lua
	drawTokenLua string
	//go:embed markwaiting.lua
	markWaitingLua string
	//go:embed obtain.lua
	obtainLua string
	//go:embed release.lua
	releaseLua string
	//go:embed token.lua
	tokenLua string
	//go:embed renew.lua
	renewLua string
	//go:embed forceunlock.lua
	forceUnlockLua string

	// Script.Run sends EVALSHA and falls back to EVAL on NOSCRIPT, so a
	// restarted Redis costs one extra round trip, once. The libraries go
	// before the scripts that use them.
	obtainScript  = redis.NewScript(drawTokenLua + markWaitingLua + obtainLua)
	releaseScript = redis.NewScript(drawTokenLua + markWaitingLua + releaseLua)
	tokenScript   = redis.NewScript(drawTokenLua + tokenLua)
	renewScript   = redis.NewScript(renewLua)
	// forceUnlockScript is the operators' (Registry.ForceUnlock).
	forceUnlockScript = redis.NewScript(forceUnlockLua)
)

// scriptKeys are a lock's keys as obtain.lua and release.lua take them.
func scriptKeys(k lockKeys) []string { return []string{k.lock, k.fence, k.marker, k.queue} }

// lockAndFence are token.lua's and forceunlock.lua's keys.
func lockAndFence(k lockKeys) []string { return k.script[:2] }

// lockKeyOnly are the keys of a script run on the lock's key alone, as the
// scripts are while its slot migrates between Cluster nodes.
func lockKeyOnly(keys []string) []string { return keys[:1] }

// scriptArgs are the arguments a registry sends, made once: boxing a
// string into an argument costs an allocation per call, and go-redis
// copies what it is given.
type scriptArgs struct {
	clientID, lease, channel any
	// obtain are obtain.lua's, by whether the attempt will wait (it then
	// marks the registry if it fails) and whether an earlier one marked
	// it (a success withdraws the mark).
	obtain [2][2][]any
	// ownerAndLease are token.lua's and renew.lua's; ownerOnly,
	// release.lua's when nobody is expected to wait.
	ownerAndLease, ownerOnly []any
	// mark is the registry's waiting mark: its client id, and if it takes
	// grants, ':<grant lease in ms>'. markMs is how long a mark lasts:
	// two retry intervals, so that a polling waiter keeps it alive.
	mark, markMs string
}

func newScriptArgs(clientID string, lease, retryInterval, grantLease time.Duration, channel string) scriptArgs {
	a := scriptArgs{clientID: clientID, lease: strconv.FormatInt(lease.Milliseconds(), 10), channel: channel}
	a.mark = clientID
	if grantLease > 0 {
		a.mark += ":" + strconv.FormatInt(grantLease.Milliseconds(), 10)
	}
	a.markMs = strconv.FormatInt(max(2*retryInterval.Milliseconds(), 2), 10)
	// An attempt that will not wait (TryLock's) leaves no mark: nobody
	// would answer a wake-up, and its mark, served first, would cost a
	// real waiter its grant.
	markMs := [2]string{"0", a.markMs}
	marks := [2]string{clientID, a.mark}
	for wait := range 2 {
		for marked, wasMarked := range []string{"0", "1"} {
			a.obtain[wait][marked] = []any{a.clientID, a.lease, markMs[wait], wasMarked, marks[wait]}
		}
	}
	a.ownerAndLease = []any{a.clientID, a.lease}
	a.ownerOnly = []any{a.clientID}
	return a
}

// obtainArgs are obtain.lua's arguments.
func (a *scriptArgs) obtainArgs(wait, marked bool) []any {
	return a.obtain[b2i(wait)][b2i(marked)]
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// setIfFreeArgs are the plain SET NX PX that takes a free key, the least
// Redis can do for it; it answers as obtain.lua does when it takes it.
func (a *scriptArgs) setIfFreeArgs(lockKey string) []any {
	return []any{"set", lockKey, a.clientID, "px", a.lease, "nx"}
}

// releaseArgs are release.lua's arguments when it may need all of them:
// handedOutToken is the last token handed out locally, or 0; key is the
// lock's key in its registry; giveBack is a grant to give back (see
// giveBackArg), or ""; with markNext, a grant the release makes marks this
// registry as waiting.
func (a *scriptArgs) releaseArgs(handedOutToken int64, key, giveBack string, markNext bool) []any {
	args := []any{a.clientID, handedOutToken, a.lease, a.channel, key}
	switch {
	case giveBack != "":
		args = append(args, giveBack)
	case markNext:
		args = append(args, "", a.mark, a.markMs)
	}
	return args
}

// forceUnlockArgs are forceunlock.lua's arguments: margin is how far past
// the last token and the clock the fence goes, fenceTTL the least time to
// live of the raised fence.
func forceUnlockArgs(channel, key string, margin int64, fenceTTL time.Duration) []any {
	return []any{channel, key, margin, fenceTTL.Milliseconds()}
}

// giveBackArg is release.lua's giveBack: the grant's token and lease.
func giveBackArg(token int64, grantLease time.Duration) string {
	return strconv.FormatInt(token, 10) + ":" + strconv.FormatInt(grantLease.Milliseconds(), 10)
}

// obtainReply is what an attempt found: obtain.lua's reply, or the plain
// SET's.
type obtainReply struct {
	held bool // the registry holds the key now
	// lastToken is the key's last token when the attempt failed and
	// marked the registry as waiting, else 0: a grant that answers the
	// mark carries a larger one (see grant.go).
	lastToken int64
}

func parseObtainReply(n int64) obtainReply {
	if n == 1 {
		return obtainReply{held: true}
	}
	return obtainReply{lastToken: -n}
}

// releaseOutcome is what release.lua did.
type releaseOutcome uint8

const (
	notOurs        releaseOutcome = iota // the key had expired or has another owner, who keeps it
	deleted                              // deleted; no other registry waits
	deletedWaited                        // deleted, and waiting registries woken
	granted                              // granted to the registry that has waited longest
	needsArguments                       // nothing done: a registry waits, and only the client id was sent
)

func (o releaseOutcome) String() string {
	return [...]string{"not ours", "deleted", "deleted while waited for", "granted", "needs all arguments"}[o]
}

// releaseReply is release.lua's reply.
type releaseReply struct {
	outcome releaseOutcome
	// markToken, when the release granted the key and marked this
	// registry as waiting (markNext), is the grant's token: the mark's
	// last token, as a failed attempt's would be.
	markToken int64
}

func parseReleaseReply(n int64) (releaseReply, error) {
	switch {
	case n < 0:
		return releaseReply{outcome: granted, markToken: -n}, nil
	case n <= int64(needsArguments):
		return releaseReply{outcome: releaseOutcome(n)}, nil
	}
	return releaseReply{}, fmt.Errorf("release.lua answered %d", n)
}

// renewed reads renew.lua's reply: whether each key was renewed.
func renewed(cmd *redis.Cmd) ([]bool, error) {
	replies, err := cmd.Int64Slice()
	ok := make([]bool, len(replies))
	for i, n := range replies {
		ok[i] = n == 1
	}
	return ok, err
}

// markOwner is the client id of the registry a mark names.
func markOwner(mark string) string {
	id, _, _ := strings.Cut(mark, ":")
	return id
}

// ownerKey is a registry's owner key, a hash of its name and since when it
// lives (owner.go).
func ownerKey(registryKey, clientID string) string { return registryKey + ":owner:" + clientID }

// Channels: a registryKey's waiters all listen to <registryKey>:released;
// a registry alone to <registryKey>:released:<client id>, its grants.
func releaseChannel(registryKey string) string     { return registryKey + ":released" }
func grantChannel(channel, clientID string) string { return channel + ":" + clientID }

// note is a notification: release.lua's wake-up, 'w<key>', for every
// registry's waiter of key, or grant, 'g<token>:<client id>:<key>', of key
// to the registry of that client id; or forceunlock.lua's
// 'f<client id>:<key>', telling that registry that its hold of key was
// forced open.
type note struct {
	kind    noteKind
	key     string
	grantee string // the client id a grant or a forced unlock is for
	token   int64  // a grant's token
}

type noteKind uint8

const (
	wakeNote noteKind = iota
	grantNote
	forcedNote
)

// parseNote reads a notification; ok is false for a kind it does not
// know (another version's), and err set for a grant it cannot read.
func parseNote(payload string) (n note, ok bool, err error) {
	switch {
	case strings.HasPrefix(payload, "w"):
		return note{kind: wakeNote, key: payload[1:]}, true, nil
	case strings.HasPrefix(payload, "f"):
		n.kind = forcedNote
		n.grantee, n.key, _ = strings.Cut(payload[1:], ":")
		return n, true, nil
	case strings.HasPrefix(payload, "g"):
		n.kind = grantNote
		tokenText, rest, _ := strings.Cut(payload[1:], ":")
		n.grantee, n.key, _ = strings.Cut(rest, ":")
		if n.token, err = strconv.ParseInt(tokenText, 10, 64); err != nil || n.token <= 0 {
			return note{kind: grantNote, key: n.key, grantee: n.grantee}, true, fmt.Errorf("malformed grant %q", payload)
		}
		return n, true, nil
	}
	return note{}, false, nil
}
