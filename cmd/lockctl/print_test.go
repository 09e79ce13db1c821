package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg"
	"github.com/lockreg/lockreg/internal/protocol"
	"github.com/lockreg/lockreg/internal/redistest"
)

func TestFormatTTL(t *testing.T) {
	for _, tc := range []struct {
		ttl  time.Duration
		want string
	}{
		{lockreg.NoExpiry, "no expiry"},
		{0, "0.0s"},
		{40 * time.Millisecond, "0.0s"},
		{1500 * time.Millisecond, "1.5s"},
		{29960 * time.Millisecond, "30.0s"},
		{90 * time.Second, "1m30s"},
		{2*time.Hour + 400*time.Millisecond, "2h0m0s"},
	} {
		require.Equal(t, tc.want, formatTTL(tc.ttl), "%v", tc.ttl)
	}
}

// TestQuoteKeyCutsAsTheLibraryDoes: lockctl prints a key as lockreg's
// errors do, cut to 200 bytes and its length.
func TestQuoteKeyCutsAsTheLibraryDoes(t *testing.T) {
	long := strings.Repeat("k", 300)
	for _, tc := range []struct {
		key, want string
	}{
		{"order-42", `"order-42"`},
		{`a "quoted"` + "\t key", `"a \"quoted\"\t key"`},
		{strings.Repeat("k", 200), `"` + strings.Repeat("k", 200) + `"`},
		{strings.Repeat("k", 201), `"` + strings.Repeat("k", 200) + `… (201 bytes)"`},
		{long, `"` + strings.Repeat("k", 200) + `… (300 bytes)"`},
	} {
		require.Equal(t, tc.want, quoteKey(tc.key))
	}

	// What lockreg prints of the same key (a closed registry refuses it
	// without asking Redis).
	registry, err := lockreg.New(redistest.Shared(t).Client(t), "ns")
	require.NoError(t, err)
	require.NoError(t, registry.Close())
	_, err = registry.Obtain(long).Acquire(context.Background())
	require.ErrorIs(t, err, lockreg.ErrClosed)
	require.Contains(t, err.Error(), quoteKey(long))
}

func TestColumns(t *testing.T) {
	got := columns([][]string{
		{"TTL", "TOKEN", "KEY"},
		{"1.5s", "1795698939101001", `"a"`},
		{"no expiry", "-", `"é…"`},
	}, []bool{true, true, false})
	require.Equal(t, ""+
		"      TTL             TOKEN  KEY\n"+
		"     1.5s  1795698939101001  \"a\"\n"+
		"no expiry                 -  \"é…\"\n", got)
}

// TestConfirmWarnsOfALiveOwnerOnly: a live owner may still be working; a
// gone one's key is only waiting to expire, or never will.
func TestConfirmWarnsOfALiveOwnerOnly(t *testing.T) {
	for _, tc := range []struct {
		name   string
		info   lockreg.LockInfo
		prompt string
	}{
		{"live", lockreg.LockInfo{Key: "k", Owner: "billing", OwnerID: "id-1", TTL: time.Second},
			`Force "k" open? billing holds it (live: seen within two leases) for another 1.0s, and may still be working. [y/N] `},
		{"live, no expiry", lockreg.LockInfo{Key: "k", Owner: "billing", OwnerID: "id-1", TTL: lockreg.NoExpiry},
			`Force "k" open? billing holds it (live: seen within two leases) with no expiry, and may still be working. [y/N] `},
		{"gone", lockreg.LockInfo{Key: "k", OwnerID: "id-1", TTL: 12300 * time.Millisecond},
			`Force "k" open? Its owner, client id-1, is gone (not seen for two leases); the key expires by itself in 12.3s. [y/N] `},
		{"gone, no expiry", lockreg.LockInfo{Key: "k", OwnerID: "id-1", TTL: lockreg.NoExpiry},
			`Force "k" open? Its owner, client id-1, is gone (not seen for two leases); the key has no expiry: nothing else frees it. [y/N] `},
		{"a long key", lockreg.LockInfo{Key: strings.Repeat("k", 201), OwnerID: "id-1", TTL: time.Second},
			`Force "` + strings.Repeat("k", 200) + `… (201 bytes)" open? Its owner, client id-1, is gone (not seen for two leases); the key expires by itself in 1.0s. [y/N] `},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for answer, want := range map[string]bool{"y\n": true, "YES\n": true, " yes \n": true, "n\n": false, "\n": false, "": false, "sure\n": false} {
				var prompt bytes.Buffer
				require.Equal(t, want, confirm(strings.NewReader(answer), &prompt, tc.info), "%q", answer)
				require.Equal(t, tc.prompt, prompt.String())
			}
		})
	}
}

