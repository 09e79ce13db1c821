package protocol

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// errConn stands for a real failure: a connection's, or a script's.
var errConn = errors.New("connection reset")

// reply is a Cmd as go-redis leaves it: a value, or an error.
func reply(val any, err error) *redis.Cmd {
	cmd := redis.NewCmd(context.Background())
	if err != nil {
		cmd.SetErr(err)
	} else {
		cmd.SetVal(val)
	}
	return cmd
}

// replyCase is a reply and what a reader must make of it; a case with
// wantErr wants an error and ignores want.
type replyCase[T any] struct {
	name    string
	cmd     *redis.Cmd
	want    T
	wantErr bool
}

// checkReplies runs read on each case.
func checkReplies[T any](t *testing.T, read func(*redis.Cmd) (T, error), cases []replyCase[T]) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := read(c.cmd)
			if c.wantErr {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, c.want, got)
		})
	}
}

func TestReadSetIfFree(t *testing.T) {
	checkReplies(t, ReadSetIfFree, []replyCase[bool]{
		{name: "taken", cmd: reply("OK", nil), want: true},
		{name: "held by another, no error", cmd: reply(nil, redis.Nil), want: false},
		{name: "a real error", cmd: reply(nil, errConn), wantErr: true},
	})
}

func TestReadObtain(t *testing.T) {
	checkReplies(t, ReadObtain, []replyCase[ObtainReply]{
		{name: "held", cmd: reply(int64(1), nil), want: ObtainReply{Held: true}},
		{name: "marked, with the last token", cmd: reply(int64(-42), nil), want: ObtainReply{LastToken: 42}},
		{name: "not marked", cmd: reply(int64(0), nil), want: ObtainReply{}},
		{name: "a real error", cmd: reply(nil, errConn), wantErr: true},
		{name: "not an integer", cmd: reply("x", nil), wantErr: true},
		// obtain.lua replies 1, 0 or a negative token: anything else must
		// not pass for a failed attempt with a token below zero.
		{name: "an unknown reply", cmd: reply(int64(2), nil), wantErr: true},
		{name: "a far unknown reply", cmd: reply(int64(1_700_000_000_000_000), nil), wantErr: true},
	})
}

func TestReadRelease(t *testing.T) {
	checkReplies(t, ReadRelease, []replyCase[ReleaseReply]{
		{name: "not ours", cmd: reply(int64(0), nil), want: ReleaseReply{Outcome: NotOurs}},
		{name: "deleted", cmd: reply(int64(1), nil), want: ReleaseReply{Outcome: Deleted}},
		{name: "deleted while waited for", cmd: reply(int64(2), nil), want: ReleaseReply{Outcome: DeletedWaited}},
		{name: "granted", cmd: reply(int64(3), nil), want: ReleaseReply{Outcome: Granted}},
		{name: "needs arguments", cmd: reply(int64(4), nil), want: ReleaseReply{Outcome: NeedsArguments}},
		{name: "granted and marked", cmd: reply(int64(-7), nil), want: ReleaseReply{Outcome: Granted, MarkToken: 7}},
		// Another version's outcome must not pass for one of ours.
		{name: "an unknown outcome", cmd: reply(int64(5), nil), wantErr: true},
		{name: "a far unknown outcome", cmd: reply(int64(200), nil), wantErr: true},
		// Minus a token of 2^63 (a fence written by hand, raised by a
		// grant) has no int64 opposite: it must not pass for a negative
		// mark token, which every grant's token would exceed.
		{name: "no token's opposite", cmd: reply(int64(math.MinInt64), nil), wantErr: true},
		{name: "no token's opposite, as text", cmd: reply("-9223372036854775808", nil), wantErr: true},
		{name: "a real error", cmd: reply(nil, errConn), wantErr: true},
		// A note to the waiters that Redis refused, once the key was
		// released: the release is done, and says so.
		{name: "woken, the note refused", cmd: reply([]any{int64(2), "NOPERM x"}, nil),
			want: ReleaseReply{Outcome: DeletedWaited, NoteRefused: "NOPERM x"}},
		{name: "granted and marked, the note refused", cmd: reply([]any{"-7", "NOPERM x"}, nil),
			want: ReleaseReply{Outcome: Granted, MarkToken: 7, NoteRefused: "NOPERM x"}},
		{name: "an unknown outcome, the note refused", cmd: reply([]any{int64(9), "NOPERM x"}, nil), wantErr: true},
		{name: "a refusal that is no text", cmd: reply([]any{int64(2), int64(1)}, nil), wantErr: true},
		{name: "no refusal", cmd: reply([]any{int64(2)}, nil), wantErr: true},
		{name: "an empty array", cmd: reply([]any{}, nil), wantErr: true},
	})
}

