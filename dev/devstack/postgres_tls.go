package devstack

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// The TLS files live in the data dir, so they go (and come back) with the
// cluster. The CA's private key is never written: it signs the server
// certificate and is dropped, so nothing on disk can mint another
// certificate this CA vouches for. Should the files ever need renewing,
// all of them, CA included, are generated anew.
const (
	pgTLSDirName = "claimflow-tls"
	pgTLSCAFile  = "ca.crt"
	pgTLSCert    = "server.crt"
	pgTLSKey     = "server.key"
	pgTLSHBAFile = "pg_hba.conf"
	// pgTLSValidity is the lifetime of both certificates; they are
	// renewed when they would expire within pgTLSRenewBefore.
	pgTLSValidity    = 10 * 365 * 24 * time.Hour
	pgTLSRenewBefore = 30 * 24 * time.Hour
)

// pgTLSNames are the names the server certificate is valid for: the
// address the cluster listens on, and the name that resolves to it.
var pgTLSNames = []string{"127.0.0.1", "localhost"}

// setupTLS makes sure DataDir holds a valid CA and server certificate (the
// ones from an earlier start, else new ones), writes the hostssl-only copy
// of pg_hba.conf and adds the settings that make the server use them.
func (p *Postgres) setupTLS(ctx context.Context) error {
	dir := filepath.Join(p.DataDir, pgTLSDirName)
	if err := p.run.prepareDir(ctx, dir, 0o700); err != nil {
		return fmt.Errorf("postgres TLS: %w", err)
	}
	caPath, certPath, keyPath := filepath.Join(dir, pgTLSCAFile), filepath.Join(dir, pgTLSCert), filepath.Join(dir, pgTLSKey)
	if err := checkPGTLSFiles(caPath, certPath, keyPath, time.Now().Add(pgTLSRenewBefore)); err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			slog.WarnContext(ctx, "postgres TLS files unusable; generating a new CA and server certificate", "dir", dir, "err", err)
		}
		if err := p.writeTLSFiles(caPath, certPath, keyPath); err != nil {
			return err
		}
		slog.InfoContext(ctx, "postgres TLS certificates generated", "ca", caPath)
	}
	hba, err := os.ReadFile(filepath.Join(p.DataDir, "pg_hba.conf"))
	if err != nil {
		return fmt.Errorf("postgres TLS: %w", err)
	}
	hbaPath := filepath.Join(dir, pgTLSHBAFile)
	if want := pgTLSHBA(hba); !bytes.Equal(readOrNil(hbaPath), want) {
		if err := p.run.writeFile(hbaPath, want, 0o600); err != nil {
			return fmt.Errorf("postgres TLS: %w", err)
		}
	}
	p.CACert = caPath
	// After the caller's settings, so none of them can turn TLS off.
	p.settings = append(p.settings[:len(p.settings):len(p.settings)],
		"ssl=on", "ssl_cert_file="+certPath, "ssl_key_file="+keyPath, "hba_file="+hbaPath)
	return nil
}

func readOrNil(path string) []byte {
	b, _ := os.ReadFile(path)
	return b
}

// writeTLSFiles generates a CA and a server certificate it signs and writes
// them, the key readable by the server's user alone, as PostgreSQL demands.
func (p *Postgres) writeTLSFiles(caPath, certPath, keyPath string) error {
	ca, caKey, err := newPGTLSCA()
	if err != nil {
		return fmt.Errorf("postgres TLS: %w", err)
	}
	certDER, key, err := newPGTLSServerCert(ca, caKey)
	if err != nil {
		return fmt.Errorf("postgres TLS: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("postgres TLS: %w", err)
	}
	for _, f := range []struct {
		path  string
		block *pem.Block
		perm  os.FileMode
	}{
		{keyPath, &pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}, 0o600},
		{certPath, &pem.Block{Type: "CERTIFICATE", Bytes: certDER}, 0o644},
		{caPath, &pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw}, 0o644},
	} {
		if err := p.run.writeFile(f.path, pem.EncodeToMemory(f.block), f.perm); err != nil {
			return fmt.Errorf("postgres TLS: %w", err)
		}
	}
	return nil
}

// newPGTLSCA returns a self-signed ECDSA P-256 CA that may sign only leaf
// certificates.
func newPGTLSCA() (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          pgTLSSerial(),
		Subject:               pkix.Name{CommonName: "claimflow dev PostgreSQL CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(pgTLSValidity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	ca, err := x509.ParseCertificate(der)
	return ca, key, err
}

// newPGTLSServerCert returns a server certificate for pgTLSNames signed by
// ca, and its ECDSA P-256 key.
func newPGTLSServerCert(ca *x509.Certificate, caKey *ecdsa.PrivateKey) ([]byte, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: pgTLSSerial(),
		Subject:      pkix.Name{CommonName: "localhost"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(pgTLSValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, name := range pgTLSNames {
		if ip := net.ParseIP(name); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, name)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	return der, key, err
}

func pgTLSSerial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return n.Add(n, big.NewInt(1))
}

// checkPGTLSFiles reports why the files cannot serve (as of at) every name
// in pgTLSNames: missing, unparsable, a key that is not the certificate's,
// or a certificate the CA does not verify.
func checkPGTLSFiles(caPath, certPath, keyPath string, at time.Time) error {
	caPEM, err := os.ReadFile(caPath)
	if err != nil {
		return err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return fmt.Errorf("%s holds no certificate", caPath)
	}
	pair, err := tls.LoadX509KeyPair(certPath, keyPath)
	if err != nil {
		return err
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return err
	}
	for _, name := range pgTLSNames {
		if _, err := leaf.Verify(x509.VerifyOptions{
			DNSName:     name,
			Roots:       roots,
			CurrentTime: at,
			KeyUsages:   []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		}); err != nil {
			return fmt.Errorf("%s: %w", certPath, err)
		}
	}
	return nil
}

// pgTLSHBA is the cluster's pg_hba.conf with every TCP rule made hostssl,
// so a connection without TLS matches no rule and is refused. hostnossl
// rules are commented out; local (unix socket) rules stay as they are.
func pgTLSHBA(src []byte) []byte {
	var b bytes.Buffer
	b.WriteString("# Written by claimflow's dev stack (PostgresOptions.TLS) from the data dir's\n" +
		"# pg_hba.conf on every start: TCP rules are hostssl only.\n")
	for _, line := range strings.SplitAfter(string(src), "\n") {
		body := strings.TrimLeft(line, " \t")
		word, _, _ := strings.Cut(strings.ReplaceAll(body, "\t", " "), " ")
		switch word {
		case "host":
			line = line[:len(line)-len(body)] + "hostssl" + body[len("host"):]
		case "hostnossl":
			line = "# plaintext, dropped: " + line
		}
		b.WriteString(line)
	}
	return b.Bytes()
}

// writeFile replaces path with data, mode perm and owned by the server's
// user. The new file is created exclusively and changed through its own
// descriptor, so as root nothing in a directory the server's user owns can
// redirect the write or the chown elsewhere.
func (r pgRunner) writeFile(path string, data []byte, perm os.FileMode) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".new*") // O_EXCL, mode 0600
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			os.Remove(tmp)
		}
	}()
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(perm) // CreateTemp made it 0600
	}
	if err == nil && r.cred != nil {
		err = f.Chown(int(r.cred.Uid), int(r.cred.Gid))
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
