package devstack

import (
	"archive/tar"
	"archive/zip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	embeddedpostgres "github.com/fergusstrange/embedded-postgres"
	"github.com/xi2/xz"
)

// pgBuild is one PostgreSQL server build published as a Maven artifact
// (io.zonky.test.postgres:embedded-postgres-binaries-<platform>:<version>):
// a jar holding one xz-compressed tar with bin/, lib/ and share/. The builds
// are relocatable, so they run from wherever they are unpacked.
type pgBuild struct {
	Version  string // e.g. 17.5.0 (PostgreSQL 17.5)
	Platform string // e.g. linux-amd64
	SHA256   string // of the jar, pinned here rather than trusted from the repository
}

// pgBuilds pins the server build fetched when no PostgreSQL is installed.
// To move to another version, take the jar's SHA-256 from a download you
// checked, not from the repository's .sha256 file alone.
var pgBuilds = map[string]pgBuild{
	"linux/amd64": {Version: "17.5.0", Platform: "linux-amd64", SHA256: "646f3269075d1a23904127374e3cdbcef96beb32979fedee25d835877400fcbe"},
	"linux/arm64": {Version: "17.5.0", Platform: "linux-arm64v8", SHA256: "e02f27ff50ff2d90b6541d54f3f108505aacd84ea53c2890e976a684bfea2752"},
}

// Major is the PostgreSQL major version, which decides data dir compatibility.
func (b pgBuild) Major() int {
	major, _, _ := strings.Cut(b.Version, ".")
	n, _ := strconv.Atoi(major)
	return n
}

func (b pgBuild) jarName() string {
	return fmt.Sprintf("embedded-postgres-binaries-%s-%s.jar", b.Platform, b.Version)
}

// url is where a Maven repository keeps the jar: group path, artifact,
// version, file.
func (b pgBuild) url(repository string) string {
	return fmt.Sprintf("%s/io/zonky/test/postgres/embedded-postgres-binaries-%s/%s/%s",
		strings.TrimRight(repository, "/"), b.Platform, b.Version, b.jarName())
}

// PGRepositoryEnv names the Maven Central repository base URL (or a mirror
// of it) that PostgreSQL server builds are downloaded from.
const PGRepositoryEnv = "CLAIMFLOW_PG_REPOSITORY"

// defaultPGRepository is the Maven Central repository base URL that
// embedded-postgres downloads the same artifacts from. The library exports
// only a setter for it, so it is read from its default configuration: this
// keeps one source for that address instead of a second copy here.
// TestDefaultPGRepository fails if a library upgrade moves the field.
func defaultPGRepository() string {
	v := reflect.ValueOf(embeddedpostgres.DefaultConfig()).FieldByName("binaryRepositoryURL")
	if !v.IsValid() || v.Kind() != reflect.String {
		return ""
	}
	return v.String()
}

// pgRepository resolves the repository base URL: option, then environment,
// then the library's default.
func pgRepository(opt string) string {
	if opt != "" {
		return opt
	}
	if env := os.Getenv(PGRepositoryEnv); env != "" {
		return env
	}
	return defaultPGRepository()
}

// PGLookupEnv overrides where a system PostgreSQL is looked for: "none"
// hides any system install (the downloaded build is used, as on a machine
// with only Go), otherwise a list of directories separated like PATH.
const PGLookupEnv = "CLAIMFLOW_PG_LOOKUP"

// pgBinaries are the server binaries a private cluster needs.
var pgBinaries = []string{"initdb", "pg_ctl", "postgres"}

// pgBinSource is the directory the cluster's binaries come from, and why.
type pgBinSource struct {
	Dir    string
	Origin string // "--pg-bin", "system" or "downloaded"
	Major  int
}

// hasPGBinaries reports whether dir holds executable initdb, pg_ctl and postgres.
func hasPGBinaries(dir string) bool {
	for _, name := range pgBinaries {
		if !isExecutable(filepath.Join(dir, name)) {
			return false
		}
	}
	return true
}

