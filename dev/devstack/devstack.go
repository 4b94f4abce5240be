// Package devstack starts the local infrastructure that `claimflow dev` and
// the integration tests run against: a Temporal dev server, a Kafka-compatible
// broker (kfake) and a private PostgreSQL cluster. Everything binds to
// 127.0.0.1 and keeps its state in directories the caller chooses, so a
// restart on the same directories resumes with the same data. No Docker is
// involved: the machines this runs on do not have it.
package devstack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// startTimeout bounds how long each component may take to become ready.
// Cold starts measure well under a few seconds; the margin is for loaded CI
// machines, not for normal operation.
const startTimeout = 60 * time.Second

// FreePort returns a TCP port on 127.0.0.1 that is free right now. It is
// released before returning, so it is chosen below the kernel's ephemeral
// range: there only another listener can take it, whereas a port from the
// ephemeral range (what "127.0.0.1:0" hands out) can be taken by any outgoing
// connection before the server binds it; with several stacks starting in
// parallel that made Postgres fail with "Address already in use".
func FreePort() (int, error) {
	ports, err := FreePorts(1)
	if err != nil {
		return 0, err
	}
	return ports[0], nil
}

// FreePorts returns n different free ports, picked as FreePort picks one.
// Each stays bound until all are chosen: ports picked one by one are released
// in between, so two picks could return the same port and a stack would then
// give it to two of its servers.
func FreePorts(n int) ([]int, error) {
	lo, hi := belowEphemeralRange()
	return pickPorts(n, func() int { return lo + rand.IntN(hi-lo) })
}

// pickPorts binds each candidate until n are bound, then releases them all.
// After 100 refused candidates in a row it takes one from the kernel.
func pickPorts(n int, candidate func() int) ([]int, error) {
	held := make([]net.Listener, 0, n)
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for len(ports) < n {
		var l net.Listener
		var err error
		for range 100 {
			if l, err = net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", candidate())); err == nil {
				break
			}
		}
		if l == nil {
			if l, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
				return nil, fmt.Errorf("find a free port on 127.0.0.1: %w", err)
			}
		}
		held = append(held, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// belowEphemeralRange is where FreePort picks: from 10000 up to the start of
// the kernel's ephemeral port range (Linux default 32768).
func belowEphemeralRange() (lo, hi int) {
	lo, hi = 10000, 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		var start, end int
		if _, err := fmt.Sscan(string(b), &start, &end); err == nil && start > lo+1000 {
			hi = start
		}
	}
	return lo, hi
}

// logTail returns at most the last n lines of a log file, for error messages:
// the reason a server refused to start is almost always in its last lines.
func logTail(path string, n int) string {
	if path == "" {
		return ""
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	defer f.Close()
	// Read only the end: logs of long-lived dev servers grow large.
	const maxRead = 64 << 10
	if st, err := f.Stat(); err == nil && st.Size() > maxRead {
		if _, err := f.Seek(st.Size()-maxRead, io.SeekStart); err != nil {
			return fmt.Sprintf("(cannot read %s: %v)", path, err)
		}
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	return lastLines(b, n)
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// withTail appends a log tail to an error so the caller sees the cause
// without having to go looking for the file.
func withTail(err error, logFile string) error {
	tail := logTail(logFile, 30)
	if strings.TrimSpace(tail) == "" {
		return err
	}
	return fmt.Errorf("%w\n--- last lines of %s ---\n%s", err, logFile, tail)
}

// poll calls fn until it succeeds, ctx ends or exited is closed (the process
// being waited for died, so waiting longer is pointless). On failure it
// returns the last error fn returned, which is the useful one.
func poll(ctx context.Context, every time.Duration, fn func(context.Context) error) error {
	return pollUntilExit(ctx, every, nil, fn)
}

var errExited = errors.New("process exited")

func pollUntilExit(ctx context.Context, every time.Duration, exited <-chan struct{}, fn func(context.Context) error) error {
	var last error
	for {
		if last = fn(ctx); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last attempt: %v)", ctx.Err(), last)
		case <-exited:
			// One more try: the process may have exited after
			// handing off to a daemon (pg_ctl does exactly that).
			if err := fn(ctx); err == nil {
				return nil
			}
			return fmt.Errorf("%w (last attempt: %v)", errExited, last)
		case <-time.After(every):
		}
	}
}

// openAppend opens a log file for appending, creating its directory, so each
// restart adds to the same file instead of erasing the previous run's clues.
func openAppend(path string) (*os.File, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("create log directory for %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open log file %s: %w", path, err)
	}
	return f, nil
}

// trimOutput shortens captured command output for inclusion in an error.
func trimOutput(b []byte) string {
	return lastLines(bytes.TrimSpace(b), 30)
}
