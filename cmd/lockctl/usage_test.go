package main

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg"
	"github.com/lockreg/lockreg/internal/redistest"
)

// TestLockctlRefusesBadInput: each mistake exits 2 with one line that says
// what is wrong, then the usage line (not the flags' defaults).
func TestLockctlRefusesBadInput(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		says string // in the first line of stderr
	}{
		{"no command", []string{"-namespace", "ns"}, "name a command: list, show KEY or unlock KEY"},
		{"no namespace", []string{"list"}, "-namespace is required: the namespace the service passes to lockreg.New"},
		{"no namespace after the command", []string{"show", "k", "-json"}, "-namespace is required: the namespace the service passes to lockreg.New"},
		{"a typo of list", []string{"-namespace", "ns", "lsit"}, `unknown command "lsit"; the commands are list, show KEY and unlock KEY (did you mean list?)`},
		{"a typo of unlock", []string{"unlok", "k", "-namespace", "ns"}, `unknown command "unlok"; the commands are list, show KEY and unlock KEY (did you mean unlock?)`},
		{"unknown command", []string{"-namespace", "ns", "drop", "k"}, `unknown command "drop"; the commands are list, show KEY and unlock KEY`},
		{"list with a key", []string{"-namespace", "ns", "list", "k"}, `list takes no arguments (given "k")`},
		{"show without a key", []string{"-namespace", "ns", "show"}, "show needs a KEY"},
		{"unlock of two keys", []string{"-namespace", "ns", "unlock", "-yes", "a", "b"}, `unlock takes one KEY (given 2: "a" "b")`},
		{"empty key", []string{"-namespace", "ns", "show", ""}, "the key is empty"},
		{"-yes with show", []string{"-namespace", "ns", "show", "k", "-yes"}, "-yes is for unlock, not show"},
		{"unknown flag", []string{"-namespace", "ns", "list", "-v"}, `flag provided but not defined: -v (a key that begins with '-' goes after "--")`},
		{"a key like a flag", []string{"-namespace", "ns", "show", "-k"}, `flag provided but not defined: -k (a key that begins with '-' goes after "--")`},
		{"bad flag value", []string{"-namespace", "ns", "list", "-timeout", "soon"}, `invalid value "soon" for flag -timeout: parse error`},
		{"a zero timeout", []string{"-namespace", "ns", "list", "-timeout", "0"}, "-timeout must be positive (given 0s)"},
		{"a negative timeout", []string{"-namespace", "ns", "show", "k", "-timeout", "-1s"}, "-timeout must be positive (given -1s)"},
		{"bad namespace", []string{"-namespace", "a{}b", "list"}, `"a{}b" starts a Cluster hash tag`},
		{"bad URL", []string{"-redis", "htp:/foo", "-namespace", "ns", "list"}, `-redis "htp:/foo": "htp:" is not a scheme lockctl takes (redis://, rediss:// or unix://), and the rest is not HOST:PORT`},
		{"bad URL after the command", []string{"list", "-namespace", "ns", "-redis", "http://x:y:z"}, `-redis "http://x:y:z": the scheme is "http"; lockctl takes redis://, rediss:// or unix://`},
		{"Sentinel and Cluster at once", []string{"-namespace", "ns", "-sentinel", "mymaster", "-cluster", "list"}, "-sentinel and -cluster exclude each other"},
		{"a database on a Cluster", []string{"-namespace", "ns", "-cluster", "-redis", "redis://127.0.0.1:1/2", "list"}, `-redis "redis://127.0.0.1:1/2": database 2 on a Cluster, which has database 0 alone`},
		{"another password on a later address", []string{"-namespace", "ns", "-redis", "redis://:a@127.0.0.1:1,redis://:b@127.0.0.1:2", "list"}, `address 2, "redis://:xxxxx@127.0.0.1:2": another user or password than the first address's; one client takes one`},
		{"TLS on a later address alone", []string{"-namespace", "ns", "-redis", "redis://127.0.0.1:1,rediss://127.0.0.1:2", "list"}, `address 2, "rediss://127.0.0.1:2": rediss:// where the first address has redis://, or the other way round; one client takes one`},
		{"another database on a later Sentinel", []string{"-namespace", "ns", "-sentinel", "m", "-redis", "127.0.0.1:1/1,127.0.0.1:2/2", "list"}, `address 2, "127.0.0.1:2/2": database 2 where the first address has 1; one client takes one`},
		{"a database on several addresses", []string{"-namespace", "ns", "-redis", "127.0.0.1:1,redis://127.0.0.1:2/3", "list"}, `database 3 on a Cluster, which has database 0 alone`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := runLockctl(t, nil, tc.args...)
			require.Equal(t, exitUsage, res.code, res.stderr)
			lines := strings.Split(res.stderr, "\n")
			require.Len(t, lines, 3, res.stderr)
			require.True(t, strings.HasPrefix(lines[0], "lockctl: "), lines[0])
			require.Contains(t, lines[0], tc.says)
			require.Equal(t, usageLine, lines[1])
			require.Empty(t, res.stdout)
		})
	}
}

