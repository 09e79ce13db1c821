//go:build !linux

package redistest

import "os/exec"

// dieWithParent does nothing here: only Linux kills a child with its
// parent (Pdeathsig).
func dieWithParent(*exec.Cmd) {}
