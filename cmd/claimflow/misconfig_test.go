package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestMisconfigurationIsRefusedBeforeDialing: each process refuses a bad
// setting with one line naming the variable, before it dials anything —
// here every dependency is unreachable, so a process that dialed first
// would report the dial instead.
func TestMisconfigurationIsRefusedBeforeDialing(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the claimflow binary")
	}
	bin := claimflowBinary(t)
	dir := t.TempDir()
	cert := filepath.Join(dir, "client.pem")
	if err := os.WriteFile(cert, []byte("not read before the key is missing"), 0o600); err != nil {
		t.Fatal(err)
	}
	unreachable := []string{
		"DATABASE_URL=postgres://claimflow_app@127.0.0.1:1/claimflow?sslmode=disable&connect_timeout=2",
		"TEMPORAL_ADDRESS=127.0.0.1:1", "KAFKA_BROKERS=127.0.0.1:1",
		"JWT_SECRET=0123456789abcdef0123456789abcdef", "EVENT_SIGNING_KEY=0123456789abcdef0123456789abcdef",
		"METRICS_ADDR=127.0.0.1:0", "HTTP_ADDR=127.0.0.1:0",
	}
	for _, tc := range []struct {
		name string
		args []string
		env  []string
		want string
	}{
		{"a client certificate without its key", []string{"worker"}, []string{"TEMPORAL_TLS_CLIENT_CERT_PATH=" + cert},
			"TEMPORAL_TLS_CLIENT_CERT_PATH is set without TEMPORAL_TLS_CLIENT_KEY_PATH"},
		{"an unreadable CA", []string{"api"}, []string{"TEMPORAL_TLS_SERVER_CA_CERT_PATH=" + filepath.Join(dir, "none.pem")},
			"TEMPORAL_TLS_SERVER_CA_CERT_PATH: open"},
		{"an API key in plaintext", []string{"consumer"}, []string{"TEMPORAL_API_KEY=k", "TEMPORAL_TLS=false"},
			"TEMPORAL_API_KEY is set while TEMPORAL_TLS=false"},
		{"SCRAM without a password", []string{"consumer"}, []string{"KAFKA_SASL_MECHANISM=SCRAM-SHA-512", "KAFKA_SASL_USERNAME=u"},
			"KAFKA_SASL_MECHANISM=SCRAM-SHA-512 needs KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD"},
		{"a worker without the event key", []string{"worker"}, []string{"EVENT_SIGNING_KEY="},
			"claimflow worker needs EVENT_SIGNING_KEY"},
		{"a consumer without the event key", []string{"consumer"}, []string{"EVENT_SIGNING_KEY="},
			"claimflow consumer needs EVENT_SIGNING_KEY"},
		{"jwks without an issuer", []string{"api"}, []string{"AUTH_MODE=jwks", "JWKS_URL=https://idp.example/jwks", "JWT_AUDIENCE=claimflow"},
			"AUTH_MODE=jwks needs JWT_ISSUER"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, tc.args...)
			cmd.Env = append(append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "LOG_FORMAT=text"}, unreachable...), tc.env...)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("claimflow %v started; output:\n%s", tc.args, out)
			}
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			last := lines[len(lines)-1]
			if !strings.Contains(last, tc.want) {
				t.Fatalf("last line %q, want it to name %q; output:\n%s", last, tc.want, out)
			}
			for _, dialed := range []string{"reach Postgres", "connect to Temporal", "Kafka"} {
				if strings.Contains(string(out), dialed) && !strings.Contains(tc.want, dialed) {
					t.Errorf("it dialed first (%q in the output):\n%s", dialed, out)
				}
			}
		})
	}
}
