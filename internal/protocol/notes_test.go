package protocol

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseNote(t *testing.T) {
	for _, c := range []struct {
		name, payload string
		want          Note
		known         bool
		malformed     bool
	}{
		{name: "wake-up", payload: "wk", want: Note{Kind: WakeNote, Key: "k"}, known: true},
		{name: "wake-up of a key with ':'", payload: "wa:b", want: Note{Kind: WakeNote, Key: "a:b"}, known: true},
		{name: "grant", payload: "g42:id:k", want: Note{Kind: GrantNote, Token: 42, ClientID: "id", Key: "k"}, known: true},
		{name: "grant of a key with ':'", payload: "g42:id:a:b", want: Note{Kind: GrantNote, Token: 42, ClientID: "id", Key: "a:b"}, known: true},
		{name: "forced unlock", payload: "fid:k", want: Note{Kind: ForcedNote, ClientID: "id", Key: "k"}, known: true},
		{name: "forced unlock of a key with ':'", payload: "fid:a:b", want: Note{Kind: ForcedNote, ClientID: "id", Key: "a:b"}, known: true},
		// A grant whose token cannot be trusted still names its key, so
		// that its waiter can attempt.
		{name: "grant without a number", payload: "gx:id:k", want: Note{Kind: GrantNote, ClientID: "id", Key: "k"}, known: true, malformed: true},
		{name: "grant of token 0", payload: "g0:id:k", want: Note{Kind: GrantNote, ClientID: "id", Key: "k"}, known: true, malformed: true},
		{name: "grant of a negative token", payload: "g-5:id:k", want: Note{Kind: GrantNote, ClientID: "id", Key: "k"}, known: true, malformed: true},
		// release.lua always names the grantee and a key, which is never
		// empty: a grant without them names no lock to take or give back.
		{name: "grant without a key", payload: "g42:id", want: Note{Kind: GrantNote, ClientID: "id"}, known: true, malformed: true},
		{name: "grant with an empty key", payload: "g42:id:", want: Note{Kind: GrantNote, ClientID: "id"}, known: true, malformed: true},
		{name: "grant without a client id", payload: "g42", want: Note{Kind: GrantNote}, known: true, malformed: true},
		{name: "grant to an empty client id", payload: "g42::k", want: Note{Kind: GrantNote, Key: "k"}, known: true, malformed: true},
		// drawtoken.lua writes a token as '%.0f' does, or as digits without
		// leading zeros: another spelling of a number is no script's.
		{name: "grant of a token with a sign", payload: "g+42:id:k", want: Note{Kind: GrantNote, ClientID: "id", Key: "k"}, known: true, malformed: true},
		{name: "grant of a token with a leading zero", payload: "g042:id:k", want: Note{Kind: GrantNote, ClientID: "id", Key: "k"}, known: true, malformed: true},
		{name: "grant of a token with a space", payload: "g 42:id:k", want: Note{Kind: GrantNote, ClientID: "id", Key: "k"}, known: true, malformed: true},
		// forceunlock.lua always names a key, and the holder, which is ''
		// only for a lock key of another type.
		{name: "forced unlock of a key of another type", payload: "f:k", want: Note{Kind: ForcedNote, Key: "k"}, known: true},
		{name: "forced unlock without a key", payload: "fid", want: Note{Kind: ForcedNote, ClientID: "id"}, known: true, malformed: true},
		{name: "forced unlock with an empty key", payload: "fid:", want: Note{Kind: ForcedNote, ClientID: "id"}, known: true, malformed: true},
		{name: "wake-up without a key", payload: "w", want: Note{Kind: WakeNote}, known: true, malformed: true},
		{name: "another version's kind", payload: "zid:k"},
		{name: "empty", payload: ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			n, known, err := ParseNote(c.payload)
			require.Equal(t, c.known, known)
			require.Equal(t, c.want, n)
			if c.malformed {
				require.ErrorIs(t, err, errMalformedNote)
			} else {
				require.NoError(t, err)
			}
		})
	}
}

// FuzzParseNote checks that no payload makes ParseNote panic, that an
// unknown kind reads as nothing, that a note it reads without error has a
// key, a grant a token to trust, and is the payload the scripts would
// write for it, and that it refuses the rest as malformed.
func FuzzParseNote(f *testing.F) {
	for _, seed := range []string{"", "w", "wk", "g", "g1", "g1:id:k", "g0:id:k", "g-1:id:k", "g9999999999999999999:id:k", "g+1:id:k", "g01:id:k", "f", "fid", "fid:k", "x"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, payload string) {
		n, known, err := ParseNote(payload)
		if !known {
			require.NoError(t, err)
			require.Zero(t, n)
			return
		}
		if err != nil {
			require.ErrorIs(t, err, errMalformedNote)
			return
		}
		// What it reads without error is what a script writes: spelled
		// again, it is the payload.
		require.NotEmpty(t, n.Key, payload)
		switch n.Kind {
		case GrantNote:
			require.Positive(t, n.Token, payload)
			require.Equal(t, payload, "g"+strconv.FormatInt(n.Token, 10)+":"+n.ClientID+":"+n.Key)
		case ForcedNote:
			require.Equal(t, payload, "f"+n.ClientID+":"+n.Key)
		}
	})
}