func TestReadRenew(t *testing.T) {
	checkReplies(t, ReadRenew, []replyCase[[]OwnerState]{
		{name: "per key", cmd: reply([]any{int64(1), int64(0), int64(2), int64(1)}, nil), want: []OwnerState{Ours, Gone, Other, Ours}},
		{name: "no keys", cmd: reply([]any{}, nil), want: []OwnerState{}},
		// Another version's reply must not pass for one of ours.
		{name: "an unknown reply", cmd: reply([]any{int64(1), int64(3)}, nil), wantErr: true},
		{name: "a real error", cmd: reply(nil, errConn), wantErr: true},
	})
}

func TestReadToken(t *testing.T) {
	checkReplies(t, ReadToken, []replyCase[int64]{
		{name: "a token", cmd: reply(int64(1_700_000_000_000_001), nil), want: 1_700_000_000_000_001},
		{name: "not ours", cmd: reply(int64(0), nil), want: 0},
		{name: "a real error", cmd: reply(nil, errConn), wantErr: true},
	})
}

// token.lua replies -1 alone of the negatives (its slot migrates), and
// text only for a token beyond 2^53, as drawtoken.lua writes it: digits
// without a sign or a leading zero. Anything else is no token, nor a slot
// that moves, after which the caller would draw again.
func TestReadTokenRefusesWhatTokenLuaNeverReplies(t *testing.T) {
	_, err := ReadToken(reply(int64(-1), nil))
	require.ErrorIs(t, err, ErrFenceMoving)
	n, err := ReadToken(reply("9007199254740993", nil))
	require.NoError(t, err)
	require.Equal(t, int64(9007199254740993), n)
	for _, val := range []any{int64(-2), int64(math.MinInt64), "-1", "-5", "+42", "042", "0"} {
		_, err := ReadToken(reply(val, nil))
		require.Error(t, err, val)
		require.NotErrorIs(t, err, ErrFenceMoving, val)
	}
}

func TestReadOwner(t *testing.T) {
	p := NewPeer(nil, Config{Namespace: "ns", ClientID: "ours"})
	readOwner := func(cmd *redis.Cmd) (OwnerState, error) { return p.ReadOwner(&Call{Cmd: cmd}) }
	checkReplies(t, readOwner, []replyCase[OwnerState]{
		{name: "ours", cmd: reply("ours", nil), want: Ours},
		{name: "another's", cmd: reply("theirs", nil), want: Other},
		{name: "gone, no error", cmd: reply(nil, redis.Nil), want: Gone},
		{name: "a hash or a list: another's", cmd: reply(nil, serverReply("WRONGTYPE Operation against a key holding the wrong kind of value")), want: Other},
		{name: "a real error", cmd: reply(nil, errConn), wantErr: true},
	})
}

func TestReadForceUnlock(t *testing.T) {
	type found struct {
		holder string
		held   bool
	}
	read := func(cmd *redis.Cmd) (found, error) {
		holder, held, err := ReadForceUnlock(cmd)
		return found{holder, held}, err
	}
	checkReplies(t, read, []replyCase[found]{
		{name: "held", cmd: reply("their id", nil), want: found{"their id", true}},
		{name: "not held", cmd: reply(nil, redis.Nil), want: found{}},
		{name: "a real error", cmd: reply(nil, errConn), wantErr: true},
	})
}

// String methods name every value the protocol knows, and describe the
// rest rather than panic: another version may send one.
func TestStringsNameEveryKnownValue(t *testing.T) {
	outcomes := map[ReleaseOutcome]string{
		NotOurs: "not ours", Deleted: "deleted", DeletedWaited: "deleted while waited for",
		Granted: "granted", NeedsArguments: "needs all arguments",
		ReleaseOutcome(200): "release outcome 200",
	}
	for o, want := range outcomes {
		assert.Equal(t, want, o.String())
	}
	kinds := map[NoteKind]string{
		WakeNote: "wake-up", GrantNote: "grant", ForcedNote: "forced unlock",
		NoteKind(200): "note kind 200",
	}
	for k, want := range kinds {
		assert.Equal(t, want, k.String())
	}
}
