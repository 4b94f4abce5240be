package config

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/claimflow/claimflow/internal/kafka"
	"github.com/claimflow/claimflow/internal/tlsfiles"
)

// The variables of the secured connections. Temporal's are the names the
// Temporal CLI and the SDK's environment configuration read, so one
// environment serves claimflow, `temporal` and the setup job alike.
var (
	temporalTLSVars = tlsfiles.Vars{Enabled: "TEMPORAL_TLS", CA: "TEMPORAL_TLS_SERVER_CA_CERT_PATH",
		Cert: "TEMPORAL_TLS_CLIENT_CERT_PATH", Key: "TEMPORAL_TLS_CLIENT_KEY_PATH", ServerName: "TEMPORAL_TLS_SERVER_NAME"}
	kafkaTLSVars = tlsfiles.Vars{Enabled: "KAFKA_TLS", CA: "KAFKA_TLS_CA_PATH",
		Cert: "KAFKA_TLS_CERT_PATH", Key: "KAFKA_TLS_KEY_PATH", ServerName: "KAFKA_TLS_SERVER_NAME"}
)

// Kafka is the Kafka client configuration of c for clientID.
func (c Config) Kafka(clientID string) kafka.Config {
	return kafka.Config{Brokers: c.KafkaBrokers, Version: c.KafkaVersion, ClientID: clientID, Linger: c.KafkaLinger, TLS: c.KafkaTLS, SASL: c.KafkaSASL}
}

// maxKafkaLinger bounds KAFKA_LINGER: every batch's publish waits for it.
const maxKafkaLinger = time.Second

// tlsFiles reads one connection's TLS variables. TLS is on when its
// switch says true, or is unset while any file, server name or (extra)
// credential is given; "false" turns it off, and Check then refuses any
// file given with it.
func tlsFiles(e env, v tlsfiles.Vars, impliedBy ...string) (tlsfiles.Files, error) {
	f := tlsfiles.Files{CA: e.get(v.CA), Cert: e.get(v.Cert), Key: e.get(v.Key), ServerName: e.get(v.ServerName), Vars: v}
	switch s := strings.ToLower(e.get(v.Enabled)); s {
	case "":
		f.Enabled = f.CA != "" || f.Cert != "" || f.Key != "" || f.ServerName != ""
		for _, name := range impliedBy {
			f.Enabled = f.Enabled || e.get(name) != ""
		}
	default:
		on, err := strconv.ParseBool(s)
		if err != nil {
			return f, fmt.Errorf("%s must be true or false, got %q", v.Enabled, e.raw(v.Enabled))
		}
		f.Enabled = on
	}
	return f, f.Check()
}

// loadConnections reads the TLS, API-key and SASL settings of Temporal and
// Kafka, and checks every file they name before anything is dialed.
func loadConnections(e env, c *Config) error {
	var err error
	c.TemporalAPIKey = e.get("TEMPORAL_API_KEY")
	if c.TemporalTLS, err = tlsFiles(e, temporalTLSVars, "TEMPORAL_API_KEY"); err != nil {
		return err
	}
	if c.TemporalAPIKey != "" && !c.TemporalTLS.Enabled {
		return fmt.Errorf("TEMPORAL_API_KEY is set while TEMPORAL_TLS=false: an API key must not travel in plaintext")
	}
	if c.KafkaLinger, err = time.ParseDuration(e.get("KAFKA_LINGER")); err != nil || c.KafkaLinger < 0 || c.KafkaLinger > maxKafkaLinger {
		return fmt.Errorf("KAFKA_LINGER must be a duration from 0 to %v, got %q", maxKafkaLinger, e.raw("KAFKA_LINGER"))
	}
	if c.KafkaTLS, err = tlsFiles(e, kafkaTLSVars); err != nil {
		return err
	}
	s := kafka.SASL{Mechanism: strings.ToUpper(e.get("KAFKA_SASL_MECHANISM")), User: e.get("KAFKA_SASL_USERNAME"),
		Password: e.get("KAFKA_SASL_PASSWORD"), TokenFile: e.get("KAFKA_SASL_OAUTHBEARER_TOKEN_PATH")}
	switch s.Mechanism {
	case "":
		for _, name := range []string{"KAFKA_SASL_USERNAME", "KAFKA_SASL_PASSWORD", "KAFKA_SASL_OAUTHBEARER_TOKEN_PATH"} {
			if e.get(name) != "" {
				return fmt.Errorf("%s is set without KAFKA_SASL_MECHANISM (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER)", name)
			}
		}
	case kafka.SASLPlain, kafka.SASLScram256, kafka.SASLScram512:
		if s.User == "" || s.Password == "" {
			return fmt.Errorf("KAFKA_SASL_MECHANISM=%s needs KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD", s.Mechanism)
		}
		if s.TokenFile != "" {
			return fmt.Errorf("KAFKA_SASL_OAUTHBEARER_TOKEN_PATH is set with KAFKA_SASL_MECHANISM=%s: it belongs to OAUTHBEARER", s.Mechanism)
		}
	case kafka.SASLOAuthBearer:
		if s.TokenFile == "" {
			return fmt.Errorf("KAFKA_SASL_MECHANISM=OAUTHBEARER needs KAFKA_SASL_OAUTHBEARER_TOKEN_PATH (a file holding the current token)")
		}
		if _, err := os.ReadFile(s.TokenFile); err != nil {
			return fmt.Errorf("KAFKA_SASL_OAUTHBEARER_TOKEN_PATH: %w", err)
		}
	default:
		return fmt.Errorf("KAFKA_SASL_MECHANISM must be PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER, got %q", e.raw("KAFKA_SASL_MECHANISM"))
	}
	if s.Mechanism == kafka.SASLPlain && !c.KafkaTLS.Enabled {
		return fmt.Errorf("KAFKA_SASL_MECHANISM=PLAIN needs KAFKA_TLS: PLAIN sends the password as it is")
	}
	c.KafkaSASL = s
	return nil
}
