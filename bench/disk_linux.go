package bench

import (
	"os"
	"syscall"
)

// fdatasync flushes f's data (and only the metadata needed to read it
// back), as Postgres's default wal_sync_method does on Linux.
func fdatasync(f *os.File) error { return syscall.Fdatasync(int(f.Fd())) }
