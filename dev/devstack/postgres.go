package devstack

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// pgSuperuser owns the private cluster. Authentication is "trust" on
// 127.0.0.1 only, so the URL needs no password.
const pgSuperuser = "claimflow"

// Superuser is the role that owns the private cluster (for the production
// shape's Temporal server, and tests that read its tables).
const Superuser = pgSuperuser

// PostgresOptions configures StartPostgres.
type PostgresOptions struct {
	// DataDir holds the cluster (e.g. <data>/pg); created with initdb when
	// it has no PG_VERSION yet. Required.
	DataDir string
	// Port on 127.0.0.1; default 55432 so it never clashes with a system
	// PostgreSQL on 5432.
	Port int
	// Database to create if missing; default "claimflow".
	Database string
	// LogFile receives the server log (appended); default DataDir+".log".
	LogFile string
	// OwnerRole and RuntimeRole, when set, are created (login, no other
	// attribute): the owner owns Database, the runtime role only logs in
	// (RoleURL connects as either). Unset: the superuser alone.
	OwnerRole   string
	RuntimeRole string

	// BinDir holds initdb, pg_ctl and postgres (claimflow dev --pg-bin).
	// Empty: a system install (see LookupDirs), else the pinned build from
	// the user's cache, downloaded on first use.
	BinDir string
	// LookupDirs are searched for a system install when BinDir is empty;
	// nil means $CLAIMFLOW_PG_LOOKUP if set, else PATH and then
	// /usr/lib/postgresql/*/bin.
	LookupDirs []string
	// HideSystemPostgres skips the system lookup, as on a machine where
	// only Go is installed (also: CLAIMFLOW_PG_LOOKUP=none).
	HideSystemPostgres bool
	// Repository is the Maven Central repository base URL (or a mirror)
	// the server build is downloaded from; default $CLAIMFLOW_PG_REPOSITORY,
	// else the one embedded-postgres uses.
	Repository string
	// CacheDir keeps downloaded builds, one directory per version; default
	// <user cache dir>/claimflow/postgres, shared by every clone.
	CacheDir string
	// Progress receives download progress; default os.Stderr.
	Progress io.Writer
	// Settings are server settings (name=value), each passed as -c.
	Settings []string
	// TLS serves TCP over TLS only, as a managed PostgreSQL would: a CA
	// and a server certificate for 127.0.0.1 and localhost, generated into
	// DataDir once and reused (Postgres.CACert), and pg_hba rules that are
	// all hostssl, so plaintext is refused. Every URL handed out (URL,
	// RoleURL) then verifies the server: sslmode=verify-full&sslrootcert=.
	// Off: plaintext, sslmode=disable.
	TLS bool

	build *pgBuild // tests: a build other than the pinned one
}

// Postgres is a private PostgreSQL cluster started with pg_ctl.
type Postgres struct {
	// URL connects to Database as the superuser, e.g.
	// postgres://claimflow@127.0.0.1:55432/claimflow?sslmode=disable
	URL string
	// CACert, with PostgresOptions.TLS, is the PEM file of the CA that
	// signed the server's certificate (the URLs' sslrootcert); else empty.
	CACert   string
	Port     int
	Database string
	DataDir  string
	LogFile  string
	// Reused is true when a server left running on DataDir by an earlier
	// run was adopted instead of started.
	Reused bool

	run      pgRunner
	settings []string
}

