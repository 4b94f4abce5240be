package devstack

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// TestPostgresTLS starts the private cluster with TLS on and connects as
// the owner, the runtime role and the superuser with sslmode=verify-full,
// each session encrypted; a client trusting another CA and a plaintext
// client are refused. The certificates survive a restart; turning TLS off
// and on again on a running cluster restarts it in the asked mode.
func TestPostgresTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a private PostgreSQL cluster; skipped under -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	opts := PostgresOptions{DataDir: t.TempDir() + "/pg", Port: freePort(t), TLS: true,
		OwnerRole: "test_owner", RuntimeRole: "test_app"}
	pg, err := StartPostgres(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := pg.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	})
	if pg.CACert == "" || !strings.HasPrefix(pg.CACert, pg.DataDir+"/") {
		t.Fatalf("CACert = %q, want a file in %s", pg.CACert, pg.DataDir)
	}
	checkServerKey(t, pg)

	for _, tc := range []struct{ name, role, url string }{
		{"owner", opts.OwnerRole, pg.RoleURL(opts.OwnerRole)},
		{"runtime", opts.RuntimeRole, pg.RoleURL(opts.RuntimeRole)},
		{"superuser", pgSuperuser, pg.URL},
	} {
		t.Run("verify-full/"+tc.name, func(t *testing.T) {
			q := queryOf(t, tc.url)
			if q.Get("sslmode") != "verify-full" || q.Get("sslrootcert") != pg.CACert {
				t.Fatalf("URL %s: want sslmode=verify-full&sslrootcert=%s", tc.url, pg.CACert)
			}
			if user, ssl := sessionSSL(ctx, t, tc.url); user != tc.role || !ssl {
				t.Fatalf("session of %s: current_user %s, pg_stat_ssl.ssl %v; want %s, true", tc.url, user, ssl, tc.role)
			}
		})
	}

	otherCA := filepath.Join(t.TempDir(), "other-ca.crt")
	ca, _, err := newPGTLSCA()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(otherCA, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	runtime := pg.RoleURL(opts.RuntimeRole)
	for _, tc := range []struct {
		name, url string
		refused   func(error) bool
	}{
		{"wrong CA", withQuery(t, runtime, "sslrootcert", otherCA), func(err error) bool {
			var verr *tls.CertificateVerificationError
			var unknown x509.UnknownAuthorityError
			return errors.As(err, &verr) && errors.As(err, &unknown)
		}},
		{"plaintext", withQuery(t, withQuery(t, runtime, "sslrootcert", ""), "sslmode", "disable"), func(err error) bool {
			// no pg_hba.conf entry for host "127.0.0.1", user …, no encryption
			var pgErr *pgconn.PgError
			return errors.As(err, &pgErr) && pgErr.Code == "28000" && strings.Contains(pgErr.Message, "no encryption")
		}},
	} {
		t.Run("refused/"+tc.name, func(t *testing.T) {
			conn, err := pgx.Connect(ctx, tc.url)
			if err == nil {
				conn.Close(ctx)
				t.Fatalf("%s connected", tc.url)
			}
			if !tc.refused(err) {
				t.Fatalf("%s: err = %v (%T), not the refusal wanted", tc.url, err, errors.Unwrap(err))
			}
			t.Logf("refused as wanted: %v", err)
		})
	}

	t.Run("restart", func(t *testing.T) {
		caPEM := readFile(t, pg.CACert)
		// start returns the cluster, TLS or not, checks what a client of
		// each role sees, and that the CA never changed.
		start := func(tls, wantReused bool) {
			t.Helper()
			o := opts
			o.TLS = tls
			again, err := StartPostgres(ctx, o)
			if err != nil {
				t.Fatal(err)
			}
			if again.Reused != wantReused {
				t.Errorf("TLS %v: Reused = %v, want %v", tls, again.Reused, wantReused)
			}
			if (again.CACert != "") != tls {
				t.Errorf("TLS %v: CACert = %q", tls, again.CACert)
			}
			for _, role := range []string{o.OwnerRole, o.RuntimeRole} {
				if _, ssl := sessionSSL(ctx, t, again.RoleURL(role)); ssl != tls {
					t.Errorf("TLS %v: %s's session encrypted: %v", tls, role, ssl)
				}
			}
			if !bytes.Equal(readFile(t, pg.CACert), caPEM) {
				t.Errorf("TLS %v: the CA changed", tls)
			}
		}
		if err := pg.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		start(true, false)  // stopped: the files are reused
		start(true, true)   // running with TLS: adopted
		start(false, false) // running with TLS, asked without: restarted
		start(true, false)  // running without, asked with: restarted
	})
}