// TestLockctlTellsLiveOwnersFromGone: list and show mark each owner live
// or gone, align the numbers, print "no expiry" and cut long keys; unlock
// warns only of a live owner.
func TestLockctlTellsLiveOwnersFromGone(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	url := "redis://" + srv.Addr()
	long := strings.Repeat("x", 300)
	service, err := lockreg.New(srv.Client(t), "orders", lockreg.WithOwner("billing/pod-7"))
	require.NoError(t, err)
	defer service.Close()
	live, err := service.Obtain("live-job").Acquire(ctx)
	require.NoError(t, err)
	token, err := live.Token(ctx)
	require.NoError(t, err)
	longHold, err := service.Obtain(long).Acquire(ctx)
	require.NoError(t, err)
	awaitOwnerName(t, service, "live-job", "billing/pod-7")
	// Keys no live registry owns: one with a lease (its owner died more
	// than two leases ago, or could not write its name), one without.
	require.NoError(t, admin.Set(ctx, "orders:{legacy-job}", "old-worker-3", time.Minute).Err())
	require.NoError(t, admin.Set(ctx, "orders:{legacy-job}:fence", "7", 0).Err())
	require.NoError(t, admin.Set(ctx, "orders:{stuck}", "hand-written", 0).Err())

	res := runLockctl(t, nil, "-redis", url, "-namespace", "orders", "list")
	require.Equal(t, exitOK, res.code, res.stderr)
	lines := strings.Split(strings.TrimSuffix(res.stdout, "\n"), "\n")
	require.Len(t, lines, 5, res.stdout)
	require.Regexp(t, `^\s*\d+\.\ds\s+7\s+0\s+gone\s+client old-worker-3\s+"legacy-job"$`, lines[1])
	require.Regexp(t, `^\s*\d+\.\ds\s+\d{6,}\s+0\s+live\s+billing/pod-7\s+"live-job"$`, lines[2])
	require.Regexp(t, `^no expiry\s+-\s+0\s+gone\s+client hand-written\s+"stuck"$`, lines[3])
	require.Regexp(t, `^\s*\d+\.\ds\s+-\s+0\s+live\s+billing/pod-7\s+"x{200}… \(300 bytes\)"$`, lines[4])
	require.NotContains(t, res.stdout, strings.Repeat("x", 201))
	requireRightAligned(t, lines, "TTL", "TOKEN", "WAITING")
	requireLeftAligned(t, lines, "STATE", "OWNER", "KEY")

	res = runLockctl(t, nil, "-redis", url, "-namespace", "orders", "-json", "list")
	require.Equal(t, exitOK, res.code, res.stderr)
	var listed []lockJSON
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &listed))
	require.Len(t, listed, 4)
	byKey := map[string]lockJSON{}
	for _, l := range listed {
		byKey[l.Key] = l
	}
	require.Contains(t, byKey, long, "JSON keeps keys whole")
	require.True(t, byKey["live-job"].OwnerLive)
	require.Equal(t, token, byKey["live-job"].Token)
	require.False(t, byKey["legacy-job"].OwnerLive)
	require.Positive(t, byKey["legacy-job"].TTLms)
	require.False(t, byKey["stuck"].OwnerLive)
	require.Equal(t, int64(-1), byKey["stuck"].TTLms, "no expiry, as PTTL says")

	res = runLockctl(t, nil, "-redis", url, "-namespace", "orders", "show", "stuck")
	require.Equal(t, exitOK, res.code, res.stderr)
	require.Regexp(t, `(?m)^owner\s+client hand-written$`, res.stdout)
	require.Regexp(t, `(?m)^state\s+gone: no sign of its registry for two leases`, res.stdout)
	require.Regexp(t, `(?m)^ttl\s+no expiry$`, res.stdout)
	require.Regexp(t, `(?m)^token\s+-$`, res.stdout)
	res = runLockctl(t, nil, "-redis", url, "-namespace", "orders", "show", "live-job")
	require.Equal(t, exitOK, res.code, res.stderr)
	require.Regexp(t, `(?m)^state\s+live: its registry was seen within the last two leases$`, res.stdout)

	for _, tc := range []struct {
		key, says string
	}{
		{"stuck", `unlocked "stuck", held by client hand-written (gone)` + "\n"},
		{"legacy-job", `unlocked "legacy-job", held by client old-worker-3 (gone)` + "\n"},
		{"live-job", `unlocked "live-job", held by billing/pod-7 (live: it may still be working, and learns that it lost the lock)` + "\n"},
		{long, `unlocked "` + strings.Repeat("x", 200) + `… (300 bytes)", held by billing/pod-7 (live: it may still be working, and learns that it lost the lock)` + "\n"},
	} {
		res = runLockctl(t, nil, "-redis", url, "-namespace", "orders", "unlock", tc.key, "-yes")
		require.Equal(t, exitOK, res.code, res.stderr)
		require.Equal(t, tc.says, res.stdout)
		require.Empty(t, res.stderr)
	}
	requireLost(t, live)
	requireLost(t, longHold)

	res = runLockctl(t, nil, "-redis", url, "-namespace", "orders", "show", long)
	require.Equal(t, exitNotFound, res.code)
	require.Equal(t, `lockctl: "`+strings.Repeat("x", 200)+`… (300 bytes)" is not held in namespace "orders"`+"\n", res.stderr)
}