// pgLookupDirs lists where a system PostgreSQL may be: the options'
// directories, else $CLAIMFLOW_PG_LOOKUP, else PATH followed by Debian's
// versioned /usr/lib/postgresql/<major>/bin (newest first), which are not on
// PATH by default. nil means: do not look.
func pgLookupDirs(o PostgresOptions) []string {
	if o.HideSystemPostgres {
		return nil
	}
	if o.LookupDirs != nil {
		return o.LookupDirs
	}
	if env := os.Getenv(PGLookupEnv); env != "" {
		if env == "none" {
			return nil
		}
		return filepath.SplitList(env)
	}
	dirs := filepath.SplitList(os.Getenv("PATH"))
	versioned, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(versioned, func(a, b string) int {
		return pgDirMajor(b) - pgDirMajor(a)
	})
	return append(dirs, versioned...)
}

func pgDirMajor(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

// findSystemPG returns the first directory holding the server binaries.
func findSystemPG(dirs []string) (string, bool) {
	for _, d := range dirs {
		if d == "" {
			continue
		}
		if hasPGBinaries(d) {
			abs, err := filepath.Abs(d)
			if err != nil {
				return d, true
			}
			return abs, true
		}
	}
	return "", false
}

var pgVersionRE = regexp.MustCompile(`\(PostgreSQL\) (\d+)`)

// binMajor asks the binaries for their major version. initdb --version is
// safe as root: only initializing refuses.
func binMajor(ctx context.Context, dir string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, filepath.Join(dir, "initdb"), "--version").CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("%s --version: %w\n%s", filepath.Join(dir, "initdb"), err, trimOutput(out))
	}
	m := pgVersionRE.FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("%s --version printed no PostgreSQL version: %q", filepath.Join(dir, "initdb"), out)
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n, nil
}

// choosePGBinaries picks the binaries for the cluster: --pg-bin, else a
// system install, else the pinned build from the user's cache, downloading
// it on first use.
func choosePGBinaries(ctx context.Context, o PostgresOptions) (pgBinSource, error) {
	if o.BinDir != "" {
		dir, err := filepath.Abs(o.BinDir)
		if err != nil {
			return pgBinSource{}, fmt.Errorf("--pg-bin %s: %w", o.BinDir, err)
		}
		if !hasPGBinaries(dir) {
			return pgBinSource{}, fmt.Errorf("--pg-bin %s: it must hold executable %s (the bin directory of a PostgreSQL server install)",
				dir, strings.Join(pgBinaries, ", "))
		}
		major, err := binMajor(ctx, dir)
		return pgBinSource{Dir: dir, Origin: "--pg-bin", Major: major}, err
	}
	lookup := pgLookupDirs(o)
	if dir, ok := findSystemPG(lookup); ok {
		major, err := binMajor(ctx, dir)
		return pgBinSource{Dir: dir, Origin: "system", Major: major}, err
	}
	build := o.build
	if build == nil {
		b, ok := pgBuilds[runtime.GOOS+"/"+runtime.GOARCH]
		if !ok {
			return pgBinSource{}, fmt.Errorf("no PostgreSQL server binaries found and no build pinned for %s/%s to download: %s",
				runtime.GOOS, runtime.GOARCH, pgWaysOut)
		}
		build = &b
	}
	if _, err := os.Stat("/etc/alpine-release"); err == nil {
		return pgBinSource{}, fmt.Errorf("no PostgreSQL server binaries found, and the pinned build needs glibc, which Alpine lacks: %s", pgWaysOut)
	}
	cache, err := pgCacheDir(o.CacheDir)
	if err != nil {
		return pgBinSource{}, err
	}
	dir, err := ensurePGBuild(ctx, *build, cache, pgRepository(o.Repository), o.Progress)
	if err != nil {
		looked := "system lookup off: " + PGLookupEnv + "=none"
		switch {
		case o.HideSystemPostgres:
			looked = "system lookup off"
		case o.LookupDirs != nil || (os.Getenv(PGLookupEnv) != "" && len(lookup) > 0):
			looked = "looked in " + strings.Join(lookup, string(os.PathListSeparator))
		case len(lookup) > 0:
			looked = "looked on PATH and in /usr/lib/postgresql/*/bin"
		}
		return pgBinSource{}, fmt.Errorf("no PostgreSQL server binaries: none installed (%s), none cached in %s, and fetching PostgreSQL %s failed: %w\n%s",
			looked, filepath.Join(cache, build.Version), build.Version, err, pgWaysOut)
	}
	return pgBinSource{Dir: filepath.Join(dir, "bin"), Origin: "downloaded", Major: build.Major()}, nil
}

