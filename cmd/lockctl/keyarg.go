package main

import (
	"regexp"
	"strconv"
	"strings"

	"github.com/lockreg/lockreg/internal/keytext"
)

// keyArgument is the key an argument names: the argument itself, or,
// with -quoted, the string it quotes. A key with a NUL byte cannot be an
// argument (execve's C strings end at NUL); quoted, as list prints it
// (strconv.Quote) or -json does, it can.
func keyArgument(arg string, quoted bool) (string, error) {
	key := arg
	if quoted {
		var err error
		if key, err = strconv.Unquote(arg); err != nil || !strings.HasPrefix(arg, `"`) {
			return "", usageError("-quoted: the key is not a quoted string (%s): write it as list prints it, in double quotes", quoteKey(arg))
		}
	}
	if key == "" {
		return "", usageError("the key is empty")
	}
	return key, nil
}

// cutMark ends a key that keytext.Short cut.
var cutMark = regexp.MustCompile(`… \((\d+) bytes\)$`)

// looksCut says whether key is a key as list prints a long one, cut: an
// operator who copied it from the table names no key.
func looksCut(key string) bool {
	m := cutMark.FindStringSubmatchIndex(key)
	if m == nil {
		return false
	}
	n, err := strconv.Atoi(key[m[2]:m[3]])
	return err == nil && n > keytext.Max && m[0] <= keytext.Max
}