// StartPostgres initializes the cluster if needed, starts it (or adopts one
// already running on DataDir and Port), creates the database and returns
// once it accepts queries. The server is a daemon: it outlives our process
// until Stop, so a crashed `claimflow dev` leaves it running and the next
// StartPostgres simply reuses it.
func StartPostgres(ctx context.Context, o PostgresOptions) (*Postgres, error) {
	started := time.Now()
	if o.DataDir == "" {
		return nil, errors.New("start postgres: PostgresOptions.DataDir is required")
	}
	dataDir, err := filepath.Abs(o.DataDir)
	if err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	if o.Port == 0 {
		o.Port = 55432
	}
	if o.Database == "" {
		o.Database = "claimflow"
	}
	if o.LogFile == "" {
		o.LogFile = dataDir + ".log"
	}
	logFile, err := filepath.Abs(o.LogFile)
	if err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}

	bins, err := choosePGBinaries(ctx, o)
	if err != nil {
		return nil, err
	}
	run, err := newPGRunner(ctx, bins.Dir)
	if err != nil {
		return nil, err
	}
	slog.InfoContext(ctx, "postgres binaries", "from", bins.Origin, "dir", bins.Dir, "major", bins.Major, "run_as", run.userName())
	if bins.Origin == "downloaded" && run.cred != nil {
		// The unprivileged user must reach the binaries in root's cache.
		if err := run.ensureTraversable(ctx, bins.Dir); err != nil {
			return nil, err
		}
	}
	p := &Postgres{
		Port:     o.Port,
		Database: o.Database,
		DataDir:  dataDir,
		LogFile:  logFile,
		run:      run,
		settings: o.Settings,
	}

	if err := run.prepareDir(ctx, dataDir, 0o700); err != nil {
		return nil, err
	}
	if err := run.prepareLogFile(ctx, logFile); err != nil {
		return nil, err
	}
	if b, err := os.ReadFile(filepath.Join(dataDir, "PG_VERSION")); errors.Is(err, fs.ErrNotExist) {
		if err := p.initdb(ctx); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, fmt.Errorf("inspect postgres data dir %s: %w", dataDir, err)
	} else if major := firstLineInt(b); major != bins.Major {
		// The server would refuse with "database files are incompatible";
		// say what to do instead.
		return nil, fmt.Errorf("the postgres data dir %s was created by PostgreSQL %d, but the binaries in %s (%s) are PostgreSQL %d: "+
			"pass --pg-bin with a PostgreSQL %d bin directory, or move %s away to start with an empty database",
			dataDir, major, bins.Dir, bins.Origin, bins.Major, major, dataDir)
	}
	if o.TLS {
		if err := p.setupTLS(ctx); err != nil {
			return nil, err
		}
	}
	p.URL = p.connURL(pgSuperuser, o.Database)

	ready, err := p.adoptRunning(ctx)
	if err != nil {
		return nil, err
	}
	if !ready {
		if err := p.start(ctx); err != nil {
			return nil, err
		}
	}
	if err := p.waitReady(ctx); err != nil {
		return nil, err
	}
	if err := p.ensureDatabase(ctx, o.Database); err != nil {
		return nil, err
	}
	if o.OwnerRole != "" || o.RuntimeRole != "" {
		if err := p.ensureRoles(ctx, o.OwnerRole, o.RuntimeRole); err != nil {
			return nil, err
		}
	}
	slog.InfoContext(ctx, "postgres ready", "url", p.URL, "data", dataDir, "log", logFile,
		"reused", p.Reused, "took", time.Since(started).Round(time.Millisecond))
	return p, nil
}

// connURL connects to db as role: in plaintext, or with TLS on, verifying
// the server's certificate and name against CACert as a client of a managed
// PostgreSQL would (trust authentication on 127.0.0.1, so no password).
func (p *Postgres) connURL(role, db string) string {
	u := fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?", url.PathEscape(role), p.Port, url.PathEscape(db))
	if p.CACert == "" {
		return u + "sslmode=disable"
	}
	return u + "sslmode=verify-full&sslrootcert=" + url.QueryEscape(p.CACert)
}

func (p *Postgres) initdb(ctx context.Context) error {
	t := time.Now()
	out, err := p.run.output(ctx, "initdb",
		"-D", p.DataDir,
		"-U", pgSuperuser,
		"--auth=trust",
		// C collation: identical sort order on every machine, and
		// no dependency on which locales happen to be installed.
		"--no-locale", "--encoding=UTF8",
		"--no-instructions")
	if err != nil {
		return fmt.Errorf("initdb %s: %w\n%s\n(if the directory is left over from an interrupted initdb, delete it and retry)",
			p.DataDir, err, trimOutput(out))
	}
	slog.InfoContext(ctx, "postgres cluster created", "data", p.DataDir, "took", time.Since(t).Round(time.Millisecond))
	return nil
}