// pgWaysOut is the advice given whenever no server binaries can be had.
const pgWaysOut = "three ways out: install PostgreSQL (e.g. apt-get install postgresql) or pass --pg-bin with its bin directory; " +
	"set DATABASE_URL to a server you already run; or connect to the network once so the server build can be fetched into the cache"

func pgCacheDir(opt string) (string, error) {
	if opt != "" {
		return filepath.Abs(opt)
	}
	base, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("locate the user cache directory for the PostgreSQL build (set XDG_CACHE_HOME or HOME): %w", err)
	}
	return filepath.Join(base, "claimflow", "postgres"), nil
}

// ensurePGBuild returns <cache>/<version>, fetching and unpacking the build
// if it is not there yet. The jar stays next to it (<cache>/<jar>), so a
// damaged unpack can be redone without the network.
func ensurePGBuild(ctx context.Context, b pgBuild, cache, repository string, progress io.Writer) (string, error) {
	if progress == nil {
		progress = os.Stderr
	}
	dir := filepath.Join(cache, b.Version)
	if hasPGBinaries(filepath.Join(dir, "bin")) {
		return dir, nil
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", fmt.Errorf("create the PostgreSQL cache %s: %w", cache, err)
	}
	// Parallel test binaries or two clones starting at once must not
	// download and unpack over each other.
	unlock, err := lockFile(ctx, filepath.Join(cache, "."+b.Version+".lock"), progress, "a fetch of PostgreSQL "+b.Version)
	if err != nil {
		return "", err
	}
	defer unlock()
	if hasPGBinaries(filepath.Join(dir, "bin")) {
		return dir, nil
	}

	jar := filepath.Join(cache, b.jarName())
	if err := verifySHA256(jar, b.SHA256); err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			slog.WarnContext(ctx, "cached PostgreSQL jar is unusable; downloading it again", "jar", jar, "err", err)
		}
		if repository == "" {
			return "", fmt.Errorf("no repository to download from: set %s to the Maven Central repository base URL", PGRepositoryEnv)
		}
		if err := downloadFile(ctx, b.url(repository), jar, b.SHA256, progress); err != nil {
			return "", err
		}
	}
	t := time.Now()
	fmt.Fprintf(progress, "unpacking PostgreSQL %s into %s...\n", b.Version, dir)
	if err := unpackPGJar(jar, dir); err != nil {
		return "", err
	}
	if !hasPGBinaries(filepath.Join(dir, "bin")) {
		return "", fmt.Errorf("unpacked %s into %s, but it has no bin/%s: not a PostgreSQL server build", jar, dir, strings.Join(pgBinaries, ", bin/"))
	}
	slog.InfoContext(ctx, "postgres build unpacked", "version", b.Version, "dir", dir, "took", time.Since(t).Round(time.Millisecond))
	return dir, nil
}

func verifySHA256(path, want string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		return fmt.Errorf("SHA-256 of %s is %s, want %s (pinned in the source)", path, got, want)
	}
	return nil
}

// pgHTTPClient fails fast when the network is absent (dial, TLS and header
// timeouts) while the whole download gets the context's longer deadline.
var pgHTTPClient = &http.Client{Transport: &http.Transport{
	Proxy:                 http.ProxyFromEnvironment,
	DialContext:           (&net.Dialer{Timeout: 15 * time.Second}).DialContext,
	TLSHandshakeTimeout:   15 * time.Second,
	ResponseHeaderTimeout: 30 * time.Second,
}}

