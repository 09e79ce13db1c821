package lockreg

import (
	"fmt"
	"strings"
)

// lockKeys are a lock's keys in Redis. The lock itself is
// <registryKey>:{<key>}; the others extend it, and so share its hash tag
// and Cluster slot. The key's braces and '%' are escaped (as %7B, %7D,
// %25), so that the part in braces is exactly the key: no key can end the
// tag early, and no two (registryKey, key) pairs share a Redis key. Keys
// without them, the usual case, appear as they are.
type lockKeys struct {
	lock   string // the owner's client id, with the lease as its time to live
	fence  string // the last fencing token drawn (<lock>:fence)
	marker string // the waiting registries' marks, scored by when each lapses (<lock>:waiting)
	queue  string // the same registries, scored by when each began to wait (<lock>:queue)
	// script is the four, in the order the scripts take them (scripts.go).
	script []string
}

func newLockKeys(registryKey, key string) lockKeys {
	if strings.ContainsAny(key, "{}%") {
		key = keyEscaper.Replace(key)
	}
	lock := registryKey + ":{" + key + "}"
	k := lockKeys{lock: lock, fence: lock + ":fence", marker: lock + ":waiting", queue: lock + ":queue"}
	k.script = scriptKeys(k)
	return k
}

var keyEscaper = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")

// checkRegistryKey refuses the registryKeys whose locks' keys would not
// share a Cluster slot. A hash tag in the registryKey is fine (it puts all
// of the registry's locks in one slot), but an empty one, "{}", makes Redis
// hash each whole key instead.
func checkRegistryKey(registryKey string) error {
	if registryKey == "" {
		return fmt.Errorf("%w: registryKey is empty", ErrInvalidOption)
	}
	if open := strings.IndexByte(registryKey, '{'); open >= 0 && strings.HasPrefix(registryKey[open+1:], "}") {
		return fmt.Errorf("%w: registryKey %q starts a Cluster hash tag with \"{}\", which would split a lock's keys across slots", ErrInvalidOption, registryKey)
	}
	return nil
}

// clusterSlot is key's Redis Cluster hash slot: CRC16 (XMODEM) of its hash
// tag, or of the whole key if it has none, modulo 16384.
func clusterSlot(key string) int {
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