// adoptRunning deals with a postmaster.pid left in DataDir, typically by a
// crashed `claimflow dev` (pg_ctl daemonizes the server, so it survives us)
// or by a reboot. A live server that answers on our port is reused; a live
// one on another port, or not serving TLS as asked (or serving it when not
// asked), is restarted with our settings.
func (p *Postgres) adoptRunning(ctx context.Context) (bool, error) {
	pidFile := filepath.Join(p.DataDir, "postmaster.pid")
	switch state, pid := p.postmasterState(ctx); state {
	case pmNone, pmDead:
		// For a dead pid postgres itself validates the stale lock file,
		// including that no orphaned backend still holds shared memory.
		return false, nil
	case pmImpostor:
		// After a reboot or container restart the recorded pid can
		// belong to an unrelated process; postgres would refuse to start
		// ("lock file already exists") and pg_ctl stop would signal
		// that process. Neither is acceptable, so drop the file.
		slog.WarnContext(ctx, "removing stale postgres lock files whose pid now belongs to another process", "file", pidFile, "pid", pid)
		if err := os.Remove(pidFile); err != nil {
			return false, fmt.Errorf("remove stale %s (pid %d is not a postgres server): %w", pidFile, pid, err)
		}
		// The socket lock file records the same pid and gets the same
		// liveness check, so it would block the start just as well.
		sockLock := filepath.Join(p.socketDir(), fmt.Sprintf(".s.PGSQL.%d.lock", p.Port))
		if b, err := os.ReadFile(sockLock); err == nil && firstLineInt(b) == pid {
			if err := os.Remove(sockLock); err != nil {
				return false, fmt.Errorf("remove stale %s: %w", sockLock, err)
			}
		}
		return false, nil
	}
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	err := p.servesDataDir(pctx)
	cancel()
	if err == nil {
		slog.InfoContext(ctx, "reusing postgres already running on this data dir", "data", p.DataDir, "port", p.Port)
		p.Reused = true
		return true, nil
	}
	slog.WarnContext(ctx, "postgres runs on this data dir but does not answer on the wanted port (or not with the wanted TLS); restarting it", "data", p.DataDir, "port", p.Port, "err", err)
	if err := p.Stop(ctx); err != nil {
		return false, err
	}
	return false, nil
}

// servesDataDir checks that the server answering on our port is the one
// running on our data dir, not an unrelated cluster that took the port; with
// TLS, that it presents our certificate.
func (p *Postgres) servesDataDir(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, p.connURL(pgSuperuser, "postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var dir string
	if err := conn.QueryRow(ctx, "SHOW data_directory").Scan(&dir); err != nil {
		return err
	}
	if !sameDir(dir, p.DataDir) {
		return fmt.Errorf("port %d is served by the cluster in %s", p.Port, dir)
	}
	return nil
}

type pmState int

const (
	pmNone     pmState = iota // no postmaster.pid
	pmDead                    // recorded pid no longer exists
	pmImpostor                // recorded pid is alive but not a postgres server
	pmRunning                 // a postgres server owns the data dir
)

// postmasterState classifies the process recorded in postmaster.pid.
func (p *Postgres) postmasterState(ctx context.Context) (pmState, int) {
	b, err := os.ReadFile(filepath.Join(p.DataDir, "postmaster.pid"))
	if errors.Is(err, fs.ErrNotExist) {
		return pmNone, 0
	}
	if err != nil {
		// Unreadable: let pg_ctl, running as the owner, decide.
		return p.pgctlState(ctx), 0
	}
	pid := firstLineInt(b)
	if pid <= 0 {
		return pmImpostor, 0 // a torn file from a crash during startup
	}
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return pmDead, pid
	}
	if waitReaped(ctx, pid, 5*time.Second) {
		return pmDead, pid
	}
	// The postmaster's working directory is its data dir: a reliable
	// identity check that survives pid reuse.
	if cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid)); err == nil {
		if sameDir(cwd, p.DataDir) {
			return pmRunning, pid
		}
		return pmImpostor, pid
	}
	if isZombie(pid) {
		// Killed and still not reaped (some container inits never
		// reap): it holds nothing, but postgres would see a live pid.
		return pmImpostor, pid
	}
	if _, err := os.Stat("/proc/self"); err != nil {
		return p.pgctlState(ctx), pid // no procfs: trust pg_ctl
	}
	if cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && bytes.Contains(cmd, []byte("postgres")) {
		return pmRunning, pid
	}
	return pmImpostor, pid
}

