//go:build compat

package lockreg

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockreg/lockreg/internal/redistest"
)

// compatResult is what testdata/compat/worker.go reports.
type compatResult struct {
	Acquisitions, Overlaps, StaleTokens, Errors, Grants, LocalHandoffs int64
	FirstError                                                         string
}

// TestRollingDeploy runs a registry of the previous release (COMPAT_REV,
// taken from git history) and one of this tree, in two processes, on the
// same keys of one real Redis, as a rolling deploy has them: `make
// compat`. Neither may overlap the other, tokens must keep rising across
// them, no increment may be lost, and each must have taken grants from
// the other's releases: the wire protocol (docs/PROTOCOL.md) is shared.
func TestRollingDeploy(t *testing.T) {
	rev := os.Getenv("COMPAT_REV")
	if rev == "" {
		t.Fatal("COMPAT_REV is not set: name the previous release's commit (make compat sets it)")
	}
	root, err := os.Getwd()
	require.NoError(t, err)
	dir := t.TempDir()
	archive := exec.Command("sh", "-c", "git archive --format=tar --prefix=old/ \"$0\" | tar -x -C \"$1\"", rev, dir)
	archive.Dir = root
	out, err := archive.CombinedOutput()
	require.NoError(t, err, "export %s from git history (a clone with its history is needed): %s", rev, out)
	workers := map[string]string{
		rev:         buildCompatWorker(t, dir, "old", filepath.Join(dir, "old")),
		"this tree": buildCompatWorker(t, dir, "new", root),
	}

	srv := redistest.Start(t)
	const seconds = 10
	results := map[string]compatResult{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for version, bin := range workers {
		wg.Go(func() {
			cmd := exec.Command(bin, "-redis", srv.Addr(), "-d", strconv.Itoa(seconds)+"s")
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				t.Errorf("%s's worker: %v: %s", version, err, stderr.String())
				return
			}
			var res compatResult
			if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
				t.Errorf("%s's worker said %q: %v", version, stdout.String(), err)
				return
			}
			mu.Lock()
			results[version] = res
			mu.Unlock()
		})
	}
	wg.Wait()
	require.Len(t, results, 2)

	var total int64
	for version, res := range results {
		t.Logf("%s: %+v", version, res)
		require.Positive(t, res.Acquisitions, version)
		require.Zero(t, res.Overlaps, "%s overlapped the other", version)
		require.Zero(t, res.StaleTokens, "%s drew a token that did not rise", version)
		require.Zero(t, res.Errors, "%s: %s", version, res.FirstError)
		require.Positive(t, res.Grants, "%s took no grant from the other's releases", version)
		total += res.Acquisitions
	}
	admin := srv.Client(t)
	var counted int64
	for _, key := range []string{"a", "b"} {
		n, _ := admin.Get(t.Context(), "compat:count:"+key).Int64()
		counted += n
	}
	require.Equal(t, total, counted, "lost increments")
}

// buildCompatWorker builds testdata/compat/worker.go against the lockreg
// in lockregDir, and returns the binary's path.
func buildCompatWorker(t *testing.T, dir, name, lockregDir string) string {
	t.Helper()
	mod := filepath.Join(dir, name+"-worker")
	require.NoError(t, os.MkdirAll(mod, 0o755))
	src, err := os.ReadFile(filepath.Join("testdata", "compat", "worker.go"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(mod, "main.go"), src, 0o644))
	goMod := "module compatworker\n\ngo 1.26.0\n\nrequire github.com/lockreg/lockreg v0.0.0\n\nreplace github.com/lockreg/lockreg => " + lockregDir + "\n"
	require.NoError(t, os.WriteFile(filepath.Join(mod, "go.mod"), []byte(goMod), 0o644))
	sum, err := os.ReadFile("go.sum")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(mod, "go.sum"), sum, 0o644))
	bin := filepath.Join(dir, name+".bin")
	for _, args := range [][]string{{"mod", "tidy"}, {"build", "-o", bin, "."}} {
		cmd := exec.Command("go", args...)
		cmd.Dir = mod
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "go %v for the %s worker: %s", args, name, out)
	}
	return bin
}
