package devstack

import "syscall"

// groupAttr puts a child in its own process group so Stop and Kill reach
// everything it spawned, and asks the kernel to SIGTERM it if we die first so
// a crashed `claimflow dev` does not leave a server holding the ports.
//
// Pdeathsig fires when the *thread* that forked the child exits, not the
// process. Go only retires threads whose goroutine exited while locked with
// runtime.LockOSThread; the goroutines calling Start here never lock, so in
// practice the signal means "our process is gone".
func groupAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}