func (p *Postgres) pgctlState(ctx context.Context) pmState {
	if p.running(ctx) {
		return pmRunning
	}
	return pmDead
}

func sameDir(a, b string) bool {
	ea, err1 := filepath.EvalSymlinks(a)
	eb, err2 := filepath.EvalSymlinks(b)
	if err1 != nil || err2 != nil {
		return filepath.Clean(a) == filepath.Clean(b)
	}
	return ea == eb
}

func firstLineInt(b []byte) int {
	first, _, _ := strings.Cut(string(b), "\n")
	n, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		return -1
	}
	return n
}

// waitReaped gives a just-killed postmaster, now a zombie, a moment to be
// reaped by init, which is the normal end of a crash. It returns false at
// once for a process that is not a zombie.
func waitReaped(ctx context.Context, pid int, limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	for isZombie(pid) && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			return true
		}
	}
	return false
}

func isZombie(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	return err == nil && procIsZombie(stat)
}

// procIsZombie reads the state field of /proc/<pid>/stat, which follows the
// parenthesised command name (itself possibly containing spaces or ')').
func procIsZombie(stat []byte) bool {
	i := bytes.LastIndexByte(stat, ')')
	return i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z'
}

// running asks pg_ctl whether a postmaster owns DataDir (exit status 0).
func (p *Postgres) running(ctx context.Context) bool {
	_, err := p.run.output(ctx, "pg_ctl", "status", "-D", p.DataDir)
	return err == nil
}

func (p *Postgres) start(ctx context.Context) error {
	sockDir := p.socketDir()
	if err := p.run.prepareDir(ctx, sockDir, 0o700); err != nil {
		return fmt.Errorf("create postgres socket dir: %w", err)
	}
	serverOpts := fmt.Sprintf("-p %d -c listen_addresses=127.0.0.1 -k %s", p.Port, shellQuote(sockDir))
	for _, kv := range p.settings {
		serverOpts += " -c " + shellQuote(kv)
	}
	out, err := p.run.output(ctx, "pg_ctl", "start",
		"-D", p.DataDir,
		"-l", p.LogFile,
		"-o", serverOpts,
		"-w", "-t", strconv.Itoa(int(startTimeout/time.Second)))
	if err != nil {
		return withTail(fmt.Errorf("pg_ctl start -D %s on port %d: %w\n%s\n(if the port is in use, stop the other server or choose another port)",
			p.DataDir, p.Port, err, trimOutput(out)), p.LogFile)
	}
	return nil
}

// socketDir returns where the server puts its unix socket. The data dir is
// the natural place, but sun_path holds only 107 bytes, and t.TempDir() or a
// deep checkout easily exceeds that; then a short per-data-dir /tmp path is
// used. The socket is only a convenience for psql: clients use TCP.
func (p *Postgres) socketDir() string {
	const sunPathMax = 107
	sockName := fmt.Sprintf(".s.PGSQL.%d.lock", p.Port) // the longest name postgres puts there
	if len(p.DataDir)+1+len(sockName) <= sunPathMax {
		return p.DataDir
	}
	sum := sha256.Sum256([]byte(p.DataDir))
	return "/tmp/claimflow-pg-" + hex.EncodeToString(sum[:6])
}

func (p *Postgres) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	err := poll(ctx, 50*time.Millisecond, func(ctx context.Context) error {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		return pingURL(pctx, p.connURL(pgSuperuser, "postgres"))
	})
	if err != nil {
		return withTail(fmt.Errorf("postgres on 127.0.0.1:%d never accepted queries: %w", p.Port, err), p.LogFile)
	}
	return nil
}

