package kafka_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/claimflow/claimflow/dev/testcerts"
	"github.com/claimflow/claimflow/internal/config"
	"github.com/claimflow/claimflow/internal/kafka"
	"github.com/claimflow/claimflow/internal/tlsfiles"
)

// The users the secured kfake cluster knows, one per mechanism.
const (
	scram256User = "claimflow-256"
	scram512User = "claimflow-512"
	plainUser    = "claimflow-plain"
	password     = "s3cret-Pa55word"
)

var kafkaTLSVars = tlsfiles.Vars{Enabled: "KAFKA_TLS", CA: "KAFKA_TLS_CA_PATH", Cert: "KAFKA_TLS_CERT_PATH",
	Key: "KAFKA_TLS_KEY_PATH", ServerName: "KAFKA_TLS_SERVER_NAME"}

// secureKfake starts a kfake cluster that takes only TLS connections
// (its certificate for 127.0.0.1, signed by a CA made here) and only
// SASL-authenticated clients. It returns the bootstrap list and the paths
// of the CA and of another CA that signed nothing of it.
func secureKfake(t *testing.T) (brokers []string, caPath, otherCAPath string) {
	t.Helper()
	dir := t.TempDir()
	ca := testcerts.NewCA(t, "kafka-ca")
	certPEM, keyPEM := ca.Issue(t, "kafka", "127.0.0.1")
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	c, err := kfake.NewCluster(
		kfake.NumBrokers(1),
		kfake.TLS(&tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}),
		kfake.EnableSASL(),
		kfake.Superuser("SCRAM-SHA-256", scram256User, password),
		kfake.Superuser("SCRAM-SHA-512", scram512User, password),
		kfake.Superuser("PLAIN", plainUser, password),
	)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs(), ca.WriteCA(t, dir, "ca.pem"), testcerts.NewCA(t, "other-ca").WriteCA(t, dir, "other-ca.pem")
}

