//go:build unix && !linux

package devstack

import "syscall"

// groupAttr puts a child in its own process group so Stop and Kill reach
// everything it spawned. Only Linux has a parent-death signal; elsewhere a
// crash of our process can leave the server running until killed by hand.
func groupAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
