package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/client"

	"github.com/claimflow/claimflow/activities"
	"github.com/claimflow/claimflow/api"
	appconfig "github.com/claimflow/claimflow/internal/config"
	"github.com/claimflow/claimflow/internal/services"
)

// The names bench.go uses from before the configuration and the services
// moved to internal/. The bench is leaving this command for its own
// (cmd/claimflow-bench); this file goes with it.

// config is the configuration type under the name bench.go knows.
type config = appconfig.Config

const authJWKS = appconfig.AuthJWKS

func readSecretFile(dataDir string) (string, error) { return appconfig.ReadSecretFile(dataDir) }

func signToken(secret, sub, role string, ttl time.Duration, issuer, audience string) (string, error) {
	return api.SignHS256(secret, sub, role, ttl, issuer, audience)
}

func openDB(ctx context.Context, cfg appconfig.Config, maxConns int32) (*pgxpool.Pool, error) {
	return services.OpenDB(ctx, cfg, maxConns)
}

func dialTemporal(ctx context.Context, cfg appconfig.Config, log *slog.Logger, tel *services.Telemetry) (client.Client, error) {
	return services.DialTemporal(ctx, cfg, log, tel)
}

func kafkaConfig(cfg appconfig.Config, clientID string) activities.KafkaConfig {
	return services.KafkaConfig(cfg, clientID)
}
