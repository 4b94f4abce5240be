package devstack

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"os"
	osexec "os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestDefaultPGRepository(t *testing.T) {
	// Read from embedded-postgres's defaults by reflection: a library
	// upgrade that renames the field must fail here, not on a newcomer's
	// first start.
	if u := defaultPGRepository(); !strings.HasPrefix(u, "https://") {
		t.Fatalf("defaultPGRepository() = %q, want an https URL", u)
	}
	t.Setenv(PGRepositoryEnv, "http://mirror.invalid/maven2")
	if got := pgRepository(""); got != "http://mirror.invalid/maven2" {
		t.Errorf("pgRepository with %s set = %q", PGRepositoryEnv, got)
	}
	if got := pgRepository("http://opt.invalid"); got != "http://opt.invalid" {
		t.Errorf("pgRepository(option) = %q", got)
	}
}

func TestPGBuildPinnedForThisPlatform(t *testing.T) {
	b, ok := pgBuilds[runtime.GOOS+"/"+runtime.GOARCH]
	if !ok {
		t.Skipf("no build pinned for %s/%s", runtime.GOOS, runtime.GOARCH)
	}
	if len(b.SHA256) != 64 || b.Major() < 14 {
		t.Fatalf("pinned build %+v: want a 64-hex SHA-256 and a supported major", b)
	}
	want := "/io/zonky/test/postgres/embedded-postgres-binaries-" + b.Platform + "/" + b.Version + "/embedded-postgres-binaries-" + b.Platform + "-" + b.Version + ".jar"
	if got := b.url("http://repo/"); got != "http://repo"+want {
		t.Errorf("url = %q, want %q", got, "http://repo"+want)
	}
}

