package main

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/claimflow/claimflow/activities"
	"github.com/claimflow/claimflow/workflows"
)

// config is read from the environment; every variable has a default that
// fits the local stack, so `claimflow api` and `claimflow worker` run with
// no setup against `claimflow dev`'s services.
type config struct {
	DatabaseURL     string
	TemporalAddress string
	Namespace       string
	TemporalUIURL   string
	KafkaBrokers    []string
	KafkaVersion    string
	HTTPAddr        string
	LogLevel        slog.Level
	// MaxActivities bounds concurrent activities per worker process.
	MaxActivities int
	// ShutdownTimeout bounds graceful shutdown after SIGTERM.
	ShutdownTimeout time.Duration
	// MetricsAddr serves /metrics for processes without an API (worker).
	MetricsAddr string
	// LogFormat is json (production) or text (a terminal).
	LogFormat string
	// Security is authentication and load limits of the API (security.go).
	Security securityConfig
	// PayoutURL is the vendors' payout API; PayoutTimeout bounds one call.
	PayoutURL     string
	PayoutTimeout time.Duration
	// ConsumerTopics and ConsumerGroup are what `claimflow consumer` reads
	// and as whom; ConsumerBatch bounds the records applied together.
	ConsumerTopics []string
	ConsumerGroup  string
	ConsumerBatch  int
	// NotifyWebhookURL, when set, receives every notification before it is
	// recorded (consumer and worker both); empty means the table alone.
	NotifyWebhookURL string
	// EnrollMode is "batch" (group commit, the default) or "single" (one
	// Enrollment run per request).
	EnrollMode string
	// ClaimBatchMax and ClaimBatchInFlight tune group commit.
	ClaimBatchMax      int
	ClaimBatchInFlight int
	// ClaimBatchAttrBytes bounds a batch's CourseId/StudentId search
	// attribute values; it must not exceed the server's
	// frontend.searchAttributesSizeOfValueLimit (2048 by default).
	ClaimBatchAttrBytes int
}

// envVars lists every variable the binary reads, for `claimflow help` and
// for the compose test that checks docker-compose.yml sets only these.
var envVars = []string{
	"DATABASE_URL", "TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE", "TEMPORAL_UI_URL",
	"KAFKA_BROKERS", "KAFKA_VERSION", "HTTP_ADDR", "LOG_LEVEL",
	"WORKER_MAX_ACTIVITIES", "SHUTDOWN_TIMEOUT", "TEMPORAL_CLI", "METRICS_ADDR", "LOG_FORMAT",
	"AUTH_MODE", "JWT_SECRET", "JWKS_URL", "JWT_ISSUER", "JWT_AUDIENCE",
	"RATE_LIMIT_PER_SUBJECT", "RATE_LIMIT_BURST", "RATE_LIMIT_ADMIN", "MAX_INFLIGHT_CLAIMS",
	"VENDOR_PAYOUT_URL", "PAYOUT_TIMEOUT",
	"CONSUMER_TOPICS", "CONSUMER_GROUP", "CONSUMER_BATCH", "NOTIFY_WEBHOOK_URL",
	"ENROLL_MODE", "CLAIM_BATCH_MAX", "CLAIM_BATCH_INFLIGHT", "CLAIM_BATCH_ATTR_BYTES",
}

func loadConfig() (config, error) {
	c := config{
		DatabaseURL:     env("DATABASE_URL", "postgres://claimflow@127.0.0.1:55432/claimflow?sslmode=disable"),
		TemporalAddress: env("TEMPORAL_ADDRESS", "127.0.0.1:7233"),
		Namespace:       env("TEMPORAL_NAMESPACE", "default"),
		TemporalUIURL:   env("TEMPORAL_UI_URL", "http://127.0.0.1:8233"),
		KafkaBrokers:    strings.Split(env("KAFKA_BROKERS", "127.0.0.1:9092"), ","),
		KafkaVersion:    env("KAFKA_VERSION", ""),
		HTTPAddr:        env("HTTP_ADDR", "127.0.0.1:8080"),
		MetricsAddr:     env("METRICS_ADDR", "127.0.0.1:9464"),
		LogFormat:       env("LOG_FORMAT", "json"),
	}
	if c.LogFormat != "json" && c.LogFormat != "text" {
		return c, fmt.Errorf("LOG_FORMAT must be json or text, got %q", c.LogFormat)
	}
	if err := c.LogLevel.UnmarshalText([]byte(env("LOG_LEVEL", "info"))); err != nil {
		return c, fmt.Errorf("LOG_LEVEL: %w", err)
	}
	n, err := strconv.Atoi(env("WORKER_MAX_ACTIVITIES", "200"))
	if err != nil || n < 1 {
		return c, fmt.Errorf("WORKER_MAX_ACTIVITIES must be a positive integer, got %q", os.Getenv("WORKER_MAX_ACTIVITIES"))
	}
	c.EnrollMode = env("ENROLL_MODE", "batch")
	if c.EnrollMode != "batch" && c.EnrollMode != "single" {
		return c, fmt.Errorf("ENROLL_MODE must be batch or single, got %q", c.EnrollMode)
	}
	for _, v := range []struct {
		name string
		dst  *int
		def  string
	}{{"CLAIM_BATCH_MAX", &c.ClaimBatchMax, "500"}, {"CLAIM_BATCH_INFLIGHT", &c.ClaimBatchInFlight, "2"},
		{"CLAIM_BATCH_ATTR_BYTES", &c.ClaimBatchAttrBytes, "2000"}} {
		n, err := strconv.Atoi(env(v.name, v.def))
		if err != nil || n < 1 {
			return c, fmt.Errorf("%s must be a positive integer, got %q", v.name, os.Getenv(v.name))
		}
		*v.dst = n
	}
	c.MaxActivities = n
	c.ShutdownTimeout, err = time.ParseDuration(env("SHUTDOWN_TIMEOUT", "25s"))
	if err != nil {
		return c, fmt.Errorf("SHUTDOWN_TIMEOUT: %w", err)
	}
	c.PayoutURL = env("VENDOR_PAYOUT_URL", "http://127.0.0.1:8090/payouts")
	c.PayoutTimeout, err = time.ParseDuration(env("PAYOUT_TIMEOUT", "5s"))
	if err != nil || c.PayoutTimeout <= 0 || c.PayoutTimeout > 15*time.Second {
		// The payout activity's own deadline is 20 s: a longer client
		// timeout would turn a slow answer into a lost one.
		return c, fmt.Errorf("PAYOUT_TIMEOUT must be a duration above 0 and at most 15s, got %q", os.Getenv("PAYOUT_TIMEOUT"))
	}
	c.ConsumerTopics = splitList(env("CONSUMER_TOPICS", strings.Join(workflows.ConsumedTopics, ",")))
	c.ConsumerGroup = env("CONSUMER_GROUP", "claimflow-notifications")
	c.ConsumerBatch, err = strconv.Atoi(env("CONSUMER_BATCH", strconv.Itoa(activities.DefaultConsumerBatch)))
	if err != nil || c.ConsumerBatch < 1 || c.ConsumerBatch > 10000 {
		return c, fmt.Errorf("CONSUMER_BATCH must be an integer from 1 to 10000, got %q", os.Getenv("CONSUMER_BATCH"))
	}
	// No default webhook: an unset URL must not make every notification fail.
	c.NotifyWebhookURL = os.Getenv("NOTIFY_WEBHOOK_URL")
	if err := loadSecurity(&c); err != nil {
		return c, err
	}
	return c, nil
}

func env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok && v != "" {
		return v
	}
	return def
}
