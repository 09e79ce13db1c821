package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg"
	"github.com/lockreg/lockreg/internal/protocol"
	"github.com/lockreg/lockreg/internal/redistest"
)

func TestEditDistance(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"", "", 0},
		{"list", "list", 0},
		{"", "list", 4},
		{"lsit", "list", 1}, // a swap of neighbours is one edit
		{"unlok", "unlock", 1},
		{"app:biling", "app:billing", 1},
		{"app:billing", "app:bilinG", 2},
		{"drop", "show", 3},
		{"ça", "ca", 1}, // runes, not bytes
		{"ab", "ba", 1},
		{"ca", "abc", 3}, // optimal string alignment: no edit of a swapped pair
	} {
		require.Equal(t, tc.want, editDistance(tc.a, tc.b), "%q %q", tc.a, tc.b)
		require.Equal(t, tc.want, editDistance(tc.b, tc.a), "%q %q", tc.b, tc.a)
	}
}

func TestCloseMatches(t *testing.T) {
	namespaces := []string{"app:billing", "app:orders", "payments", "app:billing:eu", "ab"}
	for _, tc := range []struct {
		target     string
		candidates []string
		want       []string
	}{
		{"lsit", commands, []string{"list"}},
		{"lis", commands, []string{"list"}},
		{"sho", commands, []string{"show"}},
		{"unlcok", commands, []string{"unlock"}},
		{"drop", commands, nil},
		{"ls", commands, nil},
		{"app:biling", namespaces, []string{"app:billing"}},
		{"APP:Billing", namespaces, []string{"app:billing", "app:billing:eu"}},
		{"billing", namespaces, []string{"app:billing", "app:billing:eu"}},
		{"app:order", namespaces, []string{"app:orders"}},
		{"payment", namespaces, []string{"payments"}},
		{"app:billing", namespaces, []string{"app:billing:eu"}}, // not itself
		{"zz", namespaces, nil},
		{"ac", namespaces, []string{"ab"}},
		{"inventory", namespaces, nil},
	} {
		require.Equal(t, tc.want, closeMatches(tc.target, tc.candidates), tc.target)
	}
	many := []string{"ns0", "ns1", "ns2", "ns3", "ns4", "ns5", "ns6"}
	require.Equal(t, []string{"ns0", "ns1", "ns2", "ns3", "ns4"}, closeMatches("ns", many), "five at most")
}

func TestDescribeNamespace(t *testing.T) {
	var fifteen = map[string]int{}
	for i := range 15 {
		fifteen[fmt.Sprintf("service-%02d", i)] = 1
	}
	for _, tc := range []struct {
		name      string
		namespace string
		seen      map[string]int
		always    bool
		want      string
	}{
		{"in use, asked", "orders", map[string]int{"orders": 1}, true, "1 registry of it is live: seen within " + twoLeases},
		{"in use by several", "orders", map[string]int{"orders": 3, "x": 1}, true, "3 registries of it are live: seen within " + twoLeases},
		{"in use, not asked", "orders", map[string]int{"orders": 2}, false, ""},
		{"a typo", "app:biling", map[string]int{"app:billing": 2, "payments": 1}, false,
			"no registry of this namespace seen in " + twoLeases + `; did you mean "app:billing"?`},
		{"two close ones", "app:billing", map[string]int{"app:billing:eu": 1, "app:bil1ing": 1}, true,
			"no registry of this namespace seen in " + twoLeases + `; did you mean "app:bil1ing" or "app:billing:eu"?`},
		{"none close", "inventory", map[string]int{"app:billing": 2, "payments": 1}, true,
			"no registry of this namespace seen in " + twoLeases + `; the namespaces in use are "app:billing", "payments"`},
		{"many", "inventory", fifteen, true,
			"no registry of this namespace seen in " + twoLeases + `; the namespaces in use are "service-00", "service-01", "service-02", "service-03", "service-04", "service-05", "service-06", "service-07", "service-08", "service-09" and 5 more`},
		{"nothing at all", "orders", map[string]int{}, true,
			"no registry of this namespace seen in " + twoLeases + ", nor of any other: is -redis the right server and database?"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, describeNamespace(tc.namespace, tc.seen, tc.always))
		})
	}
}