// TestSecureConnections: claimflow's producer, reader and consumer-group
// configuration work over TLS with each SASL mechanism kfake speaks; a
// wrong password, a user the broker holds under another mechanism, a
// mechanism it does not offer, an untrusted CA or a server name the
// certificate lacks fail at once with an *AuthError naming
// what to check, and never the password.
func TestSecureConnections(t *testing.T) {
	brokers, caPath, otherCA := secureKfake(t)
	tlsWith := func(ca, serverName string) tlsfiles.Files {
		return tlsfiles.Files{Enabled: true, CA: ca, ServerName: serverName, Vars: kafkaTLSVars}
	}
	for _, tc := range []struct {
		name string
		tls  tlsfiles.Files
		sasl kafka.SASL
		// want is a piece of the error; empty: the round trip works.
		want string
	}{
		{name: "SCRAM-SHA-256 over TLS", tls: tlsWith(caPath, ""),
			sasl: kafka.SASL{Mechanism: kafka.SASLScram256, User: scram256User, Password: password}},
		{name: "SCRAM-SHA-512 over TLS", tls: tlsWith(caPath, ""),
			sasl: kafka.SASL{Mechanism: kafka.SASLScram512, User: scram512User, Password: password}},
		{name: "PLAIN over TLS", tls: tlsWith(caPath, ""),
			sasl: kafka.SASL{Mechanism: kafka.SASLPlain, User: plainUser, Password: password}},
		{name: "SCRAM-SHA-256 with a wrong password", tls: tlsWith(caPath, ""),
			sasl: kafka.SASL{Mechanism: kafka.SASLScram256, User: scram256User, Password: "wrong-" + password},
			want: "Kafka refused the SASL credentials of KAFKA_SASL_USERNAME=" + scram256User + " (KAFKA_SASL_MECHANISM=SCRAM-SHA-256): check KAFKA_SASL_PASSWORD"},
		{name: "SCRAM-SHA-512 with a wrong password", tls: tlsWith(caPath, ""),
			sasl: kafka.SASL{Mechanism: kafka.SASLScram512, User: scram512User, Password: "wrong-" + password},
			want: "Kafka refused the SASL credentials of KAFKA_SASL_USERNAME=" + scram512User + " (KAFKA_SASL_MECHANISM=SCRAM-SHA-512): check KAFKA_SASL_PASSWORD"},
		{name: "SCRAM-SHA-512 for a user the broker holds under SCRAM-SHA-256", tls: tlsWith(caPath, ""),
			sasl: kafka.SASL{Mechanism: kafka.SASLScram512, User: scram256User, Password: password},
			want: "Kafka refused the SASL credentials of KAFKA_SASL_USERNAME=" + scram256User},
		{name: "a mechanism the broker does not offer", tls: tlsWith(caPath, ""),
			sasl: kafka.SASL{Mechanism: kafka.SASLOAuthBearer, Tokens: staticToken("t")},
			want: "does not offer KAFKA_SASL_MECHANISM=OAUTHBEARER on this listener"},
		{name: "a CA that did not sign the broker", tls: tlsWith(otherCA, ""),
			sasl: kafka.SASL{Mechanism: kafka.SASLScram256, User: scram256User, Password: password},
			want: "Kafka's TLS certificate is not signed by the CA in KAFKA_TLS_CA_PATH=" + otherCA},
		{name: "a server name the certificate does not hold", tls: tlsWith(caPath, "kafka.example.com"),
			sasl: kafka.SASL{Mechanism: kafka.SASLScram256, User: scram256User, Password: password},
			want: `Kafka's TLS certificate is not valid for "kafka.example.com": set KAFKA_TLS_SERVER_NAME to a name it holds`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := kafka.Config{Brokers: brokers, ClientID: "claimflow-security-test", TLS: tc.tls, SASL: tc.sasl}
			if tc.want == "" {
				roundTrip(t, cfg, strings.ToLower(strings.NewReplacer(" ", "-").Replace(tc.name)))
				return
			}
			// Readiness (one Ping), the worker's producer, and the
			// consumer's client: each fails at once with the reason.
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			for _, step := range []struct {
				what string
				do   func() error
			}{
				{"readiness", func() error { return kafka.Ping(ctx, cfg) }},
				{"producer", func() error {
					p, err := kafka.NewProducer(cfg)
					if err == nil {
						_ = p.Close()
					}
					return err
				}},
				{"reader", func() error { _, _, err := kafka.ReadTopics(ctx, cfg, []string{"nothing"}); return err }},
			} {
				began := time.Now()
				err := step.do()
				took := time.Since(began)
				t.Logf("%s: %v after %v", step.what, err, took.Round(time.Millisecond))
				switch {
				case err == nil:
					t.Fatalf("%s: connected", step.what)
				case !kafka.IsAuthError(err):
					t.Errorf("%s: %v is not an AuthError", step.what, err)
				case !strings.Contains(err.Error(), tc.want):
					t.Errorf("%s: error %q\nwant it to contain %q", step.what, err, tc.want)
				}
				if strings.Contains(err.Error(), password) && tc.sasl.Password != "" {
					t.Errorf("%s: the error shows the password: %v", step.what, err)
				}
				// sarama's own metadata retries (5 × 200 ms) at most: no
				// retry loop waits for credentials that will not change.
				if took > 5*time.Second {
					t.Errorf("%s: took %v to give up", step.what, took)
				}
			}
		})
	}
}

// roundTrip creates a topic, sends records through claimflow's producer,
// and reads them back with the reader and with a consumer group on
// SaramaConfig, as the consumer does.
func roundTrip(t *testing.T, cfg kafka.Config, topic string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := kafka.Ping(ctx, cfg); err != nil {
		t.Fatalf("ping: %v", err)
	}
	if err := kafka.EnsureTopics(ctx, cfg, []kafka.Topic{{Name: topic, Partitions: 2, Replicas: 1}}); err != nil {
		t.Fatalf("create topic: %v", err)
	}
	p, err := kafka.NewProducer(cfg)
	if err != nil {
		t.Fatalf("producer: %v", err)
	}
	const n = 20
	for i := range n {
		if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(fmt.Sprint(i)),
			Value: sarama.StringEncoder(fmt.Sprintf(`{"event_id":"e%d","type":"test"}`, i))}); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	records, missing, err := kafka.ReadTopics(ctx, cfg, []string{topic})
	if err != nil || len(missing) > 0 || len(records) != n {
		t.Fatalf("read back: %d records, missing %v, error %v; want %d", len(records), missing, err, n)
	}

	sc, err := kafka.SaramaConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	g, err := sarama.NewConsumerGroup(cfg.Brokers, topic+"-group", sc)
	if err != nil {
		t.Fatalf("consumer group: %v", kafka.Explain(cfg, sc, err))
	}
	defer g.Close()
	h := &countHandler{want: n, done: make(chan struct{})}
	cctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		for cctx.Err() == nil {
			if err := g.Consume(cctx, []string{topic}, h); err != nil && cctx.Err() == nil {
				t.Errorf("consume: %v", err)
				return
			}
		}
	}()
	select {
	case <-h.done:
	case <-ctx.Done():
		t.Fatalf("the consumer group read %d of %d records", h.count(), n)
	}
}

