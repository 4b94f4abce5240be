package devstack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// temporalCLIPackage is built from tools/go.mod, which pins the CLI version.
// It cannot live in the main go.mod: the server it embeds needs an older
// go.temporal.io/api than the SDK the application uses.
const temporalCLIPackage = "github.com/temporalio/cli/cmd/temporal"

// TemporalCLI returns the path to a `temporal` CLI binary, building it on
// first use. Lookup order: $TEMPORAL_CLI if it names an executable file, then
// <repo>/bin/temporal, otherwise it builds <repo>/bin/temporal from
// <repo>/tools (the repo root is the first directory above the working
// directory that contains tools/go.mod). A cold build takes minutes and about
// 1.8 GB of RAM, so it reports progress to progress (which may be nil).
func TemporalCLI(ctx context.Context, progress io.Writer) (string, error) {
	if progress == nil {
		progress = io.Discard
	}
	if p := os.Getenv("TEMPORAL_CLI"); p != "" {
		if isExecutable(p) {
			return p, nil
		}
		slog.WarnContext(ctx, "TEMPORAL_CLI is not an executable file; falling back to the repo's bin/temporal", "TEMPORAL_CLI", p)
	}

	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("locate the repo root: %w", err)
	}
	root, err := findRepoRoot(wd)
	if err != nil {
		return "", err
	}
	bin := filepath.Join(root, "bin", "temporal")
	if isExecutable(bin) {
		return bin, nil
	}

	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		return "", fmt.Errorf("create %s: %w", filepath.Dir(bin), err)
	}
	// Two processes (say, test binaries of two packages run by one `go test
	// ./...`) must not both spend minutes and gigabytes on the same build.
	unlock, err := lockFile(ctx, filepath.Join(root, "bin", ".temporal.build.lock"), progress, "a build of the Temporal CLI")
	if err != nil {
		return "", err
	}
	defer unlock()
	if isExecutable(bin) { // built by whoever held the lock before us
		return bin, nil
	}
	if err := buildTemporalCLI(ctx, root, bin, progress); err != nil {
		return "", err
	}
	return bin, nil
}

// findRepoRoot walks up from dir to the first directory holding tools/go.mod.
func findRepoRoot(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("locate the repo root: %w", err)
	}
	for d := dir; ; {
		if _, err := os.Stat(filepath.Join(d, "tools", "go.mod")); err == nil {
			return d, nil
		}
		parent := filepath.Dir(d)
		if parent == d {
			return "", fmt.Errorf("no tools/go.mod found in %s or any parent directory: run from inside the claimflow repo, or set TEMPORAL_CLI to a temporal CLI binary", dir)
		}
		d = parent
	}
}

func isExecutable(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular() && st.Size() > 0 && st.Mode().Perm()&0o111 != 0
}

// lockFile takes an exclusive flock on path, polling so that ctx can cancel
// the wait (a blocking flock cannot be interrupted).
// what names the work being waited for in the progress message.
func lockFile(ctx context.Context, path string, progress io.Writer, what string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open build lock %s: %w", path, err)
	}
	announced := false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() {
				_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
				f.Close()
			}, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		if !announced {
			fmt.Fprintf(progress, "%s is in progress in another process; waiting for it...\n", what)
			announced = true
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("waiting for %s (lock %s): %w", what, path, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func buildTemporalCLI(ctx context.Context, root, bin string, progress io.Writer) error {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return fmt.Errorf("the Temporal CLI is not built and the go toolchain is not on PATH to build it: install Go or set TEMPORAL_CLI: %w", err)
	}
	// Build next to the target and rename, so an interrupted build never
	// leaves a truncated bin/temporal that later runs would trust.
	tmp := fmt.Sprintf("%s.tmp-%d", bin, os.Getpid())
	defer os.Remove(tmp)

	cmd := exec.CommandContext(ctx, goBin, "build", "-o", tmp, temporalCLIPackage)
	cmd.Dir = filepath.Join(root, "tools")
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	// The go command forks compilers and the linker; on cancel kill them
	// all rather than leave them burning CPU and memory.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }

	fmt.Fprintln(progress, "building the Temporal CLI (first use, takes a few minutes)...")
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start `go build %s`: %w", temporalCLIPackage, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	tick := time.NewTicker(15 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			fmt.Fprintf(progress, "  . still building the Temporal CLI (%s elapsed)\n", time.Since(start).Round(time.Second))
			continue
		case err = <-done:
		}
		break
	}
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("building the Temporal CLI was interrupted: %w", ctx.Err())
		}
		return fmt.Errorf("build the Temporal CLI (cd %s && go build -o %s %s): %w\n%s",
			cmd.Dir, bin, temporalCLIPackage, err, trimOutput(out.Bytes()))
	}
	if err := os.Rename(tmp, bin); err != nil {
		return fmt.Errorf("move the built Temporal CLI into place: %w", err)
	}
	fmt.Fprintf(progress, "built the Temporal CLI in %s: %s\n", time.Since(start).Round(time.Second), bin)
	return nil
}
