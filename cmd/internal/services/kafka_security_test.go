package services

import (
	"bytes"
	"context"
	"crypto/tls"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/claimflow/claimflow/dev/testcerts"
	"github.com/claimflow/claimflow/internal/config"
	"github.com/claimflow/claimflow/internal/kafka"
	"github.com/claimflow/claimflow/internal/tlsfiles"
)

// TestAPIStopsWhenKafkaRefusesItsCredentials: `claimflow api` with a
// wrong Kafka password stops at startup with the reason, before dialing
// Postgres, instead of serving a /readyz that fails forever; with the
// right one, or with a broker that is merely down, it goes on (to the
// unreachable Postgres of this test).
func TestAPIStopsWhenKafkaRefusesItsCredentials(t *testing.T) {
	ca := testcerts.NewCA(t, "kafka-ca")
	certPEM, keyPEM := ca.Issue(t, "kafka", "127.0.0.1")
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.EnableSASL(),
		kfake.TLS(&tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}),
		kfake.Superuser("SCRAM-SHA-512", "claimflow", "right-password"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	caPath := ca.WriteCA(t, t.TempDir(), "ca.pem")

	for _, tc := range []struct {
		name, password string
		brokers        []string
		// want is in the error RunAPI returns; warn in its log.
		want, warn string
	}{
		{"a wrong password", "wrong-password", c.ListenAddrs(),
			"Kafka refused the SASL credentials of KAFKA_SASL_USERNAME=claimflow (KAFKA_SASL_MECHANISM=SCRAM-SHA-512): check KAFKA_SASL_PASSWORD", ""},
		{"the right password", "right-password", c.ListenAddrs(), "reach Postgres", ""},
		{"a broker that is down", "right-password", []string{"127.0.0.1:1"}, "reach Postgres", "Kafka does not answer yet"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Config{
				Security:     config.Security{AuthMode: config.AuthHS256, JWTSecret: strings.Repeat("s", 32)},
				DatabaseURL:  "postgres://claimflow_app@127.0.0.1:1/claimflow?sslmode=disable&connect_timeout=2",
				KafkaBrokers: tc.brokers,
				KafkaTLS: tlsfiles.Files{Enabled: true, CA: caPath,
					Vars: tlsfiles.Vars{Enabled: "KAFKA_TLS", CA: "KAFKA_TLS_CA_PATH", ServerName: "KAFKA_TLS_SERVER_NAME"}},
				KafkaSASL: kafka.SASL{Mechanism: kafka.SASLScram512, User: "claimflow", Password: tc.password},
			}
			var logs bytes.Buffer
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			began := time.Now()
			err := RunAPI(ctx, cfg, slog.New(slog.NewTextHandler(&logs, nil)), false)
			t.Logf("RunAPI after %v: %v", time.Since(began).Round(time.Millisecond), err)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("RunAPI: %v\nwant an error containing %q", err, tc.want)
			}
			if got := kafka.IsAuthError(err); got != (tc.want != "reach Postgres") {
				t.Errorf("IsAuthError = %v", got)
			}
			if !strings.Contains(logs.String(), tc.warn) {
				t.Errorf("log lacks %q:\n%s", tc.warn, logs.String())
			}
			if strings.Contains(err.Error()+logs.String(), tc.password) {
				t.Errorf("the password shows:\n%v\n%s", err, logs.String())
			}
		})
	}
}
