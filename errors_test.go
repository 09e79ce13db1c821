package lockreg

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestErrorsAreShortAndTheirDocsSayWhatToDo: an error's text is logged
// wrapped, so it says what happened, in a few words; what to do about it
// is in its sentinel's doc comment.
func TestErrorsAreShortAndTheirDocsSayWhatToDo(t *testing.T) {
	sentinels := map[string]error{
		"ErrNotObtained": ErrNotObtained, "ErrNotHeld": ErrNotHeld, "ErrLockLost": ErrLockLost, "ErrClosed": ErrClosed,
		"ErrInvalidOption": ErrInvalidOption, "ErrInvalidKey": ErrInvalidKey, "ErrRedis": ErrRedis, "ErrNotReplicated": ErrNotReplicated,
		"ErrInvalidArgument": ErrInvalidArgument, "ErrServerEvicts": ErrServerEvicts,
	}
	for name, err := range sentinels {
		require.Regexp(t, regexp.MustCompile(`^lockreg: [a-zA-Z][a-z A-Z]+$`), err.Error(), name)
		require.LessOrEqual(t, len(err.Error()), 50, name)
	}
	pkgs, err := parser.ParseDir(token.NewFileSet(), ".", func(fi fs.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, parser.ParseComments)
	require.NoError(t, err)
	documented := map[string]string{}
	for _, file := range pkgs["lockreg"].Files {
		ast.Inspect(file, func(n ast.Node) bool {
			if spec, ok := n.(*ast.ValueSpec); ok && spec.Doc != nil {
				for _, name := range spec.Names {
					documented[name.Name] = spec.Doc.Text()
				}
			}
			return true
		})
	}
	for name := range sentinels {
		// "<Name>: <when>. <What to do>."
		require.Regexp(t, regexp.MustCompile(`(?s)^`+name+`: .+\. [A-Z].+\.\s*$`), documented[name], name)
	}
	// Every sentinel is in this test.
	require.Len(t, sentinels, strings.Count(strings.Join(slices.Collect(maps.Keys(documented)), " "), "Err"))
}
