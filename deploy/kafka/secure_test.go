package kafka

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/claimflow/claimflow/dev/testcerts"
	"github.com/claimflow/claimflow/internal/config"
	cfkafka "github.com/claimflow/claimflow/internal/kafka"
)

// TestSecureListener runs claimflow's own Kafka clients, configured from
// the environment exactly as the services are (internal/config), against
// the SASL_SSL listener of `kafka.sh start --secure`, whose printed lines
// are the environment it needs:
//
//	eval "$(deploy/kafka/kafka.sh start --secure --dir run-secure --base-port 39092 | sed 's/^/export /')"
//	go test -count=1 -run '^TestSecureListener$' ./deploy/kafka/
//
// It is skipped unless KAFKA_SASL_MECHANISM is set.
func TestSecureListener(t *testing.T) {
	if os.Getenv("KAFKA_SASL_MECHANISM") == "" || os.Getenv("KAFKA_BROKERS") == "" {
		t.Skip("KAFKA_SASL_MECHANISM not set: no secure broker to test against (start one with deploy/kafka/kafka.sh start --secure)")
	}
	c, err := config.Load()
	if err != nil {
		t.Fatalf("the environment kafka.sh printed: %v", err)
	}
	if !c.KafkaTLS.Enabled {
		t.Fatal("KAFKA_TLS is off: the secure listener takes only TLS")
	}
	cfg := c.Kafka("claimflow-secure-test")

	t.Run("produce and read back", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if err := cfkafka.Ping(ctx, cfg); err != nil {
			t.Fatalf("ping: %v", err)
		}
		topic := fmt.Sprintf("claimflow-secure-%d", time.Now().UnixNano())
		if err := cfkafka.EnsureTopics(ctx, cfg, []cfkafka.Topic{{Name: topic, Partitions: testPartitions, Replicas: 1}}); err != nil {
			t.Fatalf("create topic: %v", err)
		}
		p, err := cfkafka.NewProducer(cfg)
		if err != nil {
			t.Fatalf("producer: %v", err)
		}
		// Signed as the worker signs: the records are what the consumer
		// would act on.
		producer := cfkafka.SigningProducer{SyncProducer: p, Key: []byte("0123456789abcdef0123456789abcdef")}
		const n = 200
		for i := range n {
			if _, _, err := producer.SendMessage(&sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(fmt.Sprint(i % 7)),
				Value: sarama.StringEncoder(fmt.Sprintf(`{"event_id":"secure-%d","type":"test"}`, i))}); err != nil {
				t.Fatalf("send %d: %v", i, err)
			}
		}
		if err := producer.Close(); err != nil {
			t.Fatal(err)
		}
		// Leaders may take a moment to be known by every client.
		var records int
		for {
			got, missing, err := cfkafka.ReadTopics(ctx, cfg, []string{topic})
			records = len(got)
			if err == nil && len(missing) == 0 && records == n {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("read back %d of %d records; missing %v, last error %v", records, n, missing, err)
			}
			time.Sleep(500 * time.Millisecond)
		}
		t.Logf("sent %d signed records through SASL_SSL (%s as %s) and read them back", n, cfg.SASL.Mechanism, cfg.SASL.User)
	})

	// The refusals an operator meets: each is an AuthError naming what to
	// check, returned at once (no retry loop), without the password.
	for _, tc := range []struct {
		name   string
		change func(*cfkafka.Config)
		want   string
	}{
		{"a wrong password", func(c *cfkafka.Config) { c.SASL.Password += "-wrong" },
			"Kafka refused the SASL credentials of KAFKA_SASL_USERNAME=" + cfg.SASL.User + " (KAFKA_SASL_MECHANISM=" + cfg.SASL.Mechanism + "): check KAFKA_SASL_PASSWORD"},
		{"a mechanism the listener does not offer", func(c *cfkafka.Config) { c.SASL.Mechanism = cfkafka.SASLScram256 },
			"does not offer KAFKA_SASL_MECHANISM=SCRAM-SHA-256 on this listener"},
		{"a CA that did not sign the broker", func(c *cfkafka.Config) {
			c.TLS.CA = testcerts.NewCA(t, "other").WriteCA(t, t.TempDir(), "other-ca.pem")
		}, "Kafka's TLS certificate is not signed by the CA in KAFKA_TLS_CA_PATH="},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := cfg
			tc.change(&bad)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for _, step := range []struct {
				what string
				do   func() error
			}{
				{"readiness", func() error { return cfkafka.Ping(ctx, bad) }},
				{"producer", func() error {
					p, err := cfkafka.NewProducer(bad)
					if err == nil {
						_ = p.Close()
					}
					return err
				}},
			} {
				began := time.Now()
				err := step.do()
				took := time.Since(began)
				t.Logf("%s, after %v: %v", step.what, took.Round(time.Millisecond), err)
				switch {
				case err == nil:
					t.Fatalf("%s: connected", step.what)
				case !cfkafka.IsAuthError(err) || !strings.Contains(err.Error(), tc.want):
					t.Errorf("%s: %v\nwant an AuthError containing %q", step.what, err, tc.want)
				case strings.Contains(err.Error(), bad.SASL.Password):
					t.Errorf("%s: the error shows the password", step.what)
				}
				if took > 10*time.Second {
					t.Errorf("%s: took %v to give up", step.what, took)
				}
			}
		})
	}
}
