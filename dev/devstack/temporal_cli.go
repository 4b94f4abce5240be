package devstack

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// temporalCLIPackage is built from tools/go.mod, which pins the CLI version.
// It cannot live in the main go.mod: the server it embeds needs an older
// go.temporal.io/api than the SDK the application uses.
const (
	temporalCLIModule  = "github.com/temporalio/cli"
	temporalCLIPackage = temporalCLIModule + "/cmd/temporal"
)

// toolsGoMod and toolsGoSum are tools/go.mod and tools/go.sum, which pin
// the CLI and every module it is built from, copied into this package so
// that a built or installed claimflow binary carries its pins and runs
// `claimflow dev` outside a checkout (TestPinsAreTheToolsModule ties the
// copies to the originals).
//
//go:embed tools.go.mod
var toolsGoMod []byte

//go:embed tools.go.sum
var toolsGoSum []byte

// TemporalCLI returns the path to a `temporal` CLI binary, building it on
// first use. Lookup order: $TEMPORAL_CLI if it names an executable file,
// then <user cache dir>/claimflow/temporal-cli/<version>/temporal, where
// <version> is the CLI version pinned in tools/go.mod; otherwise it builds
// that binary from the pins this binary carries, with the go toolchain. The
// cache is per user, not per clone: a cold build is slow and memory-hungry
// (docs/performance.md, First start), and every clone and installed binary
// of the same version reuses it. Progress goes to progress (which may be
// nil).
func TemporalCLI(ctx context.Context, progress io.Writer) (string, error) {
	if progress == nil {
		progress = io.Discard
	}
	if p := os.Getenv("TEMPORAL_CLI"); p != "" {
		if isExecutable(p) {
			return p, nil
		}
		slog.WarnContext(ctx, "TEMPORAL_CLI is not an executable file; falling back to the user cache", "TEMPORAL_CLI", p)
	}
	bin, err := TemporalCLIPath()
	if err != nil {
		return "", err
	}
	if isExecutable(bin) {
		return bin, nil
	}

	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		return "", fmt.Errorf("create %s: %w", filepath.Dir(bin), err)
	}
	// Two processes (say, test binaries of two packages run by one `go test
	// ./...`, or two clones) must not both spend minutes and gigabytes on
	// the same build.
	unlock, err := lockFile(ctx, filepath.Join(filepath.Dir(bin), ".build.lock"), progress, "a build of the Temporal CLI")
	if err != nil {
		return "", err
	}
	defer unlock()
	if isExecutable(bin) { // built by whoever held the lock before us
		return bin, nil
	}
	if err := buildTemporalCLI(ctx, bin, progress); err != nil {
		return "", err
	}
	return bin, nil
}

// TemporalCLIPath is where TemporalCLI keeps the pinned CLI:
// <user cache dir>/claimflow/temporal-cli/<version>/temporal. .ci/run builds
// to the same place.
func TemporalCLIPath() (string, error) {
	version, err := temporalCLIVersion(toolsGoMod)
	if err != nil {
		return "", err
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("locate the user cache directory for the Temporal CLI (set XDG_CACHE_HOME or HOME, or set TEMPORAL_CLI): %w", err)
	}
	return filepath.Join(cache, "claimflow", "temporal-cli", version, "temporal"), nil
}

// temporalCLIVersion reads the version of the CLI module a go.mod
// requires, which keys the cache: a version bump builds anew.
func temporalCLIVersion(goMod []byte) (string, error) {
	// A line scan is enough for `require` lines in either block or single
	// form, and spares a dependency on a go.mod parser.
	for line := range strings.Lines(string(goMod)) {
		f := strings.Fields(line)
		if len(f) > 0 && f[0] == "require" {
			f = f[1:]
		}
		if len(f) >= 2 && f[0] == temporalCLIModule {
			return f[1], nil
		}
	}
	return "", fmt.Errorf("tools/go.mod requires no %s: cannot tell which Temporal CLI version to build", temporalCLIModule)
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
			fmt.Fprintf(progress, "%s is already in progress; waiting for it...\n", what)
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

func buildTemporalCLI(ctx context.Context, bin string, progress io.Writer) error {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return fmt.Errorf("the Temporal CLI is not built and the go toolchain is not on PATH to build it: install Go or set TEMPORAL_CLI: %w", err)
	}
	// The pinned module, written out: the build needs no checkout.
	mod, err := os.MkdirTemp("", "claimflow-temporal-cli-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(mod)
	for name, b := range map[string][]byte{"go.mod": toolsGoMod, "go.sum": toolsGoSum} {
		if err := os.WriteFile(filepath.Join(mod, name), b, 0o644); err != nil {
			return err
		}
	}
	// Build next to the target and rename, so an interrupted build never
	// leaves a truncated binary that later runs would trust.
	tmp := fmt.Sprintf("%s.tmp-%d", bin, os.Getpid())
	defer os.Remove(tmp)

	cmd := exec.CommandContext(ctx, goBin, "build", "-o", tmp, temporalCLIPackage)
	cmd.Dir = mod
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	// The go command forks compilers and the linker; on cancel kill them
	// all rather than leave them burning CPU and memory.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }

	fmt.Fprintf(progress, "building the Temporal CLI into %s (once per version and user; a few minutes on a cold Go build cache)...\n", bin)
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
		return fmt.Errorf("build the Temporal CLI (go build -o %s %s, in a module of tools/go.mod and go.sum): %w\n%s",
			bin, temporalCLIPackage, err, trimOutput(out.Bytes()))
	}
	if err := os.Rename(tmp, bin); err != nil {
		return fmt.Errorf("move the built Temporal CLI into place: %w", err)
	}
	fmt.Fprintf(progress, "built the Temporal CLI in %s: %s\n", time.Since(start).Round(time.Second), bin)
	return nil
}