// TestLockctlSaysWhatIsWrongWithAURL: redisAddress names the fault, not
// another one it led go-redis to (htp:/foo was "invalid database number").
func TestLockctlSaysWhatIsWrongWithAURL(t *testing.T) {
	for _, tc := range []struct {
		address, says string // says "" for a good one
		addr          string
		db            int
	}{
		{address: "redis://10.0.0.1:6380/2", addr: "10.0.0.1:6380", db: 2},
		{address: "rediss://user:pw@cache.internal", addr: "cache.internal:6379"},
		{address: "REDIS://h:1", addr: "h:1"},
		{address: "127.0.0.1:6379", addr: "127.0.0.1:6379"},
		{address: "127.0.0.1:6379/3", addr: "127.0.0.1:6379", db: 3},
		{address: "localhost", addr: "localhost:6379"},
		{address: "unix:///run/redis.sock?db=1", addr: "/run/redis.sock", db: 1},
		{address: "htp:/foo", says: `"htp:" is not a scheme lockctl takes (redis://, rediss:// or unix://), and the rest is not HOST:PORT`},
		{address: "redis:/h:6379", says: `"//" must follow "redis:", as in redis://HOST:PORT`},
		{address: "rediss:/h", says: `"//" must follow "rediss:", as in rediss://HOST:PORT`},
		{address: "http://h:6379", says: `the scheme is "http"; lockctl takes redis://, rediss:// or unix://`},
		{address: "redis://h:port", says: `invalid port ":port" after host`},
		{address: "redis://h/foo", says: `invalid database number: "foo"`},
		{address: "redis://h/1/2", says: "invalid URL path: /1/2"},
		{address: "redis://h?dial_timeout=soon", says: `invalid dial_timeout duration: time: invalid duration "soon"`},
		{address: "unix://", says: "empty unix socket path"},
		{address: "", says: "an empty address (a stray comma?)"},
	} {
		t.Run(tc.address, func(t *testing.T) {
			opt, err := redisAddress(tc.address)
			if tc.says != "" {
				require.EqualError(t, err, tc.says)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.addr, opt.Addr)
			require.Equal(t, tc.db, opt.DB)
		})
	}
}

