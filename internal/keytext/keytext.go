// Package keytext prints a lock's key for a person: lockreg's errors and
// logs, and lockctl, cut long keys the same way.
package keytext

import (
	"fmt"
	"unicode/utf8"
)

// Max is how many bytes of a key are printed: a longer key is cut, so that
// a huge key does not make a huge error or log line.
const Max = 200

// Short returns key, or, if it is longer than Max bytes, at most its first
// Max bytes, followed by its length. The cut falls between two characters,
// so that the text of a UTF-8 key stays valid UTF-8.
func Short(key string) string {
	if len(key) <= Max {
		return key
	}
	cut := Max
	// A character is at most 4 bytes: at most 3 of them are continuation
	// bytes to back off. A binary key's stray continuation bytes stop the
	// backing off there.
	for back := 0; back < utf8.UTFMax-1 && cut > 0 && !utf8.RuneStart(key[cut]); back++ {
		cut--
	}
	return fmt.Sprintf("%s… (%d bytes)", key[:cut], len(key))
}
