package main

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg/internal/redistest"
)

// TestLockctlAddressesAKeyNoShellCanPass: a key with a NUL byte cannot be
// an argument (the C strings of execve end at NUL), so show and unlock
// take, with -quoted, the key as list prints it: quoted, escapes and all.
func TestLockctlAddressesAKeyNoShellCanPass(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	url := "redis://" + srv.Addr()
	service := newNamedRegistry(t, srv, "billing/pod-7")
	const odd = "nul\x00byte\xff\n"
	_, err := service.Obtain(odd).Acquire(ctx)
	require.NoError(t, err)

	res := runLockctl(t, nil, "-redis", url, "-namespace", "orders", "list")
	require.Equal(t, exitOK, res.code, res.stderr)
	printed := strconv.Quote(odd)
	require.Contains(t, res.stdout, printed)

	res = runLockctl(t, nil, "-redis", url, "-namespace", "orders", "show", "-quoted", printed)
	require.Equal(t, exitOK, res.code, res.stderr)
	require.Contains(t, res.stdout, "key       "+printed+"\n")

	res = runLockctl(t, nil, "-redis", url, "-namespace", "orders", "-json", "-quoted", "show", `"nul\u0000byte\xff\n"`)
	require.Equal(t, exitOK, res.code, res.stderr)
	require.Contains(t, res.stdout, `"held":true`, "the key as -json prints a NUL")

	res = runLockctl(t, nil, "-redis", url, "-namespace", "orders", "unlock", "-yes", "-quoted", printed)
	require.Equal(t, exitOK, res.code, res.stderr)
	require.Equal(t, "unlocked "+printed+", held by billing/pod-7 (live: it may still be working, and learns that it lost the lock)\n", res.stdout)
	info, err := service.Inspect(ctx, odd)
	require.NoError(t, err)
	require.False(t, info.Held)
}

// TestLockctlRefusesABadQuotedKey: -quoted takes one quoted string, and
// only for the commands that take a key.
func TestLockctlRefusesABadQuotedKey(t *testing.T) {
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"show", "-quoted", "order-42"}, `-quoted: the key is not a quoted string ("order-42"): write it as list prints it, in double quotes`},
		{[]string{"show", "-quoted", `"a\q"`}, `-quoted: the key is not a quoted string`},
		{[]string{"unlock", "-yes", "-quoted", `""`}, "the key is empty"},
		{[]string{"list", "-quoted"}, "-quoted is for show and unlock, not list"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			res := runLockctl(t, nil, append([]string{"-namespace", "ns"}, tc.args...)...)
			require.Equal(t, exitUsage, res.code, res.stderr)
			require.Contains(t, strings.SplitN(res.stderr, "\n", 2)[0], tc.says)
			require.Empty(t, res.stdout)
		})
	}
}

// TestLockctlSaysAKeyFromTheTableWasCut: list cuts a key over 200 bytes
// ("xxx… (300 bytes)"); an operator who copies it from the table to show
// or unlock is told that it was cut, and where to find it whole.
func TestLockctlSaysAKeyFromTheTableWasCut(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	url := "redis://" + srv.Addr()
	service := newNamedRegistry(t, srv, "billing/pod-7")
	_, err := service.Obtain(strings.Repeat("x", 300)).Acquire(ctx)
	require.NoError(t, err)

	res := runLockctl(t, nil, "-redis", url, "-namespace", "orders", "list")
	require.Equal(t, exitOK, res.code, res.stderr)
	printed := strconv.Quote(strings.Repeat("x", 200) + "… (300 bytes)")
	require.Contains(t, res.stdout, printed)
	cut, err := strconv.Unquote(printed)
	require.NoError(t, err)
	for _, args := range [][]string{{"show", cut}, {"show", "-quoted", printed}, {"unlock", "-yes", "-quoted", printed}} {
		t.Run(args[0]+" "+args[1], func(t *testing.T) {
			res := runLockctl(t, nil, append([]string{"-redis", url, "-namespace", "orders"}, args...)...)
			require.Equal(t, exitNotFound, res.code, res.stderr)
			require.True(t, strings.HasSuffix(res.stderr, "; list cuts keys over 200 bytes: -json prints them whole\n"), res.stderr)
		})
	}
}
