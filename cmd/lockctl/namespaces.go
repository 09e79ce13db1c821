package main

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/lockreg/lockreg/internal/protocol"
)

// seenNamespaces counts the registries of each namespace seen within the
// last two leases: their owner hashes, <namespace>:owner:<client id>,
// which live two leases past a registry's last refresh. It scans the whole
// keyspace (every primary on Cluster).
func seenNamespaces(ctx context.Context, client redis.UniversalClient) (map[string]int, error) {
	seen := map[string]int{}
	err := protocol.Scan(ctx, client, protocol.OwnerPattern, func(batch []string) bool {
		for _, key := range batch {
			// A lock key whose key holds ":owner:", or an application's
			// key, matches the pattern too: NamespaceOf names no namespace.
			if namespace, ok := protocol.NamespaceOf(key); ok {
				seen[namespace]++
			}
		}
		return true
	})
	return seen, err
}

// twoLeases is how long a registry's owner hash outlives it.
const twoLeases = "the last two leases (a minute at the default 30s lease)"

// describeNamespace tells, of a namespace in which nothing was found,
// whether it is in use: how many registries of it live (only if always),
// or that none does, and which namespaces do, the close matches first.
func describeNamespace(namespace string, seen map[string]int, always bool) string {
	if n := seen[namespace]; n > 0 {
		if !always {
			return ""
		}
		if n == 1 {
			return "1 registry of it is live: seen within " + twoLeases
		}
		return fmt.Sprintf("%d registries of it are live: seen within %s", n, twoLeases)
	}
	msg := "no registry of this namespace seen in " + twoLeases
	others := slices.Sorted(maps.Keys(seen))
	const most = 10
	switch close := closeMatches(namespace, others); {
	case len(others) == 0:
		return msg + ", nor of any other: is -redis the right server and database?"
	case len(close) > 0:
		return msg + "; did you mean " + quoteList(close, " or ") + "?"
	case len(others) > most:
		return fmt.Sprintf("%s; the namespaces in use are %s and %d more", msg, quoteList(others[:most], ", "), len(others)-most)
	default:
		return msg + "; the namespaces in use are " + quoteList(others, ", ")
	}
}

func quoteList(names []string, sep string) string {
	quoted := make([]string, len(names))
	for i, name := range names {
		quoted[i] = strconv.Quote(name)
	}
	return strings.Join(quoted, sep)
}

// closeMatches are the candidates that target may be a typo of, closest
// first, five at most: those a few edits away (one for a short target,
// up to three for a long one), and those that contain it or that it
// contains, letter case aside.
func closeMatches(target string, candidates []string) []string {
	type match struct {
		name     string
		distance int
	}
	lower := strings.ToLower(target)
	limit := min(max((len([]rune(target))+2)/3, 1), 3)
	var matches []match
	for _, c := range candidates {
		if c == target {
			continue
		}
		lc := strings.ToLower(c)
		d := editDistance(lower, lc)
		if d <= limit || (len(lower) >= 3 && (strings.Contains(lc, lower) || strings.Contains(lower, lc))) {
			matches = append(matches, match{c, d})
		}
	}
	slices.SortFunc(matches, func(a, b match) int {
		return cmp.Or(cmp.Compare(a.distance, b.distance), strings.Compare(a.name, b.name))
	})
	var names []string
	for _, m := range matches[:min(len(matches), 5)] {
		names = append(names, m.name)
	}
	return names
}

// editDistance counts the insertions, deletions, substitutions and swaps
// of two neighbours that turn a into b (optimal string alignment).
func editDistance(a, b string) int {
	s, t := []rune(a), []rune(b)
	// d[i][j] is the distance between s[:i] and t[:j].
	d := make([][]int, len(s)+1)
	for i := range d {
		d[i] = make([]int, len(t)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(s); i++ {
		for j := 1; j <= len(t); j++ {
			cost := 1
			if s[i-1] == t[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && s[i-1] == t[j-2] && s[i-2] == t[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(s)][len(t)]
}
