package protocol

import (
	"errors"
	"strconv"
	"strings"
)

// Note is a notification, published by the scripts on a namespace's
// channels (see Channels):
//
//   - a wake-up, 'w<key>', from release.lua, for every registry's waiter of
//     key, and from forceunlock.lua;
//   - a grant, 'g<token>:<client id>:<key>', from release.lua, of key to
//     the registry of that client id, with that fencing token;
//   - a forced unlock, 'f<client id>:<key>', from forceunlock.lua, telling
//     that registry that its hold of key was forced open.
type Note struct {
	Kind     NoteKind
	Key      string
	ClientID string // the registry a grant or a forced unlock is for
	Token    int64  // a grant's token
}

// errMalformedNote: a note of a known kind that no script writes. The
// registry ignores it: a grant's key then expires after its short lease.
var errMalformedNote = errors.New("malformed note")

// NoteKind is what a notification says.
type NoteKind uint8

const (
	WakeNote NoteKind = iota
	GrantNote
	ForcedNote
)

var noteKinds = [...]string{"wake-up", "grant", "forced unlock"}

func (k NoteKind) String() string { return name(noteKinds[:], int(k), "note kind") }

// ParseNote reads a notification. known is false for a kind it does not
// know (another version's), which the registry ignores; err
// (errMalformedNote) is set for a note of a known kind that no script
// writes, whose note names what it could read. It accepts exactly what
// the scripts write: a key is never empty (Obtain and ForceUnlock refuse
// one), a grantee never either, a holder only for a lock key of another
// type ('f:<key>'), and a token is digits without a sign or a leading
// zero, as drawtoken.lua writes it.
func ParseNote(payload string) (n Note, known bool, err error) {
	switch {
	case strings.HasPrefix(payload, "w"):
		n = Note{Kind: WakeNote, Key: payload[1:]}
		if n.Key == "" {
			return n, true, errMalformedNote
		}
		return n, true, nil
	case strings.HasPrefix(payload, "f"):
		n.Kind = ForcedNote
		var named bool
		n.ClientID, n.Key, named = strings.Cut(payload[1:], ":")
		if !named || n.Key == "" {
			return n, true, errMalformedNote
		}
		return n, true, nil
	case strings.HasPrefix(payload, "g"):
		n.Kind = GrantNote
		tokenText, rest, _ := strings.Cut(payload[1:], ":")
		var named bool
		n.ClientID, n.Key, named = strings.Cut(rest, ":")
		// release.lua always names the grantee and a key, never empty: a
		// grant without one names no lock, and would be taken, or given
		// back, as key "" (whose lock keys span slots on Cluster).
		// ParseInt alone takes "+42" and "042" too, which no script writes.
		n.Token, err = strconv.ParseInt(tokenText, 10, 64)
		if err != nil || n.Token <= 0 || tokenText[0] == '+' || tokenText[0] == '0' || !named || n.ClientID == "" || n.Key == "" {
			return Note{Kind: GrantNote, Key: n.Key, ClientID: n.ClientID}, true, errMalformedNote
		}
		return n, true, nil
	}
	return Note{}, false, nil
}