type countHandler struct {
	mu   sync.Mutex
	n    int
	want int
	done chan struct{}
}

func (h *countHandler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (h *countHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }
func (h *countHandler) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n
}

func (h *countHandler) ConsumeClaim(s sarama.ConsumerGroupSession, c sarama.ConsumerGroupClaim) error {
	for m := range c.Messages() {
		s.MarkMessage(m, "")
		h.mu.Lock()
		h.n++
		if h.n == h.want {
			close(h.done)
		}
		h.mu.Unlock()
	}
	return nil
}

// TestSASLSettingsFromTheEnvironment: the variables config reads become
// sarama's SASL settings: PLAIN with its user and password over TLS, and
// OAUTHBEARER with a token read from its file on every new connection
// (checked on a broker that records the tokens it is given and refuses an
// expired one with the reason).
func TestSASLSettingsFromTheEnvironment(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, "ca").WriteCA(t, dir, "ca.pem")
	token := filepath.Join(dir, "token")
	writeToken := func(s string) {
		t.Helper()
		if err := os.WriteFile(token, []byte(s+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeToken("token-1")
	load := func(env map[string]string) kafka.Config {
		t.Helper()
		for _, name := range []string{"KAFKA_TLS", "KAFKA_TLS_CA_PATH", "KAFKA_TLS_CERT_PATH", "KAFKA_TLS_KEY_PATH", "KAFKA_TLS_SERVER_NAME",
			"KAFKA_SASL_MECHANISM", "KAFKA_SASL_USERNAME", "KAFKA_SASL_PASSWORD", "KAFKA_SASL_OAUTHBEARER_TOKEN_PATH"} {
			t.Setenv(name, env[name])
		}
		c, err := config.Load()
		if err != nil {
			t.Fatal(err)
		}
		return kafka.Config{Brokers: []string{"127.0.0.1:1"}, TLS: c.KafkaTLS, SASL: c.KafkaSASL}
	}

	t.Run("PLAIN", func(t *testing.T) {
		sc, err := kafka.SaramaConfig(load(map[string]string{"KAFKA_TLS_CA_PATH": ca, "KAFKA_SASL_MECHANISM": "plain",
			"KAFKA_SASL_USERNAME": "u", "KAFKA_SASL_PASSWORD": "p"}))
		if err != nil {
			t.Fatal(err)
		}
		s := sc.Net.SASL
		if !s.Enable || s.Mechanism != sarama.SASLTypePlaintext || s.User != "u" || s.Password != "p" || s.Version != sarama.SASLHandshakeV1 {
			t.Errorf("SASL %+v", s)
		}
		if !sc.Net.TLS.Enable || sc.Net.TLS.Config == nil || sc.Net.TLS.Config.RootCAs == nil {
			t.Errorf("TLS enable %v, config %+v", sc.Net.TLS.Enable, sc.Net.TLS.Config)
		}
		if err := sc.Validate(); err != nil {
			t.Error(err)
		}
	})

	t.Run("OAUTHBEARER", func(t *testing.T) {
		c, err := kfake.NewCluster(kfake.NumBrokers(1))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		var (
			mu     sync.Mutex
			tokens []string
		)
		c.ControlKey(int16(kmsg.SASLHandshake), func(req kmsg.Request) (kmsg.Response, error, bool) {
			c.KeepControl()
			resp := req.(*kmsg.SASLHandshakeRequest).ResponseKind().(*kmsg.SASLHandshakeResponse)
			resp.SupportedMechanisms = []string{"OAUTHBEARER"}
			if req.(*kmsg.SASLHandshakeRequest).Mechanism != "OAUTHBEARER" {
				resp.ErrorCode = kerr.UnsupportedSaslMechanism.Code
			}
			return resp, nil, true
		})
		c.ControlKey(int16(kmsg.SASLAuthenticate), func(req kmsg.Request) (kmsg.Response, error, bool) {
			c.KeepControl()
			r := req.(*kmsg.SASLAuthenticateRequest)
			resp := r.ResponseKind().(*kmsg.SASLAuthenticateResponse)
			// GS2 header, then \x01auth=Bearer <token>\x01\x01.
			_, tok, _ := strings.Cut(string(r.SASLAuthBytes), "auth=Bearer ")
			tok, _, _ = strings.Cut(tok, "\x01")
			mu.Lock()
			tokens = append(tokens, tok)
			mu.Unlock()
			if tok == "expired" {
				resp.ErrorCode = kerr.SaslAuthenticationFailed.Code
				msg := "invalid token"
				resp.ErrorMessage = &msg
			}
			return resp, nil, true
		})
		cfg := load(map[string]string{"KAFKA_SASL_MECHANISM": "OAUTHBEARER", "KAFKA_SASL_OAUTHBEARER_TOKEN_PATH": token})
		cfg.Brokers = c.ListenAddrs()
		sc, err := kafka.SaramaConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if s := sc.Net.SASL; !s.Enable || s.Mechanism != sarama.SASLTypeOAuth || s.TokenProvider == nil {
			t.Fatalf("SASL %+v", s)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := kafka.Ping(ctx, cfg); err != nil {
			t.Fatalf("first connection: %v", err)
		}
		writeToken("token-2") // rotated: the next connection sends it
		if err := kafka.Ping(ctx, cfg); err != nil {
			t.Fatalf("second connection: %v", err)
		}
		writeToken("expired")
		err = kafka.Ping(ctx, cfg)
		want := "Kafka refused the OAUTHBEARER token in KAFKA_SASL_OAUTHBEARER_TOKEN_PATH=" + token + ": check that it is current"
		if !kafka.IsAuthError(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("expired token: %v\nwant an AuthError containing %q", err, want)
		}
		seen := func() []string {
			mu.Lock()
			defer mu.Unlock()
			return append([]string(nil), tokens...)
		}
		if got := strings.Join(seen(), ","); got != "token-1,token-2,expired" {
			t.Errorf("the broker was given tokens %q, want token-1,token-2,expired", got)
		}

		// A token source plugged in is used instead of the file.
		cfg.SASL.Tokens = staticToken("plugged")
		if err := kafka.Ping(ctx, cfg); err != nil {
			t.Fatal(err)
		}
		if got := seen(); got[len(got)-1] != "plugged" {
			t.Errorf("with a token source the broker got %q", got)
		}
	})
}

type staticToken string

func (s staticToken) Token() (*sarama.AccessToken, error) {
	return &sarama.AccessToken{Token: string(s)}, nil
}

// TestMutualTLS: a client certificate and key (KAFKA_TLS_CERT_PATH,
// KAFKA_TLS_KEY_PATH) reach a broker that requires one; without them the
// broker's refusal of the handshake names those variables.
func TestMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, "kafka-ca")
	certPEM, keyPEM := ca.Issue(t, "kafka", "127.0.0.1")
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	clients := x509.NewCertPool()
	clients.AppendCertsFromPEM(ca.PEM)
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.TLS(&tls.Config{Certificates: []tls.Certificate{pair},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: clients, MinVersion: tls.VersionTLS12}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	files := tlsfiles.Files{Enabled: true, CA: ca.WriteCA(t, dir, "ca.pem"), Vars: kafkaTLSVars}
	withCert := files
	withCert.Cert, withCert.Key = ca.WritePair(t, dir, "client", "claimflow")

	roundTrip(t, kafka.Config{Brokers: c.ListenAddrs(), TLS: withCert}, "mtls")

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = kafka.Ping(ctx, kafka.Config{Brokers: c.ListenAddrs(), TLS: files})
	want := "Kafka refused the TLS handshake: check KAFKA_TLS_CERT_PATH and KAFKA_TLS_KEY_PATH"
	if !kafka.IsAuthError(err) || !strings.Contains(err.Error(), want) {
		t.Errorf("without a client certificate: %v\nwant an AuthError containing %q", err, want)
	}
}