// requireRightAligned checks that the cells of each column named, in
// every line, end where its heading does.
func requireRightAligned(t *testing.T, lines []string, headings ...string) {
	t.Helper()
	for _, heading := range headings {
		end := utf8.RuneCountInString(lines[0][:strings.Index(lines[0], heading)]) + len(heading)
		for _, line := range lines[1:] {
			r := []rune(line)
			require.Greater(t, len(r), end, line)
			require.NotEqual(t, ' ', r[end-1], "%s ends at %d: %q", heading, end, line)
			require.Equal(t, ' ', r[end], "%s ends at %d: %q", heading, end, line)
		}
	}
}

// requireLeftAligned checks that the cells of each column named, in every
// line, begin where its heading does.
func requireLeftAligned(t *testing.T, lines []string, headings ...string) {
	t.Helper()
	for _, heading := range headings {
		start := utf8.RuneCountInString(lines[0][:strings.Index(lines[0], heading)])
		for _, line := range lines[1:] {
			r := []rune(line)
			require.Greater(t, len(r), start, line)
			require.Equal(t, ' ', r[start-1], "%s begins at %d: %q", heading, start, line)
			require.NotEqual(t, ' ', r[start], "%s begins at %d: %q", heading, start, line)
		}
	}
}

// TestLockctlJSONKeepsAKeyThatIsNotUTF8: JSON strings are UTF-8, so
// encoding/json turns a key's invalid bytes into U+FFFD; -json adds the
// key's bytes in base64, from which a script gets the key back.
func TestLockctlJSONKeepsAKeyThatIsNotUTF8(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	url := "redis://" + srv.Addr()
	const odd = "odd\x00\x1b[31m\xff\xfe"
	service, err := lockreg.New(srv.Client(t), "orders", lockreg.WithOwner("billing/pod-7"))
	require.NoError(t, err)
	defer service.Close()
	for _, key := range []string{odd, "plain-é"} {
		_, err := service.Obtain(key).Acquire(ctx)
		require.NoError(t, err)
	}

	res := runLockctl(t, nil, "-redis", url, "-namespace", "orders", "-json", "list")
	require.Equal(t, exitOK, res.code, res.stderr)
	var listed []struct {
		Key       string `json:"key"`
		KeyBase64 string `json:"key_base64"`
	}
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &listed))
	require.Len(t, listed, 2)
	keys := map[string]bool{}
	for _, l := range listed {
		key := l.Key
		if l.KeyBase64 != "" {
			raw, err := base64.StdEncoding.DecodeString(l.KeyBase64)
			require.NoError(t, err)
			key = string(raw)
		}
		keys[key] = true
	}
	require.Equal(t, map[string]bool{odd: true, "plain-é": true}, keys, res.stdout)
	require.NotContains(t, res.stdout, `"plain-é","key_base64"`, "a UTF-8 key has no key_base64")
}

