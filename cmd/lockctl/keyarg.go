package main

import (
	"strconv"
	"strings"
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
