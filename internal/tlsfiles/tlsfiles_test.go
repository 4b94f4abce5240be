package tlsfiles_test

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"testing"
	"time"

	"github.com/claimflow/claimflow/dev/testcerts"
	"github.com/claimflow/claimflow/internal/tlsfiles"
)

// TestClientCertificateFollowsItsFiles: the callback serves the pair on
// disk, a rewritten pair from the next handshake on, and the last good one
// while the files hold something unreadable.
func TestClientCertificateFollowsItsFiles(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, "ca")
	cert, key := ca.WritePair(t, dir, "client", "first")
	c, err := tlsfiles.Files{Enabled: true, Cert: cert, Key: key}.Config()
	if err != nil {
		t.Fatal(err)
	}
	cn := func() string {
		t.Helper()
		got, err := c.GetClientCertificate(&tls.CertificateRequestInfo{})
		if err != nil {
			t.Fatal(err)
		}
		leaf, err := x509.ParseCertificate(got.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return leaf.Subject.CommonName
	}
	steps := []struct {
		name   string
		change func()
		want   string
	}{
		{"as loaded", func() {}, "first"},
		{"rotated in place", func() { ca.WritePair(t, dir, "client", "second") }, "second"},
		{"half-written key: the last good pair", func() {
			if err := os.WriteFile(key, []byte("-----BEGIN"), 0o600); err != nil {
				t.Fatal(err)
			}
		}, "second"},
		{"rotated again", func() { ca.WritePair(t, dir, "client", "third") }, "third"},
	}
	for _, s := range steps {
		s.change()
		// A new modification time even on a coarse clock.
		later := time.Now().Add(time.Duration(len(s.name)) * time.Second)
		_ = os.Chtimes(cert, later, later)
		if got := cn(); got != s.want {
			t.Errorf("%s: certificate %q, want %q", s.name, got, s.want)
		}
	}
}