func (p *Postgres) ensureDatabase(ctx context.Context, db string) error {
	conn, err := pgx.Connect(ctx, p.connURL(pgSuperuser, "postgres"))
	if err != nil {
		return fmt.Errorf("connect to postgres to create database %q: %w", db, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", db).Scan(&exists); err != nil {
		return fmt.Errorf("check whether database %q exists: %w", db, err)
	}
	if exists {
		return nil
	}
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{db}.Sanitize())
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P04" { // duplicate_database: a concurrent start won
		return nil
	}
	if err != nil {
		return fmt.Errorf("create database %q: %w", db, err)
	}
	slog.InfoContext(ctx, "postgres database created", "database", db)
	return nil
}

func pingURL(ctx context.Context, connString string) error {
	conn, err := pgx.Connect(ctx, connString)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return conn.Ping(ctx)
}

// Stop shuts the server down with pg_ctl's fast mode: open sessions are
// disconnected, committed data is checkpointed. Stopping a server that is
// not running is not an error.
func (p *Postgres) Stop(ctx context.Context) error {
	if p == nil {
		return nil
	}
	if !p.running(ctx) {
		return nil
	}
	out, err := p.run.output(ctx, "pg_ctl", "stop", "-D", p.DataDir, "-m", "fast", "-w", "-t", "60")
	if err != nil {
		if !p.running(ctx) {
			return nil
		}
		return fmt.Errorf("pg_ctl stop -D %s: %w\n%s", p.DataDir, err, trimOutput(out))
	}
	if dir := p.socketDir(); dir != p.DataDir {
		_ = os.Remove(dir) // only if empty: postgres removed its socket
	}
	return nil
}

// pgRunner runs the PostgreSQL tools from one bin directory, as an
// unprivileged user when we are root: initdb and postgres refuse to run as
// root.
type pgRunner struct {
	bin  string
	cred *syscall.Credential // nil: run as ourselves
	name string
	home string
}

// pgRunAsUsers are the existing accounts tried, in order, when running as
// root: the packaged server's own user, then the classic unprivileged one.
var pgRunAsUsers = []string{"postgres", "nobody"}

// pgCreatedUser is created only when none of pgRunAsUsers exists.
const pgCreatedUser = "claimflow-pg"

func newPGRunner(ctx context.Context, bin string) (pgRunner, error) {
	if os.Geteuid() != 0 {
		return pgRunner{bin: bin}, nil
	}
	var u *user.User
	for _, name := range append(slices.Clone(pgRunAsUsers), pgCreatedUser) {
		if found, err := user.Lookup(name); err == nil && found.Uid != "0" {
			u = found
			break
		}
	}
	if u == nil {
		var err error
		if u, err = createSystemUser(ctx, pgCreatedUser); err != nil {
			return pgRunner{}, fmt.Errorf("running as root, and PostgreSQL refuses to run as root; no unprivileged user (%s) exists to run it as, and creating %q failed: %w: create one (useradd --system postgres) or run as a normal user",
				strings.Join(pgRunAsUsers, ", "), pgCreatedUser, err)
		}
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return pgRunner{}, fmt.Errorf("parse uid/gid of user %s: %w", u.Username, err)
	}
	return pgRunner{
		bin:  bin,
		cred: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}},
		name: u.Username,
		home: u.HomeDir,
	}, nil
}

// createSystemUser adds a system account without a home or login shell,
// with whichever tool the distribution has.
func createSystemUser(ctx context.Context, name string) (*user.User, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var cmd *exec.Cmd
	if path, err := exec.LookPath("useradd"); err == nil {
		cmd = exec.CommandContext(ctx, path, "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", name)
	} else if path, err := exec.LookPath("adduser"); err == nil { // busybox
		cmd = exec.CommandContext(ctx, path, "-S", "-D", "-H", name)
	} else {
		return nil, errors.New("neither useradd nor adduser is on PATH")
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("%s: %w\n%s", strings.Join(cmd.Args, " "), err, trimOutput(out))
	}
	slog.InfoContext(ctx, "created a system user to run PostgreSQL as (it refuses to run as root)", "user", name)
	return user.Lookup(name)
}