// checkServerKey: the server's key is readable by the server's user alone,
// as PostgreSQL insists (it refuses to start otherwise).
func checkServerKey(t *testing.T, pg *Postgres) {
	t.Helper()
	st, err := os.Stat(filepath.Join(filepath.Dir(pg.CACert), pgTLSKey))
	if err != nil {
		t.Fatal(err)
	}
	wantUID := uint32(os.Geteuid())
	if pg.run.cred != nil {
		wantUID = pg.run.cred.Uid
	}
	if uid := st.Sys().(*syscall.Stat_t).Uid; st.Mode().Perm() != 0o600 || uid != wantUID {
		t.Errorf("server key mode %v owner %d, want -rw------- and %d (%s)", st.Mode().Perm(), uid, wantUID, pg.run.userName())
	}
}

// sessionSSL connects with url and reports who the session is and whether
// it is encrypted.
func sessionSSL(ctx context.Context, t *testing.T, url string) (string, bool) {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var user string
	var ssl bool
	if err := conn.QueryRow(ctx, "SELECT current_user, ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").Scan(&user, &ssl); err != nil {
		t.Fatal(err)
	}
	return user, ssl
}

func queryOf(t *testing.T, raw string) url.Values {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u.Query()
}

// withQuery returns raw with its query parameter key set to value (empty:
// removed).
func withQuery(t *testing.T, raw, key, value string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	if value == "" {
		q.Del(key)
	} else {
		q.Set(key, value)
	}
	u.RawQuery = q.Encode()
	return u.String()
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestPGTLSFiles: the generated server certificate is ECDSA P-256, verifies
// against its CA for 127.0.0.1 and localhost only, not against another CA,
// and is found due for renewal near its end; the hba copy makes every TCP
// rule hostssl.
func TestPGTLSFiles(t *testing.T) {
	dir := t.TempDir()
	p := &Postgres{} // run as ourselves: no chown
	ca, cert, key := filepath.Join(dir, pgTLSCAFile), filepath.Join(dir, pgTLSCert), filepath.Join(dir, pgTLSKey)
	if err := p.writeTLSFiles(ca, cert, key); err != nil {
		t.Fatal(err)
	}
	if err := checkPGTLSFiles(ca, cert, key, time.Now().Add(pgTLSRenewBefore)); err != nil {
		t.Fatalf("fresh files: %v", err)
	}
	if err := checkPGTLSFiles(ca, cert, key, time.Now().Add(pgTLSValidity)); err == nil {
		t.Error("files at the end of their validity pass the check")
	}
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if k, ok := leaf.PublicKey.(*ecdsa.PublicKey); !ok || k.Curve != elliptic.P256() {
		t.Errorf("server key %T, want ECDSA P-256", leaf.PublicKey)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(readFile(t, ca))
	other, _, err := newPGTLSCA()
	if err != nil {
		t.Fatal(err)
	}
	otherRoots := x509.NewCertPool()
	otherRoots.AddCert(other)
	for _, tc := range []struct {
		name  string
		roots *x509.CertPool
		ok    bool
	}{
		{"127.0.0.1", roots, true},
		{"localhost", roots, true},
		{"127.0.0.2", roots, false},
		{"db.example.com", roots, false},
		{"127.0.0.1", otherRoots, false},
	} {
		_, err := leaf.Verify(x509.VerifyOptions{DNSName: tc.name, Roots: tc.roots})
		if (err == nil) != tc.ok {
			t.Errorf("verify for %s (own CA: %v): err = %v, want ok %v", tc.name, tc.roots == roots, err, tc.ok)
		}
	}

	hba := "# TYPE  DATABASE        USER            ADDRESS                 METHOD\n" +
		"local   all             all                                     trust\n" +
		"host    all             all             127.0.0.1/32            trust\n" +
		"host\treplication\tall\t::1/128\ttrust\n" +
		"hostnossl all all 0.0.0.0/0 trust\n"
	got := string(pgTLSHBA([]byte(hba)))
	for _, want := range []string{
		"\nlocal   all             all                                     trust\n",
		"\nhostssl    all             all             127.0.0.1/32            trust\n",
		"\nhostssl\treplication\tall\t::1/128\ttrust\n",
		"\n# plaintext, dropped: hostnossl all all 0.0.0.0/0 trust\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("hba copy lacks %q:\n%s", want, got)
		}
	}
	for _, line := range strings.Split(got, "\n") {
		if f := strings.Fields(line); len(f) > 0 && (f[0] == "host" || f[0] == "hostnossl") {
			t.Errorf("hba copy keeps a plaintext TCP rule: %q", line)
		}
	}
}