// TestLockctlNamesTheNamespacesInUse: where nothing is held, lockctl tells
// a namespace in use from one no registry uses, and names those in use,
// the close ones first; it still exits 3.
func TestLockctlNamesTheNamespacesInUse(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	url := "redis://" + srv.Addr()
	admin := srv.Client(t)
	registries := map[string]*lockreg.Registry{}
	for _, ns := range []string{"app:billing", "app:orders", "payments"} {
		r, err := lockreg.New(srv.Client(t), ns, lockreg.WithOwner(ns+"/pod-1"))
		require.NoError(t, err)
		defer r.Close()
		registries[ns] = r
		// An acquisition publishes the registry's owner hash, which
		// outlives the release.
		h, err := r.Obtain("warm-up").Acquire(ctx)
		require.NoError(t, err)
		require.NoError(t, h.Release(ctx))
	}
	// A lock whose key holds ":owner:" matches protocol.OwnerPattern too;
	// its namespace is app:orders, not "app:orders:{x".
	held, err := registries["app:orders"].Obtain("x:owner:y").Acquire(ctx)
	require.NoError(t, err)
	defer func() { require.NoError(t, held.Release(ctx)) }()
	require.Eventually(t, func() bool {
		n := 0
		for _, ns := range []string{"app:billing", "app:orders", "payments"} {
			keys, err := admin.Keys(ctx, ns+":owner:*").Result()
			require.NoError(t, err)
			n += len(keys)
		}
		return n == 3
	}, 5*time.Second, 10*time.Millisecond, "each registry published its owner hash")
	require.NoError(t, admin.HSet(ctx, protocol.OwnerKey("other", "not-a-registry:really"), "name", "x").Err(), "no client id has a ':'")
	// An application's keys of the same shape, on the shared server: no
	// registry's client id is "42" (New draws a UUID).
	require.NoError(t, admin.Set(ctx, "inventory:owner:42", "alice", 0).Err())
	require.NoError(t, admin.HSet(ctx, "inventory:owner:d2d7fcac", "name", "bob").Err())

	in := " seen in " + twoLeases
	for _, tc := range []struct {
		name string
		args []string
		says string
	}{
		{"in use, nothing held", []string{"-namespace", "app:billing", "list"},
			`no locks held in namespace "app:billing"; 1 registry of it is live: seen within ` + twoLeases},
		{"a typo", []string{"-namespace", "app:biling", "list"},
			`no locks held in namespace "app:biling"; no registry of this namespace` + in + `; did you mean "app:billing"?`},
		{"the prefix left out", []string{"list", "-namespace", "orders"},
			`no locks held in namespace "orders"; no registry of this namespace` + in + `; did you mean "app:orders"?`},
		{"nothing like it", []string{"-namespace", "inventory", "list"},
			`no locks held in namespace "inventory"; no registry of this namespace` + in + `; the namespaces in use are "app:billing", "app:orders", "payments"`},
		{"show, in a typo", []string{"-namespace", "app:order", "show", "x:owner:y"},
			`"x:owner:y" is not held in namespace "app:order"; no registry of this namespace` + in + `; did you mean "app:orders"?`},
		{"unlock, in a typo", []string{"-namespace", "paymnts", "unlock", "-yes", "k"},
			`"k" is not held in namespace "paymnts"; no registry of this namespace` + in + `; did you mean "payments"?`},
		{"show, in use", []string{"-namespace", "payments", "show", "k"},
			`"k" is not held in namespace "payments"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := runLockctl(t, nil, append([]string{"-redis", url}, tc.args...)...)
			require.Equal(t, exitNotFound, res.code, res.stderr)
			require.Empty(t, res.stdout)
			require.Equal(t, "lockctl: "+tc.says+"\n", res.stderr)
		})
	}

	// Another database of the same server: nothing there at all.
	res := runLockctl(t, nil, "-redis", url+"/1", "-namespace", "app:billing", "list")
	require.Equal(t, exitNotFound, res.code, res.stderr)
	require.Equal(t, `lockctl: no locks held in namespace "app:billing"; no registry of this namespace`+in+", nor of any other: is -redis the right server and database?\n", res.stderr)

	// JSON prints an empty list, and the same words on stderr.
	res = runLockctl(t, nil, "-redis", url, "-namespace", "app:biling", "-json", "list")
	require.Equal(t, exitNotFound, res.code, res.stderr)
	require.Equal(t, "[]\n", res.stdout)
	require.True(t, strings.HasSuffix(res.stderr, `did you mean "app:billing"?`+"\n"), res.stderr)
}