func TestConnectNamesTheBadAddressAndHidesPasswords(t *testing.T) {
	for _, tc := range []struct {
		redis, says string
	}{
		{"redis://u:secret@h/foo", `-redis "redis://u:xxxxx@h/foo": invalid database number: "foo"`},
		{"http://u:secret@h:y:z", `-redis "http://u:xxxxx@h:y:z": the scheme is "http"`},
		{"redis://:secret@h:x", `-redis "redis://:xxxxx@h:x": invalid port ":x" after host`},
		{"a:1,b:2,,c:3", `-redis "a:1,b:2,,c:3": address 3, "": an empty address (a stray comma?)`},
		{"a:1,htp:/b", `-redis "a:1,htp:/b": address 2, "htp:/b": "htp:" is not a scheme`},
	} {
		t.Run(tc.redis, func(t *testing.T) {
			_, err := connect(options{redisURL: tc.redis, redisFrom: "-redis"})
			require.ErrorIs(t, err, errUsage)
			require.ErrorContains(t, err, tc.says)
			require.NotContains(t, err.Error(), "secret")
		})
	}
}

// TestHidePasswords: each address of a -redis value keeps its password
// out (internal/redact's tests have the shapes of one address).
func TestHidePasswords(t *testing.T) {
	require.Equal(t, "u:xxxxx@h:1,redis://v:xxxxx@g,h:2", hidePasswords("u:pw@h:1,redis://v:p2@g,h:2"))
}

// TestLockctlTakesFlagsAnywhere: before the command, after it, between it
// and its key, after the key; "--" ends the flags.
func TestLockctlTakesFlagsAnywhere(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	url := "redis://" + srv.Addr()
	service, err := lockreg.New(srv.Client(t), "orders")
	require.NoError(t, err)
	defer service.Close()
	for _, key := range []string{"o-1", "-o-2", "o-3", "o-4", "o-5"} {
		_, err := service.Obtain(key).Acquire(ctx)
		require.NoError(t, err)
	}
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"-redis", url, "-namespace", "orders", "list"}, `"o-1"`},
		{[]string{"list", "-redis", url, "-namespace", "orders"}, `"o-1"`},
		{[]string{"-redis", url, "list", "-namespace", "orders", "-json"}, `"key":"o-1"`},
		{[]string{"-namespace", "orders", "show", "o-1", "-redis", url}, `"o-1"`},
		{[]string{"show", "-namespace", "orders", "-redis=" + url, "o-1"}, `"o-1"`},
		{[]string{"-namespace", "orders", "-redis", url, "show", "--", "-o-2"}, `"-o-2"`},
		{[]string{"-yes", "-namespace", "orders", "-redis", url, "unlock", "o-3"}, `unlocked "o-3"`},
		{[]string{"-namespace", "orders", "-redis", url, "unlock", "-yes", "o-4"}, `unlocked "o-4"`},
		{[]string{"unlock", "o-5", "-namespace", "orders", "-redis", url, "-yes"}, `unlocked "o-5"`},
		{[]string{"-namespace", "orders", "-redis", url, "unlock", "-yes", "--", "-o-2"}, `unlocked "-o-2"`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			res := runLockctl(t, nil, tc.args...)
			require.Equal(t, exitOK, res.code, res.stderr)
			require.Contains(t, res.stdout, tc.says)
		})
	}
}

// TestLockctlHelpListsTheExitCodes: -h, wherever it stands, prints the
// commands, the flags and the exit codes on stdout, and exits 0.
func TestLockctlHelpListsTheExitCodes(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"-help"}, {"list", "-h"}, {"-namespace", "ns", "unlock", "k", "--help"}} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			res := runLockctl(t, []string{"REDIS_URL=redis://u:secret@h:1"}, args...)
			require.Equal(t, exitOK, res.code, res.stderr)
			require.Empty(t, res.stderr)
			for _, want := range []string{
				"usage: lockctl -namespace NS [flags] COMMAND",
				"  list ", "  show KEY ", "  unlock KEY ",
				"Flags go before or after the command",
				"  -namespace NS", "  -redis URL", "  -yes", "  -json", "  -timeout duration", "  -quoted",
				"\nexit codes:\n",
				fmt.Sprintf("  %d  done\n", exitOK),
				fmt.Sprintf("  %d  an error: Redis unreachable", exitError),
				fmt.Sprintf("  %d  bad usage: a flag, command or -redis URL", exitUsage),
				fmt.Sprintf("  %d  not found: the key is not held, or no lock is held in the namespace", exitNotFound),
			} {
				require.Contains(t, res.stdout, want)
			}
			require.NotContains(t, res.stdout, "secret", "$REDIS_URL is no flag default to print")
		})
	}
}

