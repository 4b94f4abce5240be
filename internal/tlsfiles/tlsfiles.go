// Package tlsfiles builds a client's TLS configuration from PEM files: the
// CA that signs the server, and a client certificate and key for mutual
// TLS. The certificate and key are read again whenever their files change,
// so a rotated certificate is used by the next connection without a
// restart (cert-manager and Vault agents rewrite the files in place).
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// Files names a client's TLS material. The names of the variables they
// come from go into every error, so a misconfiguration names its variable.
type Files struct {
	// Enabled turns TLS on; with no CA the system roots verify the server.
	Enabled bool
	// CA, Cert, Key and ServerName are paths and a name; empty: none.
	CA, Cert, Key, ServerName string
	// Vars are the environment variables these came from, for errors.
	Vars Vars
}

// Vars names the environment variables of a Files.
type Vars struct{ Enabled, CA, Cert, Key, ServerName string }

// Check reads every file once and reports the first problem in one line
// that names its variable: a certificate without a key (or a key without a
// certificate), an unreadable file, a CA with no certificate in it, or a
// pair that does not match.
func (f Files) Check() error {
	if !f.Enabled {
		for _, v := range []struct{ val, name string }{{f.CA, f.Vars.CA}, {f.Cert, f.Vars.Cert}, {f.Key, f.Vars.Key}, {f.ServerName, f.Vars.ServerName}} {
			if v.val != "" {
				return fmt.Errorf("%s is set while %s=false: remove one of them", v.name, f.Vars.Enabled)
			}
		}
		return nil
	}
	if (f.Cert == "") != (f.Key == "") {
		if f.Cert == "" {
			return fmt.Errorf("%s is set without %s: a client key needs its certificate", f.Vars.Key, f.Vars.Cert)
		}
		return fmt.Errorf("%s is set without %s: a client certificate needs its key", f.Vars.Cert, f.Vars.Key)
	}
	if f.CA != "" {
		if _, err := readPool(f.CA); err != nil {
			return fmt.Errorf("%s: %w", f.Vars.CA, err)
		}
	}
	if f.Cert != "" {
		if _, err := loadPair(f.Cert, f.Key); err != nil {
			return fmt.Errorf("%s and %s: %w", f.Vars.Cert, f.Vars.Key, err)
		}
	}
	return nil
}

// Config is the client TLS configuration, nil when TLS is off. The client
// certificate is served by a callback that reloads the files when their
// modification time or size changed.
func (f Files) Config() (*tls.Config, error) {
	if !f.Enabled {
		return nil, nil
	}
	if err := f.Check(); err != nil {
		return nil, err
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: f.ServerName}
	if f.CA != "" {
		pool, err := readPool(f.CA)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.Vars.CA, err)
		}
		c.RootCAs = pool
	}
	if f.Cert != "" {
		r := &reloader{cert: f.Cert, key: f.Key}
		if _, err := r.get(); err != nil {
			return nil, fmt.Errorf("%s and %s: %w", f.Vars.Cert, f.Vars.Key, err)
		}
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return r.get() }
	}
	return c, nil
}

func readPool(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s holds no PEM certificate", path)
	}
	return pool, nil
}

func loadPair(cert, key string) (*tls.Certificate, error) {
	c, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		return nil, err
	}
	return &c, nil
}

// reloader holds the last certificate read and the files' state then.
type reloader struct {
	cert, key string

	mu      sync.Mutex
	current *tls.Certificate
	stamp   [2]stamp
}

type stamp struct {
	mod  time.Time
	size int64
}

func stampOf(path string) (stamp, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return stamp{}, err
	}
	return stamp{fi.ModTime(), fi.Size()}, nil
}

// get returns the certificate, read again when either file changed. A
// file caught halfway through a rewrite fails to parse: the last good
// certificate serves until the next handshake reads the new one.
func (r *reloader) get() (*tls.Certificate, error) {
	sc, errC := stampOf(r.cert)
	sk, errK := stampOf(r.key)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := errors.Join(errC, errK); err != nil {
		if r.current != nil {
			return r.current, nil
		}
		return nil, err
	}
	now := [2]stamp{sc, sk}
	if r.current != nil && now == r.stamp {
		return r.current, nil
	}
	c, err := loadPair(r.cert, r.key)
	if err != nil {
		if r.current != nil {
			return r.current, nil
		}
		return nil, err
	}
	r.current, r.stamp = c, now
	return c, nil
}