// userName is who the tools run as, for logs and messages.
func (r pgRunner) userName() string {
	if r.cred == nil {
		if u, err := user.Current(); err == nil {
			return u.Username
		}
		return strconv.Itoa(os.Geteuid())
	}
	return r.name
}

func (r pgRunner) output(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(r.bin, name), args...)
	// The tools chdir-check their working directory; ours may be
	// unreadable for the postgres user (e.g. under /root).
	cmd.Dir = "/"
	cmd.Env = os.Environ()
	if r.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: r.cred}
		cmd.Env = append(cmd.Env, "HOME="+r.home, "USER="+r.name, "LOGNAME="+r.name)
	}
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	// pg_ctl start leaves a daemon behind; should it ever inherit our
	// pipes, do not wait for it to close them.
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	return out.Bytes(), err
}

// prepareDir creates dir with perm. As root it also hands the directory
// (and the parents it had to create) to the unprivileged user and makes sure
// that user can traverse every ancestor, which a 0700 t.TempDir() parent or
// /root does not allow.
func (r pgRunner) prepareDir(ctx context.Context, dir string, perm fs.FileMode) error {
	var created []string
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(d); err == nil {
			break
		} else if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("inspect %s: %w", d, err)
		}
		created = append(created, d)
		if filepath.Dir(d) == d {
			break
		}
	}
	if err := os.MkdirAll(dir, perm); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	if r.cred == nil {
		return nil
	}
	uid, gid := int(r.cred.Uid), int(r.cred.Gid)
	st, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("inspect %s: %w", dir, err)
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && int(sys.Uid) != uid {
		if entries, _ := os.ReadDir(dir); len(entries) > 0 {
			return fmt.Errorf("%s is not empty and not owned by user %s, who must own it when running as root: chown -R %s: %s", dir, r.name, r.name, dir)
		}
		if !slices.Contains(created, dir) {
			created = append(created, dir)
		}
	}
	for _, d := range created {
		if err := os.Chown(d, uid, gid); err != nil {
			return fmt.Errorf("chown %s to user %s: %w", d, r.name, err)
		}
	}
	if err := os.Chmod(dir, perm); err != nil {
		return fmt.Errorf("chmod %s: %w", dir, err)
	}
	return r.ensureTraversable(ctx, filepath.Dir(dir))
}

// ensureTraversable adds the search (x) bit for others on dir and its
// ancestors where the unprivileged user could not otherwise enter. Only search, not read:
// names in those directories stay unlistable.
func (r pgRunner) ensureTraversable(ctx context.Context, dir string) error {
	for d := dir; ; d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err != nil {
			return fmt.Errorf("inspect %s: %w", d, err)
		}
		sys, ok := st.Sys().(*syscall.Stat_t)
		mode := st.Mode().Perm()
		canEnter := mode&0o001 != 0 ||
			(ok && sys.Uid == r.cred.Uid && mode&0o100 != 0) ||
			(ok && sys.Gid == r.cred.Gid && mode&0o010 != 0)
		if !canEnter {
			slog.WarnContext(ctx, "letting the postgres user traverse a directory (adding o+x) so it can reach its files", "user", r.name, "dir", d, "mode", mode.String())
			if err := os.Chmod(d, st.Mode()|0o001); err != nil {
				return fmt.Errorf("%s is not traversable by user %s and chmod o+x failed: %w", d, r.name, err)
			}
		}
		if filepath.Dir(d) == d {
			return nil
		}
	}
}

// prepareLogFile creates the log file so that, as root, the unprivileged user
// (which pg_ctl runs as) can append to it wherever it lives.
func (r pgRunner) prepareLogFile(ctx context.Context, path string) error {
	f, err := openAppend(path)
	if err != nil {
		return err
	}
	f.Close()
	if r.cred != nil {
		if err := os.Chown(path, int(r.cred.Uid), int(r.cred.Gid)); err != nil {
			return fmt.Errorf("chown %s to user %s: %w", path, r.name, err)
		}
		return r.ensureTraversable(ctx, filepath.Dir(path))
	}
	return nil
}

// shellQuote quotes s for the /bin/sh that pg_ctl hands -o options to.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