// TestLockctlKeepsGoRedisLogsOut: with Redis unreachable, lockctl prints
// one line that names it, and none of go-redis's own (pool.go).
func TestLockctlKeepsGoRedisLogsOut(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close()) // nothing listens there now
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		says string
	}{
		{"list", nil, []string{"-redis", "redis://" + addr, "-namespace", "ns", "list"}, fmt.Sprintf(`cannot reach Redis (-redis "redis://%s"): dial tcp %s: connect: connection refused`, addr, addr)},
		{"show, from $REDIS_URL", []string{"REDIS_URL=redis://u:secret@" + addr}, []string{"-namespace", "ns", "show", "k"}, fmt.Sprintf(`cannot reach Redis ($REDIS_URL "redis://u:xxxxx@%s"): dial tcp %s`, addr, addr)},
		{"unlock", nil, []string{"-redis", addr, "-namespace", "ns", "unlock", "-yes", "k"}, "cannot reach Redis"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := runLockctl(t, tc.env, tc.args...)
			require.Equal(t, exitError, res.code, res.stderr)
			require.Empty(t, res.stdout)
			require.NotContains(t, res.stderr, "pool.go")
			require.Equal(t, 1, strings.Count(res.stderr, "\n"), res.stderr)
			require.True(t, strings.HasPrefix(res.stderr, "lockctl: "+tc.says), res.stderr)
		})
	}
}

// TestLockctlTimeoutBoundsAServerThatDoesNotAnswer: a server that takes
// the connection and never answers is told as no answer within -timeout,
// whatever go-redis's own timeouts (3s to read, 5s to dial and greet):
// -timeout bounds them.
func TestLockctlTimeoutBoundsAServerThatDoesNotAnswer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var held sync.WaitGroup
	held.Go(func() {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				_ = c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	})
	defer held.Wait()
	defer ln.Close()
	addr := ln.Addr().String()
	res := runLockctl(t, nil, "-redis", addr, "-namespace", "ns", "-timeout", "6s", "list")
	require.Equal(t, exitError, res.code, res.stderr)
	require.True(t, strings.HasPrefix(res.stderr, fmt.Sprintf(`lockctl: no answer from Redis (-redis %q) within -timeout 6s: `, addr)), res.stderr)
}

// TestLockctlHidesAPasswordThatIsNotEscaped: a generated password often
// holds '/', '?' or '#', which a URL must percent-encode; unescaped, they
// end the URL's host part early, and the password showed in the error,
// whole, and in part in url.Parse's message ("invalid port").
func TestLockctlHidesAPasswordThatIsNotEscaped(t *testing.T) {
	for _, redis := range []string{
		"redis://u:Zq9/Wk3@h:6379",
		"redis://:Zq9?Wk3@h:6379/0",
		"redis://u:123/4567@h", // parses, but 4567@h is no database
		"rediss://u:Zq9#Wk3@h",
		"u:Zq9/Wk3@h:6379",
		"redis://v:pw@h:1,redis://u:Zq9/Wk3@h:2",
	} {
		t.Run(redis, func(t *testing.T) {
			res := runLockctl(t, nil, "-redis", redis, "-timeout", "1s", "-namespace", "ns", "list")
			require.Equal(t, exitUsage, res.code, res.stderr)
			require.NotContains(t, res.stderr, "Zq9")
			require.NotContains(t, res.stderr, "Wk3")
			require.NotContains(t, res.stderr, "4567")
			require.Contains(t, res.stderr, "percent-encode")
		})
	}
}