// downloadFile fetches url into dst, checking the pinned SHA-256 before the
// file takes its final name, and reports progress every few seconds.
func downloadFile(ctx context.Context, url, dst, wantSHA string, progress io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("download %s: %w", url, err)
	}
	fmt.Fprintf(progress, "downloading PostgreSQL server build %s...\n", url)
	start := time.Now()
	resp, err := pgHTTPClient.Do(req)
	if err != nil {
		return fmt.Errorf("download %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("download %s: %s", url, resp.Status)
	}

	tmp, err := os.CreateTemp(filepath.Dir(dst), filepath.Base(dst)+".tmp-*")
	if err != nil {
		return fmt.Errorf("download %s: %w", url, err)
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	defer tmp.Close()

	h := sha256.New()
	pr := &progressReader{r: resp.Body, total: resp.ContentLength, w: progress, every: 3 * time.Second, last: time.Now()}
	n, err := io.Copy(io.MultiWriter(tmp, h), pr)
	if err != nil {
		return fmt.Errorf("download %s after %s: %w", url, mib(n), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("download %s: %w", url, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != wantSHA {
		return fmt.Errorf("download %s: SHA-256 is %s, want %s (pinned in the source): refusing to use it", url, got, wantSHA)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return fmt.Errorf("download %s: %w", url, err)
	}
	fmt.Fprintf(progress, "downloaded %s in %s, SHA-256 verified\n", mib(n), time.Since(start).Round(100*time.Millisecond))
	return nil
}

func mib(n int64) string { return fmt.Sprintf("%.1f MB", float64(n)/1e6) }

// progressReader prints how much of a download arrived, at most every
// `every`, so a slow link shows movement rather than a silent pause.
type progressReader struct {
	r     io.Reader
	n     int64
	total int64 // -1 when unknown
	w     io.Writer
	every time.Duration
	last  time.Time
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	p.n += int64(n)
	if time.Since(p.last) >= p.every {
		p.last = time.Now()
		if p.total > 0 {
			fmt.Fprintf(p.w, "  . %s of %s (%d%%)\n", mib(p.n), mib(p.total), p.n*100/p.total)
		} else {
			fmt.Fprintf(p.w, "  . %s\n", mib(p.n))
		}
	}
	return n, err
}

// unpackPGJar extracts the .txz inside jar into dir. It unpacks into a
// sibling temporary directory and renames it into place, so dir either is
// complete or does not exist.
func unpackPGJar(jar, dir string) error {
	zr, err := zip.OpenReader(jar)
	if err != nil {
		return fmt.Errorf("open %s as a zip: %w", jar, err)
	}
	defer zr.Close()
	var txz *zip.File
	for _, f := range zr.File {
		if !f.FileInfo().IsDir() && strings.HasSuffix(f.Name, ".txz") {
			txz = f
			break
		}
	}
	if txz == nil {
		return fmt.Errorf("%s holds no .txz: not a PostgreSQL server build", jar)
	}
	rc, err := txz.Open()
	if err != nil {
		return fmt.Errorf("open %s in %s: %w", txz.Name, jar, err)
	}
	defer rc.Close()

	tmp, err := os.MkdirTemp(filepath.Dir(dir), filepath.Base(dir)+".tmp-*")
	if err != nil {
		return fmt.Errorf("unpack %s: %w", jar, err)
	}
	defer os.RemoveAll(tmp) // gone after the rename
	if err := os.Chmod(tmp, 0o755); err != nil {
		return fmt.Errorf("unpack %s: %w", jar, err)
	}
	if err := untarXZ(rc, tmp); err != nil {
		return fmt.Errorf("unpack %s from %s: %w", txz.Name, jar, err)
	}
	// A leftover partial dir (no bin/ binaries, else we would not be
	// here) would make the rename fail.
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove incomplete %s: %w", dir, err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		return fmt.Errorf("move unpacked PostgreSQL into %s: %w", dir, err)
	}
	return nil
}

// untarXZ extracts regular files, directories and symlinks, refusing any
// entry or link target that would land outside dst.
func untarXZ(r io.Reader, dst string) error {
	xr, err := xz.NewReader(r, 0)
	if err != nil {
		return fmt.Errorf("xz: %w", err)
	}
	tr := tar.NewReader(xr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("tar: %w", err)
		}
		name := filepath.Clean(h.Name)
		if !filepath.IsLocal(name) {
			return fmt.Errorf("tar entry %q points outside the target directory", h.Name)
		}
		target := filepath.Join(dst, name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o755); err != nil {
				return err
			}
			continue
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return err
			}
			// Only permission bits, never setuid/setgid; and readable by
			// all, because as root the cluster runs as another user.
			mode := fs.FileMode(h.Mode).Perm() | 0o444
			f, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("write %s: %w", name, err)
			}
		case tar.TypeSymlink:
			link := h.Linkname
			if filepath.IsAbs(link) || !filepath.IsLocal(filepath.Join(filepath.Dir(name), link)) {
				return fmt.Errorf("tar symlink %q -> %q points outside the target directory", h.Name, h.Linkname)
			}
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return err
			}
			if err := os.Symlink(link, target); err != nil {
				return err
			}
		default:
			// Hard links, devices and the like do not occur in these
			// builds; skipping beats failing on a harmless extra.
		}
	}
}
