package protocol

import (
	"errors"
	"fmt"
	"strings"

	"github.com/lockreg/lockreg/internal/keytext"
)

// Keys are one lock's keys in Redis. The lock itself is
// <namespace>:{<key>}; the others extend it, and so share its hash tag and
// Cluster slot. The key's braces and '%' are escaped (as %7B, %7D, %25),
// so that the part in braces is exactly the key: no key can end the tag
// early, and no two (namespace, key) pairs share a Redis key. Keys without
// them, the usual case, appear as they are.
type Keys struct {
	// marker is the waiting marker's key, <lock>:waiting, whose prefix is
	// the lock's key: a registry keeps this one string for every key it
	// holds, and cuts the lock's key from it. The fence's and the queue's
	// keys are made when a call needs them, which only contended and rarer
	// calls do.
	marker string
}

const (
	fenceSuffix  = ":fence"
	markerSuffix = ":waiting"
	queueSuffix  = ":queue"
)

// LockKeys are the keys of key's lock in namespace.
func LockKeys(namespace, key string) Keys {
	if strings.ContainsAny(key, "{}%") {
		key = keyEscaper.Replace(key)
	}
	return Keys{marker: namespace + ":{" + key + "}" + markerSuffix}
}

// Lock is the lock's key: the owner's client id, with the lease as its
// time to live.
func (k Keys) Lock() string { return k.marker[:max(0, len(k.marker)-len(markerSuffix))] }

// PrintedLock is the lock's key in Redis as errors print it, where the
// scripts name it or a key it begins (a queue of another type, say): a
// key longer than keytext.Max is cut there as keytext.Short cuts it, so
// that a huge key does not make a huge error. ok is false for a key that
// is printed whole.
func (k Keys) PrintedLock(namespace string) (printed string, ok bool) {
	lock := k.Lock()
	escaped := lock[len(namespace)+len(":{") : len(lock)-len("}")]
	if len(escaped) <= keytext.Max {
		return lock, false
	}
	return namespace + ":{" + keytext.Short(escaped) + "}", true
}

// Fence holds the last fencing token drawn.
func (k Keys) Fence() string { return k.Lock() + fenceSuffix }

// Marker holds the waiting registries' marks, scored by when each lapses.
func (k Keys) Marker() string { return k.marker }

// Queue holds the same registries, scored by when each began to wait.
func (k Keys) Queue() string { return k.Lock() + queueSuffix }

// all are the four keys, in the order obtain.lua and release.lua take
// them: the fence and the queue are cut from one new string.
func (k Keys) all() []string {
	lock := k.Lock()
	made := lock + fenceSuffix + lock + queueSuffix
	fence := made[:len(lock)+len(fenceSuffix)]
	return []string{lock, fence, k.marker, made[len(fence):]}
}

// lockAndMarker are an owner-only release's keys (see Peer.Release).
func (k Keys) lockAndMarker() []string { return []string{k.Lock(), k.marker} }

// lockAndFence are token.lua's and forceunlock.lua's keys.
func (k Keys) lockAndFence() []string { return []string{k.Lock(), k.Fence()} }

var (
	keyEscaper   = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")
	keyUnescaper = strings.NewReplacer("%25", "%", "%7B", "{", "%7D", "}")
)

// KeyOf is the key of the namespace's lock whose Redis key is redisKey, if
// it is one: <namespace>:{<escaped key>}, whose braces the key's escaping
// leaves alone (a fence, a mark or another namespace's lock has more after
// the brace, or braces inside it), and whose escapes are LockKeys's own:
// what it returns escapes back to redisKey exactly.
func KeyOf(namespace, redisKey string) (string, bool) {
	escaped, ok := strings.CutPrefix(redisKey, namespace+":{")
	if !ok || !strings.HasSuffix(escaped, "}") {
		return "", false
	}
	escaped = escaped[:len(escaped)-1]
	if escaped == "" || strings.ContainsAny(escaped, "{}") {
		return "", false
	}
	if !strings.Contains(escaped, "%") {
		return escaped, true
	}
	// Only the escapes LockKeys writes: "%7b", a lone '%' or "%41" would
	// read back as a key whose lock key is another, so that an inspector
	// or a tracker would name a lock that is not the one in Redis.
	key := keyUnescaper.Replace(escaped)
	if keyEscaper.Replace(key) != escaped {
		return "", false
	}
	return key, true
}

// LockPattern matches, for SCAN, every Redis key that may be one of the
// namespace's locks; KeyOf picks the locks out of what it finds.
func LockPattern(namespace string) string { return globEscaper.Replace(namespace) + ":{*}" }

// globEscaper escapes a namespace for SCAN's MATCH, which treats these
// characters as patterns.
var globEscaper = strings.NewReplacer(`\`, `\\`, "*", `\*`, "?", `\?`, "[", `\[`, "]", `\]`)

// CheckNamespace refuses an empty namespace, and those whose locks' keys
// would not share a Cluster slot: a hash tag in the namespace is fine (it
// puts all of its locks in one slot), but an empty one, "{}", makes Redis
// hash each whole key instead. Its error completes "namespace ...".
func CheckNamespace(namespace string) error {
	if namespace == "" {
		return errors.New("is empty")
	}
	if open := strings.IndexByte(namespace, '{'); open >= 0 && strings.HasPrefix(namespace[open+1:], "}") {
		// Cut as keys are in errors: a namespace built from input could be huge.
		return fmt.Errorf(`%q starts a Cluster hash tag with "{}", which would split a lock's keys across slots`, keytext.Short(namespace))
	}
	return nil
}

// Slot is key's Redis Cluster hash slot: CRC16 (XMODEM) of its hash tag,
// or of the whole key if it has none, modulo 16384.
func Slot(key string) int {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if n := strings.IndexByte(key[open+1:], '}'); n > 0 {
			key = key[open+1 : open+1+n]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % 16384
}

// OwnerKey is a registry's owner hash, of its name and since when it
// lives (see owner.go).
func OwnerKey(namespace, clientID string) string { return namespace + ownerInfix + clientID }

// OwnerPattern matches, for SCAN, the owner hashes of every namespace;
// NamespaceOf reads the namespace back.
const OwnerPattern = "*" + ownerInfix + "*"

const ownerInfix = ":owner:"

// NamespaceOf is the namespace of an owner hash's Redis key. The client
// id that ends it is a UUID as New draws it: a key of another kind that
// matches OwnerPattern, a lock key whose key holds ":owner:" or an
// application's "project:owner:17" on a shared server, names none.
func NamespaceOf(ownerKey string) (string, bool) {
	i := strings.LastIndex(ownerKey, ownerInfix)
	if i <= 0 || !isClientID(ownerKey[i+len(ownerInfix):]) {
		return "", false
	}
	return ownerKey[:i], true
}

// isClientID says whether id is a UUID in the canonical form New draws:
// 8-4-4-4-12 hex digits.
func isClientID(id string) bool {
	if len(id) != 36 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
				return false
			}
		}
	}
	return true
}

// Channels: a namespace's waiters all listen to <namespace>:released; a
// registry alone to <namespace>:released:<client id>, its grants, and, on
// its tracking connection's target, to <namespace>:forced:<client id>, the
// forced unlocks of its holds.
func ReleaseChannel(namespace string) string { return namespace + ":released" }
func GrantChannel(namespace, clientID string) string {
	return ReleaseChannel(namespace) + ":" + clientID
}
func ForcedChannel(namespace, clientID string) string { return namespace + forcedInfix + clientID }

const forcedInfix = ":forced:"
