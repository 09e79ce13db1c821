// Package redact hides the password of a Redis URL in what lockreg's tools
// print: lockctl's errors and the test kit's failures.
package redact

import "strings"

// URL returns address with the password of its user info, if it has one,
// shown as "xxxxx". address need not parse as a URL: a password that is
// not percent-encoded, which often makes it not parse, is hidden all the
// same.
func URL(address string) string {
	start, at := UserInfo(address)
	if at < 0 {
		return address
	}
	user, _, hasPassword := strings.Cut(address[start:at], ":")
	if !hasPassword {
		return address
	}
	return address[:start] + user + ":xxxxx" + address[at:]
}

// HasPassword reports whether the user info of address has a password.
func HasPassword(address string) bool {
	start, at := UserInfo(address)
	return at >= 0 && strings.Contains(address[start:at], ":")
}

// UserInfo is where the user info of address starts, and where its '@' is
// (-1 if it has none). A generated password often holds '/', '?' or '#'
// unescaped, which ends a URL's host part before the '@': the last '@' of
// the address ends the user info then, if a host follows it, else the
// password would show whole.
func UserInfo(address string) (start, at int) {
	if n := strings.Index(address, "://"); n >= 0 {
		start = n + len("://")
	}
	rest := address[start:]
	end := len(rest)
	if n := strings.IndexAny(rest, "/?#"); n >= 0 {
		end = n
	}
	at = strings.LastIndex(rest[:end], "@")
	if last := strings.LastIndex(rest, "@"); at < 0 && last >= 0 && last+1 < len(rest) && !strings.ContainsRune("/?#", rune(rest[last+1])) {
		at = last
	}
	if at < 0 {
		return start, -1
	}
	return start, start + at
}