func TestPGLookup(t *testing.T) {
	good, partial := t.TempDir(), t.TempDir()
	for _, n := range pgBinaries {
		if err := os.WriteFile(filepath.Join(good, n), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(partial, "initdb"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if dir, ok := findSystemPG([]string{"", partial, good}); !ok || dir != good {
		t.Errorf("findSystemPG = %q, %v; want %q (a dir with only initdb does not count)", dir, ok, good)
	}
	if _, ok := findSystemPG(nil); ok {
		t.Error("findSystemPG(nil) found something")
	}

	t.Setenv(PGLookupEnv, "none")
	if d := pgLookupDirs(PostgresOptions{}); d != nil {
		t.Errorf("%s=none: lookup dirs %v, want none", PGLookupEnv, d)
	}
	t.Setenv(PGLookupEnv, partial+string(os.PathListSeparator)+good)
	if d := pgLookupDirs(PostgresOptions{}); len(d) != 2 || d[1] != good {
		t.Errorf("%s=list: lookup dirs %v", PGLookupEnv, d)
	}
	t.Setenv(PGLookupEnv, "")
	if d := pgLookupDirs(PostgresOptions{HideSystemPostgres: true, LookupDirs: []string{good}}); d != nil {
		t.Errorf("HideSystemPostgres: lookup dirs %v, want none", d)
	}
	if d := pgLookupDirs(PostgresOptions{LookupDirs: []string{good}}); len(d) != 1 {
		t.Errorf("LookupDirs: %v", d)
	}

	_, err := choosePGBinaries(context.Background(), PostgresOptions{BinDir: partial})
	if err == nil || !strings.Contains(err.Error(), "--pg-bin") {
		t.Errorf("--pg-bin without pg_ctl and postgres: err = %v", err)
	}
}

// fakeTXZ builds an xz-compressed tar with the system xz tool (the Go side
// only decodes).
func fakeTXZ(t *testing.T, files map[string]string, symlinks map[string]string) []byte {
	t.Helper()
	xzPath, err := osexec.LookPath("xz")
	if err != nil {
		t.Skip("xz is not installed: cannot build a fake server build")
	}
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	for name, body := range files {
		mode := int64(0o644)
		if strings.HasPrefix(name, "bin/") {
			mode = 0o4755 // setuid must be dropped on unpack
		}
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: mode, Size: int64(len(body)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	for name, target := range symlinks {
		if err := tw.WriteHeader(&tar.Header{Name: name, Linkname: target, Typeflag: tar.TypeSymlink, Mode: 0o777}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	cmd := osexec.Command(xzPath, "--check=crc64", "-c")
	cmd.Stdin = &tb
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func fakeJar(t *testing.T, entries map[string][]byte) []byte {
	t.Helper()
	var b bytes.Buffer
	zw := zip.NewWriter(&b)
	for name, body := range entries {
		w, err := zw.Create(name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(body); err != nil {
			t.Fatal(err)
		}
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// jarServer serves body at any path ending in the build's jar name and
// counts requests, standing in for the repository.
func jarServer(t *testing.T, b pgBuild, body []byte) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if !strings.HasSuffix(r.URL.Path, "-"+b.Platform+"/"+b.Version+"/"+b.jarName()) {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		_, _ = w.Write(body)
	}))
	t.Cleanup(srv.Close)
	return srv, &hits
}

func TestPGBuildFetchVerifyUnpack(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	files := map[string]string{
		"bin/initdb": "#!/bin/sh\n", "bin/pg_ctl": "#!/bin/sh\n", "bin/postgres": "#!/bin/sh\n",
		"lib/libpq.so.5.17":         "elf",
		"share/postgresql/x.sample": "x",
	}
	txz := fakeTXZ(t, files, map[string]string{"lib/libpq.so.5": "libpq.so.5.17"})
	jar := fakeJar(t, map[string][]byte{"META-INF/MANIFEST.MF": []byte("Manifest-Version: 1.0\n"), "postgres-linux-x86_64.txz": txz})
	b := pgBuild{Version: "99.1.0", Platform: "test-amd64", SHA256: sha256Hex(jar)}
	srv, hits := jarServer(t, b, jar)

	t.Run("pinned SHA-256 mismatch is refused", func(t *testing.T) {
		cache := t.TempDir()
		bad := b
		bad.SHA256 = strings.Repeat("0", 64)
		_, err := ensurePGBuild(ctx, bad, cache, srv.URL, tWriter{t})
		if err == nil || !strings.Contains(err.Error(), "SHA-256") {
			t.Fatalf("err = %v, want a SHA-256 mismatch", err)
		}
		if left, _ := os.ReadDir(cache); len(left) > 1 { // only the lock file may remain
			t.Errorf("cache after a refused download holds %v", left)
		}
	})
	t.Run("not found", func(t *testing.T) {
		other := b
		other.Version = "98.0.0"
		_, err := ensurePGBuild(ctx, other, t.TempDir(), srv.URL, tWriter{t})
		if err == nil || !strings.Contains(err.Error(), "404") {
			t.Fatalf("err = %v, want a 404", err)
		}
	})
	t.Run("jar without a txz", func(t *testing.T) {
		empty := fakeJar(t, map[string][]byte{"META-INF/MANIFEST.MF": []byte("x")})
		eb := pgBuild{Version: "97.0.0", Platform: "test-amd64", SHA256: sha256Hex(empty)}
		esrv, _ := jarServer(t, eb, empty)
		_, err := ensurePGBuild(ctx, eb, t.TempDir(), esrv.URL, tWriter{t})
		if err == nil || !strings.Contains(err.Error(), "no .txz") {
			t.Fatalf("err = %v, want 'no .txz'", err)
		}
	})
	t.Run("entries escaping the target are refused", func(t *testing.T) {
		evil := fakeJar(t, map[string][]byte{"p.txz": fakeTXZ(t, map[string]string{"../escaped": "x"}, nil)})
		vb := pgBuild{Version: "96.0.0", Platform: "test-amd64", SHA256: sha256Hex(evil)}
		vsrv, _ := jarServer(t, vb, evil)
		cache := t.TempDir()
		_, err := ensurePGBuild(ctx, vb, filepath.Join(cache, "c"), vsrv.URL, tWriter{t})
		if err == nil || !strings.Contains(err.Error(), "outside") {
			t.Fatalf("err = %v, want a refusal", err)
		}
		if _, err := os.Stat(filepath.Join(cache, "escaped")); err == nil {
			t.Fatal("a tar entry was written outside the cache")
		}
		link := fakeJar(t, map[string][]byte{"p.txz": fakeTXZ(t, nil, map[string]string{"lib/x": "../../etc/passwd"})})
		lb := pgBuild{Version: "95.0.0", Platform: "test-amd64", SHA256: sha256Hex(link)}
		lsrv, _ := jarServer(t, lb, link)
		if _, err := ensurePGBuild(ctx, lb, cache, lsrv.URL, tWriter{t}); err == nil || !strings.Contains(err.Error(), "outside") {
			t.Fatalf("symlink out of the tree: err = %v, want a refusal", err)
		}
	})
	t.Run("unpacks once, then works offline", func(t *testing.T) {
		cache := t.TempDir()
		dir, err := ensurePGBuild(ctx, b, cache, srv.URL, tWriter{t})
		if err != nil {
			t.Fatal(err)
		}
		if dir != filepath.Join(cache, b.Version) {
			t.Errorf("dir = %q", dir)
		}
		st, err := os.Stat(filepath.Join(dir, "bin", "initdb"))
		if err != nil || st.Mode().Perm() != 0o755 || st.Mode()&os.ModeSetuid != 0 {
			t.Errorf("bin/initdb: %v, mode %v; want 0755 without setuid", err, st.Mode())
		}
		if target, err := os.Readlink(filepath.Join(dir, "lib", "libpq.so.5")); err != nil || target != "libpq.so.5.17" {
			t.Errorf("symlink: %q, %v", target, err)
		}
		n := hits.Load()
		// Offline now: the unpacked build is reused without a request.
		again, err := ensurePGBuild(ctx, b, cache, "http://127.0.0.1:1", tWriter{t})
		if err != nil || again != dir || hits.Load() != n {
			t.Fatalf("second call: %q, %v, %d requests", again, err, hits.Load()-n)
		}
		// A damaged unpack is redone from the cached jar, still offline.
		if err := os.Remove(filepath.Join(dir, "bin", "postgres")); err != nil {
			t.Fatal(err)
		}
		if _, err := ensurePGBuild(ctx, b, cache, "http://127.0.0.1:1", tWriter{t}); err != nil {
			t.Fatalf("re-unpack from the cached jar: %v", err)
		}
		if !hasPGBinaries(filepath.Join(dir, "bin")) {
			t.Fatal("re-unpack did not restore bin/postgres")
		}
	})
}

func TestPostgresNoNetworkNoCache(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv := httptest.NewServer(http.NotFoundHandler())
	offline := srv.URL
	srv.Close() // connections to it are now refused, like a machine offline

	t.Setenv(PGLookupEnv, "none")
	_, err := StartPostgres(ctx, PostgresOptions{
		DataDir:    filepath.Join(t.TempDir(), "pg"),
		Port:       freePort(t),
		Repository: offline,
		CacheDir:   t.TempDir(),
		Progress:   tWriter{t},
	})
	if err == nil {
		t.Fatal("started without binaries, network or cache")
	}
	t.Log(err)
	for _, want := range []string{"install PostgreSQL", "--pg-bin", "DATABASE_URL", "connect to the network once", "connection refused"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q", want)
		}
	}
}

// cachedJar returns the real server build jar from the user's cache (put
// there by any earlier `claimflow dev` without a system PostgreSQL). With
// DEVSTACK_TEST_DOWNLOAD=1 a missing jar is fetched into that cache first,
// so CI does not depend on which package ran first.
func cachedJar(t *testing.T) (pgBuild, []byte) {
	t.Helper()
	b, ok := pgBuilds[runtime.GOOS+"/"+runtime.GOARCH]
	if !ok {
		t.Skipf("no build pinned for %s/%s", runtime.GOOS, runtime.GOARCH)
	}
	cache, err := pgCacheDir("")
	if err != nil {
		t.Skip(err)
	}
	path := filepath.Join(cache, b.jarName())
	if _, err := os.Stat(path); err != nil && os.Getenv("DEVSTACK_TEST_DOWNLOAD") == "1" {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if _, err := ensurePGBuild(ctx, b, cache, pgRepository(""), tWriter{t}); err != nil {
			t.Fatal(err)
		}
	}
	jar, err := os.ReadFile(path)
	if err != nil {
		t.Skipf("no cached server build (%v): run `claimflow dev` once without a system PostgreSQL, or set DEVSTACK_TEST_DOWNLOAD=1", err)
	}
	return b, jar
}

// TestPostgresWithoutSystemInstall runs the private cluster the way a
// machine with only Go does: no initdb on PATH or in the usual directories,
// the build fetched (here from a local server holding the real jar),
// verified, unpacked into the cache, then started, restarted offline and
// queried.
func TestPostgresWithoutSystemInstall(t *testing.T) {
	b, jar := cachedJar(t)
	srv, hits := jarServer(t, b, jar)
	emptyPath := t.TempDir()
	t.Setenv("PATH", emptyPath) // nothing to find even by accident
	t.Setenv(PGLookupEnv, "none")

	opts := PostgresOptions{
		DataDir:    filepath.Join(t.TempDir(), "pg"),
		Repository: srv.URL,
		CacheDir:   t.TempDir(),
		Progress:   tWriter{t},
	}
	if n := startAndQuery(t, opts); n != 1 {
		t.Errorf("first start: %d rows, want 1", n)
	}
	if hits.Load() != 1 {
		t.Errorf("%d downloads, want 1", hits.Load())
	}
	srv.Close()
	// Second start: cache and data reused, no network.
	if n := startAndQuery(t, opts); n != 2 {
		t.Errorf("second start: %d rows, want 2 (data kept across restarts)", n)
	}
}

// TestPostgresRealDownload fetches the pinned build from the Maven Central
// repository into a scratch cache and runs it. Opt-in (needs the network):
// DEVSTACK_TEST_DOWNLOAD=1.
func TestPostgresRealDownload(t *testing.T) {
	if os.Getenv("DEVSTACK_TEST_DOWNLOAD") != "1" {
		t.Skip("set DEVSTACK_TEST_DOWNLOAD=1 to download the PostgreSQL server build")
	}
	_ = startAndQuery(t, PostgresOptions{
		DataDir:            filepath.Join(t.TempDir(), "pg"),
		HideSystemPostgres: true,
		CacheDir:           t.TempDir(),
		Progress:           tWriter{t},
	})
}

// startAndQuery starts the cluster on a port of its own, checks it runs the
// downloaded build, adds a row and returns how many rows earlier calls on the same DataDir
// left plus this one; it stops the cluster before returning.
func startAndQuery(t *testing.T, o PostgresOptions) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	began := time.Now()
	// The port is picked once the build is fetched and unpacked, just before
	// the server binds it: picked before a 20-second unpack, it was taken by
	// a parallel package's server in between (CI: "Address already in use").
	if _, err := choosePGBinaries(ctx, o); err != nil {
		t.Fatal(err)
	}
	o.Port = freePort(t)
	pg, err := StartPostgres(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("started in %s", time.Since(began).Round(time.Millisecond))
	defer func() {
		if err := pg.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	}()
	if !strings.HasPrefix(pg.run.bin, o.CacheDir) {
		t.Errorf("binaries from %s, want the cache %s", pg.run.bin, o.CacheDir)
	}
	conn, err := pgx.Connect(ctx, pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var version string
	if err := conn.QueryRow(ctx, "SHOW server_version").Scan(&version); err != nil {
		t.Fatal(err)
	}
	t.Logf("server_version %s", version)
	if _, err := conn.Exec(ctx, "CREATE TABLE IF NOT EXISTS starts (at timestamptz NOT NULL DEFAULT now())"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "INSERT INTO starts DEFAULT VALUES"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM starts").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
