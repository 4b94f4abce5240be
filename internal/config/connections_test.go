package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/claimflow/claimflow/dev/testcerts"
)

// TestConnectionSettings: every misconfiguration of the secured
// connections is refused at load, before anything is dialed, in one line
// that names the variable to fix; good settings turn TLS on.
func TestConnectionSettings(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, "ca")
	caPath := ca.WriteCA(t, dir, "ca.pem")
	cert, key := ca.WritePair(t, dir, "client", "claimflow")
	_, otherKey := ca.WritePair(t, dir, "other", "other")
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	token := filepath.Join(dir, "token")
	if err := os.WriteFile(token, []byte("eyJ..."), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.pem")
	for _, tc := range []struct {
		name string
		env  map[string]string
		// want is a piece of the error; empty: no error.
		want string
		// temporalTLS and kafkaTLS are the switches expected when it loads.
		temporalTLS, kafkaTLS bool
	}{
		{name: "nothing set: plaintext, as the dev stack", env: nil},
		{name: "Temporal mTLS", env: map[string]string{"TEMPORAL_TLS_SERVER_CA_CERT_PATH": caPath,
			"TEMPORAL_TLS_CLIENT_CERT_PATH": cert, "TEMPORAL_TLS_CLIENT_KEY_PATH": key}, temporalTLS: true},
		{name: "an API key turns TLS on", env: map[string]string{"TEMPORAL_API_KEY": "k"}, temporalTLS: true},
		{name: "TEMPORAL_TLS=true alone: the system's roots", env: map[string]string{"TEMPORAL_TLS": "true"}, temporalTLS: true},
		{name: "a certificate without its key", env: map[string]string{"TEMPORAL_TLS_CLIENT_CERT_PATH": cert},
			want: "TEMPORAL_TLS_CLIENT_CERT_PATH is set without TEMPORAL_TLS_CLIENT_KEY_PATH"},
		{name: "a key without its certificate", env: map[string]string{"TEMPORAL_TLS_CLIENT_KEY_PATH": key},
			want: "TEMPORAL_TLS_CLIENT_KEY_PATH is set without TEMPORAL_TLS_CLIENT_CERT_PATH"},
		{name: "an unreadable CA", env: map[string]string{"TEMPORAL_TLS_SERVER_CA_CERT_PATH": missing},
			want: "TEMPORAL_TLS_SERVER_CA_CERT_PATH: open " + missing},
		{name: "a CA file with no certificate", env: map[string]string{"TEMPORAL_TLS_SERVER_CA_CERT_PATH": garbage},
			want: "TEMPORAL_TLS_SERVER_CA_CERT_PATH: " + garbage + " holds no PEM certificate"},
		{name: "a certificate and a key that do not match", env: map[string]string{"TEMPORAL_TLS_CLIENT_CERT_PATH": cert, "TEMPORAL_TLS_CLIENT_KEY_PATH": otherKey},
			want: "TEMPORAL_TLS_CLIENT_CERT_PATH and TEMPORAL_TLS_CLIENT_KEY_PATH: tls: private key does not match public key"},
		{name: "an API key in plaintext", env: map[string]string{"TEMPORAL_API_KEY": "k", "TEMPORAL_TLS": "false"},
			want: "TEMPORAL_API_KEY is set while TEMPORAL_TLS=false"},
		{name: "a CA with TLS off", env: map[string]string{"TEMPORAL_TLS_SERVER_CA_CERT_PATH": caPath, "TEMPORAL_TLS": "false"},
			want: "TEMPORAL_TLS_SERVER_CA_CERT_PATH is set while TEMPORAL_TLS=false"},
		{name: "TEMPORAL_TLS not a boolean", env: map[string]string{"TEMPORAL_TLS": "yes please"},
			want: `TEMPORAL_TLS must be true or false, got "yes please"`},
		{name: "Kafka SCRAM over TLS", env: map[string]string{"KAFKA_TLS_CA_PATH": caPath, "KAFKA_SASL_MECHANISM": "scram-sha-512",
			"KAFKA_SASL_USERNAME": "u", "KAFKA_SASL_PASSWORD": "p"}, kafkaTLS: true},
		{name: "Kafka OAUTHBEARER", env: map[string]string{"KAFKA_TLS": "true", "KAFKA_SASL_MECHANISM": "OAUTHBEARER",
			"KAFKA_SASL_OAUTHBEARER_TOKEN_PATH": token}, kafkaTLS: true},
		{name: "an unknown mechanism", env: map[string]string{"KAFKA_SASL_MECHANISM": "GSSAPI"},
			want: `KAFKA_SASL_MECHANISM must be PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER, got "GSSAPI"`},
		{name: "SCRAM without a password", env: map[string]string{"KAFKA_SASL_MECHANISM": "SCRAM-SHA-256", "KAFKA_SASL_USERNAME": "u"},
			want: "KAFKA_SASL_MECHANISM=SCRAM-SHA-256 needs KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD"},
		{name: "PLAIN without TLS", env: map[string]string{"KAFKA_SASL_MECHANISM": "PLAIN", "KAFKA_SASL_USERNAME": "u", "KAFKA_SASL_PASSWORD": "p"},
			want: "KAFKA_SASL_MECHANISM=PLAIN needs KAFKA_TLS"},
		{name: "a password without a mechanism", env: map[string]string{"KAFKA_SASL_PASSWORD": "p"},
			want: "KAFKA_SASL_PASSWORD is set without KAFKA_SASL_MECHANISM"},
		{name: "OAUTHBEARER without its token file", env: map[string]string{"KAFKA_SASL_MECHANISM": "OAUTHBEARER"},
			want: "KAFKA_SASL_MECHANISM=OAUTHBEARER needs KAFKA_SASL_OAUTHBEARER_TOKEN_PATH"},
		{name: "an unreadable Kafka key", env: map[string]string{"KAFKA_TLS_CERT_PATH": cert, "KAFKA_TLS_KEY_PATH": missing},
			want: "KAFKA_TLS_CERT_PATH and KAFKA_TLS_KEY_PATH: open " + missing},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := load(func(name string) (string, bool) { v, ok := tc.env[name]; return v, ok })
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("error %v, want one containing %q", err, tc.want)
				}
				if strings.Contains(err.Error(), "\n") {
					t.Errorf("error %q spans lines, want one", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.TemporalTLS.Enabled != tc.temporalTLS || cfg.KafkaTLS.Enabled != tc.kafkaTLS {
				t.Errorf("TLS to Temporal %v, to Kafka %v; want %v, %v", cfg.TemporalTLS.Enabled, cfg.KafkaTLS.Enabled, tc.temporalTLS, tc.kafkaTLS)
			}
		})
	}
}