// An owner's name (WithOwner) and a lock key's value are anyone's who can
// write them: lockctl shows them, as it does keys, quoted where they hold
// control characters, which would break its table into false rows or
// drive the operator's terminal.
func TestLockctlQuotesOwnersThatAreNotPrintable(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	service, err := lockreg.New(srv.Client(t), "orders", lockreg.WithOwner("pod-7\x1b[2J\nfake  row"))
	require.NoError(t, err)
	defer service.Close()
	h, err := service.Obtain("o-1").Acquire(ctx)
	require.NoError(t, err)
	defer func() { require.NoError(t, h.Release(ctx)) }()
	foreign := protocol.LockKeys("orders", "o-2").Lock()
	require.NoError(t, srv.Client(t).Set(ctx, foreign, "x\x1b]0;owned\a\ny", time.Minute).Err())
	awaitOwnerName(t, service, "o-1", "pod-7\x1b[2J\nfake  row")

	for _, args := range [][]string{{"list"}, {"show", "o-1"}, {"show", "o-2"}} {
		var stdout, stderr bytes.Buffer
		code := run(ctx, append([]string{"-redis", srv.Addr(), "-namespace", "orders"}, args...), nil, &stdout, &stderr, false)
		require.Equal(t, exitOK, code, "%v: %s", args, &stderr)
		out := stdout.String()
		require.NotContains(t, out, "\x1b", "%v: %q", args, out)
		require.NotContains(t, out, "\a", "%v: %q", args, out)
		if args[0] == "list" {
			require.Len(t, strings.Split(strings.TrimSuffix(out, "\n"), "\n"), 3, "a header and two rows: %q", out)
		}
	}
}

// A lock key whose value is empty, or not a string, names no owner: show
// quotes the empty id, rather than print nothing after "client".
func TestLockctlQuotesAnEmptyOwnerID(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	require.NoError(t, srv.Client(t).HSet(ctx, protocol.LockKeys("orders", "by-hand").Lock(), "by", "hand").Err())
	require.NoError(t, srv.Client(t).Set(ctx, protocol.LockKeys("orders", "empty").Lock(), "", 0).Err())
	for _, key := range []string{"by-hand", "empty"} {
		var stdout, stderr bytes.Buffer
		code := run(ctx, []string{"-redis", srv.Addr(), "-namespace", "orders", "show", key}, nil, &stdout, &stderr, false)
		require.Equal(t, exitOK, code, stderr.String())
		require.Regexp(t, `(?m)^owner\s+client ""$`, stdout.String())
		require.Regexp(t, `(?m)^owner id\s+""$`, stdout.String())
	}
}
