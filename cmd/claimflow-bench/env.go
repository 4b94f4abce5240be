package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/client"
	temporallog "go.temporal.io/sdk/log"

	"github.com/claimflow/claimflow/activities"
	"github.com/claimflow/claimflow/api"
)

// benchEnv is what the bench reads from the environment: the same names and
// defaults as claimflow's own commands, so it finds 'claimflow dev' with no
// setup. It reads only what it uses; the service's configuration stays the
// service's.
type benchEnv struct {
	DatabaseURL     string
	TemporalAddress string
	Namespace       string
	KafkaBrokers    []string
	KafkaVersion    string
	// HTTPAddr is the API's listen address: the default --target.
	HTTPAddr string
	// MaxActivities is claimflow's worker setting, copied by floor's worker.
	MaxActivities int
	// AuthMode, JWTSecret, Issuer and Audience sign the default token.
	AuthMode  string
	JWTSecret string
	Issuer    string
	Audience  string
	LogLevel  slog.Level
	LogFormat string
}

// envNames lists every variable the bench reads, for its usage text.
var envNames = []string{
	"DATABASE_URL", "TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE", "KAFKA_BROKERS", "KAFKA_VERSION",
	"HTTP_ADDR", "WORKER_MAX_ACTIVITIES", "AUTH_MODE", "JWT_SECRET", "JWT_ISSUER", "JWT_AUDIENCE",
	"LOG_LEVEL", "LOG_FORMAT",
}

func loadEnv() (benchEnv, error) {
	e := benchEnv{
		DatabaseURL:     envOr("DATABASE_URL", "postgres://claimflow@127.0.0.1:55432/claimflow?sslmode=disable"),
		TemporalAddress: envOr("TEMPORAL_ADDRESS", "127.0.0.1:7233"),
		Namespace:       envOr("TEMPORAL_NAMESPACE", "default"),
		KafkaBrokers:    strings.Split(envOr("KAFKA_BROKERS", "127.0.0.1:9092"), ","),
		KafkaVersion:    os.Getenv("KAFKA_VERSION"),
		HTTPAddr:        envOr("HTTP_ADDR", "127.0.0.1:8080"),
		AuthMode:        strings.ToLower(envOr("AUTH_MODE", "hs256")),
		JWTSecret:       os.Getenv("JWT_SECRET"),
		Issuer:          os.Getenv("JWT_ISSUER"),
		Audience:        os.Getenv("JWT_AUDIENCE"),
		LogFormat:       envOr("LOG_FORMAT", "json"),
	}
	n, err := strconv.Atoi(envOr("WORKER_MAX_ACTIVITIES", "200"))
	if err != nil || n < 1 {
		return e, fmt.Errorf("WORKER_MAX_ACTIVITIES must be a positive integer, got %q", os.Getenv("WORKER_MAX_ACTIVITIES"))
	}
	e.MaxActivities = n
	if err := e.LogLevel.UnmarshalText([]byte(envOr("LOG_LEVEL", "info"))); err != nil {
		return e, fmt.Errorf("LOG_LEVEL: %w", err)
	}
	if e.LogFormat != "json" && e.LogFormat != "text" {
		return e, fmt.Errorf("LOG_FORMAT must be json or text, got %q", e.LogFormat)
	}
	return e, nil
}

func envOr(name, def string) string {
	if v, ok := os.LookupEnv(name); ok && v != "" {
		return v
	}
	return def
}

func (e benchEnv) kafkaConfig(clientID string) activities.KafkaConfig {
	return activities.KafkaConfig{Brokers: e.KafkaBrokers, Version: e.KafkaVersion, ClientID: clientID}
}

func openDB(ctx context.Context, e benchEnv, maxConns int32) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(e.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	pc.MaxConns = maxConns
	// The same planner setting as claimflow's own pools: the peer's outbox
	// writes and the audit then meet the growing tables as claimflow's
	// statements do, and a generic plan cached while a table was small
	// cannot skew one arm. A DATABASE_URL that sets plan_cache_mode wins.
	if _, set := pc.ConnConfig.RuntimeParams["plan_cache_mode"]; !set {
		pc.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_custom_plan"
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("connect to Postgres: %w", err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("reach Postgres at %s: %w", pc.ConnConfig.Host, err)
	}
	return pool, nil
}

func dialTemporal(ctx context.Context, e benchEnv, log *slog.Logger) (client.Client, error) {
	c, err := client.DialContext(ctx, client.Options{
		HostPort:  e.TemporalAddress,
		Namespace: e.Namespace,
		Logger:    temporallog.NewStructuredLogger(log.With("component", "temporal-sdk")),
	})
	if err != nil {
		return nil, fmt.Errorf("connect to Temporal at %s: %w", e.TemporalAddress, err)
	}
	return c, nil
}

// secretFile is where 'claimflow dev' keeps the HS256 secret it generated.
const secretFile = "jwt-secret"

// mintAdminToken signs an admin token for the local stack with JWT_SECRET or
// the dev stack's jwt-secret file, since the bench creates courses and
// enrolls any student. Without either (AUTH_MODE=jwks, or an API run with
// --insecure-no-auth) it returns no token: pass --token then.
func mintAdminToken(e benchEnv, dataDir string, ttl time.Duration) (string, error) {
	if e.AuthMode == "jwks" {
		return "", nil // tokens come from the identity provider
	}
	secret := e.JWTSecret
	if secret == "" {
		path := filepath.Join(dataDir, secretFile)
		b, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			return "", nil
		}
		if err != nil {
			return "", fmt.Errorf("read the JWT secret: %w", err)
		}
		if secret = strings.TrimSpace(string(b)); secret == "" {
			return "", fmt.Errorf("%s is empty", path)
		}
	}
	if len(secret) < api.MinHS256SecretBytes {
		return "", fmt.Errorf("the HS256 secret must be at least %d bytes", api.MinHS256SecretBytes)
	}
	now := time.Now()
	claims := struct {
		Role string `json:"role"`
		jwt.RegisteredClaims
	}{
		Role: api.RoleAdmin,
		RegisteredClaims: jwt.RegisteredClaims{
			Subject:   "claimflow-bench",
			Issuer:    e.Issuer,
			IssuedAt:  jwt.NewNumericDate(now),
			ExpiresAt: jwt.NewNumericDate(now.Add(ttl)),
		},
	}
	if e.Audience != "" {
		claims.Audience = jwt.ClaimStrings{e.Audience}
	}
	token, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString([]byte(secret))
	if err != nil {
		return "", fmt.Errorf("sign the bench's token: %w", err)
	}
	return token, nil
}
