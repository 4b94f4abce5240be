package main

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"
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
}

// envVars lists every variable the binary reads, for `claimflow help` and
// for the compose test that checks docker-compose.yml sets only these.
var envVars = []string{
	"DATABASE_URL", "TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE", "TEMPORAL_UI_URL",
	"KAFKA_BROKERS", "KAFKA_VERSION", "HTTP_ADDR", "LOG_LEVEL",
	"WORKER_MAX_ACTIVITIES", "SHUTDOWN_TIMEOUT", "TEMPORAL_CLI", "METRICS_ADDR", "LOG_FORMAT",
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
	c.MaxActivities = n
	c.ShutdownTimeout, err = time.ParseDuration(env("SHUTDOWN_TIMEOUT", "25s"))
	if err != nil {
		return c, fmt.Errorf("SHUTDOWN_TIMEOUT: %w", err)
	}
	return c, nil
}

func env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok && v != "" {
		return v
	}
	return def
}
