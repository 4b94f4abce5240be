package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"time"

	"go.temporal.io/sdk/client"
	temporallog "go.temporal.io/sdk/log"

	"github.com/claimflow/claimflow/api"
	"github.com/claimflow/claimflow/bench"
	"github.com/claimflow/claimflow/dev/audit"
	"github.com/claimflow/claimflow/internal/config"
	"github.com/claimflow/claimflow/internal/kafka"
	"github.com/claimflow/claimflow/internal/temporalconn"
	"github.com/jackc/pgx/v5/pgxpool"
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
	// InternalHTTPAddr, when set, is where that API serves /metrics: the
	// default --metrics.
	InternalHTTPAddr string
	// MaxActivities is claimflow's worker setting, copied by floor's worker.
	MaxActivities int
	// AuthMode, JWTSecret, Issuer and Audience sign the default token.
	AuthMode  string
	JWTSecret string
	Issuer    string
	Audience  string
	LogLevel  slog.Level
	LogFormat string

	// MigrateDatabaseURL is the schema owner's: the outbox peer creates
	// its tables with it.
	MigrateDatabaseURL string
	// RecoveryBound is the longest a reservation may have no run to
	// finish it (RECOVERY_AFTER, RECOVERY_EVERY).
	RecoveryBound time.Duration
	// cfg is the whole configuration, for the connections' security.
	cfg config.Config
}

// loadEnv reads the bench's settings through claimflow's own configuration
// (internal/config), so names and defaults have one source and the bench
// finds 'claimflow dev' with no setup.
func loadEnv() (benchEnv, error) {
	cfg, err := config.Load()
	if err != nil {
		return benchEnv{}, err
	}
	return benchEnv{
		DatabaseURL:      cfg.DatabaseURL,
		TemporalAddress:  cfg.TemporalAddress,
		Namespace:        cfg.Namespace,
		KafkaBrokers:     cfg.KafkaBrokers,
		KafkaVersion:     cfg.KafkaVersion,
		HTTPAddr:         cfg.HTTPAddr,
		InternalHTTPAddr: cfg.InternalHTTPAddr,
		MaxActivities:    cfg.MaxActivities,
		AuthMode:         cfg.Security.AuthMode,
		JWTSecret:        cfg.Security.JWTSecret,
		Issuer:           cfg.Security.Issuer,
		Audience:         cfg.Security.Audience,
		LogLevel:         cfg.LogLevel,
		LogFormat:        cfg.LogFormat,

		MigrateDatabaseURL: cfg.MigrateDatabaseURL,
		RecoveryBound:      cfg.RecoveryBound(),
		cfg:                cfg,
	}, nil
}

func (e benchEnv) kafkaConfig(clientID string) kafka.Config {
	k := e.cfg.Kafka(clientID)
	k.Brokers, k.Version = e.KafkaBrokers, e.KafkaVersion
	return k
}

func dialTemporal(ctx context.Context, e benchEnv, log *slog.Logger) (client.Client, error) {
	cfg := e.cfg
	cfg.TemporalAddress, cfg.Namespace = e.TemporalAddress, e.Namespace
	return temporalconn.Dial(ctx, cfg, client.Options{Logger: temporallog.NewStructuredLogger(log.With("component", "temporal-sdk"))})
}

// mintAdminToken signs an admin token for the local stack with JWT_SECRET or
// the dev stack's jwt-secret file, since the bench creates courses and
// enrolls any student. Without either (AUTH_MODE=jwks, or an API run with
// --insecure-no-auth) it returns no token: pass --token then.
func mintAdminToken(e benchEnv, dataDir string, ttl time.Duration) (string, error) {
	if e.AuthMode == config.AuthJWKS {
		return "", nil // tokens come from the identity provider
	}
	secret := e.JWTSecret
	if secret == "" {
		var err error
		secret, err = config.ReadSecretFile(dataDir)
		if errors.Is(err, fs.ErrNotExist) {
			return "", nil
		}
		if err != nil {
			return "", fmt.Errorf("read the JWT secret: %w", err)
		}
	}
	token, err := api.SignHS256(secret, "claimflow-bench", api.RoleAdmin, ttl, e.Issuer, e.Audience)
	if err != nil {
		return "", fmt.Errorf("sign the bench's token: %w", err)
	}
	return token, nil
}

// studentSigner signs students' own tokens the way mintAdminToken signs the
// bench's, for the read bench (each student reads as itself).
func studentSigner(e benchEnv, dataDir string, ttl time.Duration) (func(string) (string, error), error) {
	if e.AuthMode == config.AuthJWKS {
		return nil, errors.New("reads needs students' tokens: with AUTH_MODE=jwks the identity provider mints them")
	}
	secret := e.JWTSecret
	if secret == "" {
		var err error
		if secret, err = config.ReadSecretFile(dataDir); err != nil {
			return nil, fmt.Errorf("read the JWT secret (JWT_SECRET or %s/jwt-secret): %w", dataDir, err)
		}
	}
	return func(sub string) (string, error) {
		return api.SignHS256(secret, sub, "", ttl, e.Issuer, e.Audience)
	}, nil
}

// reservationHolders asks Temporal, after a run of claimflow's arm, who
// holds the enrollments still reserved (dev/audit.CheckReservations), so
// that the audit calls in flight only what a live run holds.
func reservationHolders(e benchEnv, pool *pgxpool.Pool, log *slog.Logger) func(context.Context, string) (bench.Holders, error) {
	return func(ctx context.Context, prefix string) (bench.Holders, error) {
		tc, err := dialTemporal(ctx, e, log)
		if err != nil {
			return bench.Holders{}, err
		}
		defer tc.Close()
		r, err := audit.CheckReservations(ctx, pool, tc, e.Namespace, prefix, e.RecoveryBound)
		if err != nil {
			return bench.Holders{}, err
		}
		h := bench.Holders{InFlight: r.InFlight, Orphaned: len(r.Orphaned), Overdue: r.Overdue(), BoundS: r.Bound.Seconds()}
		for i, o := range r.Orphaned {
			h.OldestOrphan = max(h.OldestOrphan, o.Age.Seconds())
			if i < 10 {
				h.OrphanIDs = append(h.OrphanIDs, o.EnrollmentID)
			}
		}
		return h, nil
	}
}
