package redistest

import (
	"os/exec"
	"syscall"
)

// dieWithParent has the kernel kill the server when the process that
// started it dies, even by kill -9, so that no server outlives a test
// binary or lockcheck.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
