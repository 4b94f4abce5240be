package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/interceptor"
	temporallog "go.temporal.io/sdk/log"
	sdkworker "go.temporal.io/sdk/worker"

	"github.com/claimflow/claimflow/activities"
	"github.com/claimflow/claimflow/api"
	"github.com/claimflow/claimflow/worker"
)

func kafkaConfig(cfg config, clientID string) activities.KafkaConfig {
	return activities.KafkaConfig{Brokers: cfg.KafkaBrokers, Version: cfg.KafkaVersion, ClientID: clientID}
}

func openDB(ctx context.Context, cfg config, maxConns int32) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	pc.MaxConns = maxConns
	// The batch statements look rows up by "= ANY($1)" with hundreds of IDs.
	// A generic plan cached while a table was small (or before autovacuum
	// ever analyzed it) scans the whole table on every call, and stays
	// cached: measured at 2,000 req/s, it read 28M notification rows and
	// 5.8M enrollment rows in 45 s. A custom plan per call sees the array
	// and the table as they are; planning costs ~0.3 ms per batch. A
	// DATABASE_URL that sets plan_cache_mode itself wins.
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

func dialTemporal(ctx context.Context, cfg config, log *slog.Logger, tel *telemetry) (client.Client, error) {
	c, err := client.DialContext(ctx, client.Options{
		HostPort:  cfg.TemporalAddress,
		Namespace: cfg.Namespace,
		Logger:    temporallog.NewStructuredLogger(log.With("component", "temporal-sdk")),
		// nil telemetry (one-shot tools such as replay) records nothing.
		MetricsHandler: metricsHandler(tel),
	})
	if err != nil {
		return nil, fmt.Errorf("connect to Temporal at %s: %w", cfg.TemporalAddress, err)
	}
	return c, nil
}

// apiService is a running HTTP API.
type apiService struct {
	server  *http.Server
	handler *api.Handler
	done    chan struct{} // closed when Serve returned; err says why
	err     error
	Addr    string
}

// startAPI serves the API on cfg.HTTPAddr until Stop.
func startAPI(cfg config, log *slog.Logger, pool *pgxpool.Pool, tc client.Client, tel *telemetry) (*apiService, error) {
	security, err := cfg.Security.apiSecurity(log)
	if err != nil {
		return nil, err
	}
	var batching *api.BatchOptions
	if cfg.EnrollMode == "batch" {
		batching = &api.BatchOptions{MaxBatch: cfg.ClaimBatchMax, InFlight: cfg.ClaimBatchInFlight,
			MaxAttrBytes: cfg.ClaimBatchAttrBytes}
	}
	handler := api.New(api.Config{
		Security:  security,
		Batching:  batching,
		Metrics:   tel.Registry,
		Gatherer:  tel.Registry,
		Temporal:  tc,
		DB:        pool,
		Log:       log.With("component", "api"),
		UIURL:     cfg.TemporalUIURL,
		Namespace: cfg.Namespace,
		Checks: map[string]api.Check{
			"postgres": pool.Ping,
			"temporal": func(ctx context.Context) error {
				_, err := tc.CheckHealth(ctx, &client.CheckHealthRequest{})
				return err
			},
			"kafka": func(ctx context.Context) error {
				return activities.Ping(ctx, kafkaConfig(cfg, "claimflow-readyz"))
			},
		},
	})
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s (HTTP_ADDR): %w", cfg.HTTPAddr, err)
	}
	s := &apiService{
		handler: handler,
		server: &http.Server{
			Handler:           handler,
			ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout:       10 * time.Second,
			WriteTimeout:      40 * time.Second,
			IdleTimeout:       120 * time.Second,
		},
		done: make(chan struct{}),
		Addr: ln.Addr().String(),
	}
	go func() {
		defer close(s.done)
		if err := s.server.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			s.err = err
		}
	}()
	log.Info("API listening", "addr", "http://"+s.Addr)
	return s, nil
}

// Stop lets in-flight requests finish, up to ctx.
func (s *apiService) Stop(ctx context.Context) error {
	err := s.server.Shutdown(ctx)
	<-s.done
	s.handler.Close()
	return errors.Join(err, s.err)
}

// workerService is a running Temporal worker with its Kafka producer.
type workerService struct {
	w        sdkworker.Worker
	producer sarama.SyncProducer
}

func startWorker(cfg config, log *slog.Logger, pool *pgxpool.Pool, tc client.Client, tel *telemetry) (*workerService, error) {
	producer, err := activities.NewProducer(kafkaConfig(cfg, "claimflow-worker"))
	if err != nil {
		return nil, err
	}
	acts := &activities.Activities{DB: pool, Producer: producer, Log: log.With("component", "activities"),
		Metrics: tel.Activities, Payouts: activities.NewPayouts(cfg.PayoutURL, cfg.PayoutTimeout),
		Sink: notifySink(cfg, pool)}
	w := worker.New(tc, acts, acts, worker.Options{
		MaxConcurrentActivities: cfg.MaxActivities,
		Interceptors:            []interceptor.WorkerInterceptor{worker.NewAttemptMetrics(tel.Registry)},
	})
	if err := w.Start(); err != nil {
		_ = producer.Close()
		return nil, fmt.Errorf("start worker: %w", err)
	}
	log.Info("worker polling", "task_queue", "claimflow")
	return &workerService{w: w, producer: producer}, nil
}

// Stop waits for in-flight activities (bounded by the worker's stop timeout)
// before closing the producer they publish with.
func (s *workerService) Stop() error {
	s.w.Stop()
	return s.producer.Close()
}

func runAPICommand(ctx context.Context, cfg config, log *slog.Logger, args []string) error {
	fs := flag.NewFlagSet("api", flag.ContinueOnError)
	migrate := fs.Bool("migrate", true, "apply database migrations before serving")
	fs.BoolVar(&cfg.Security.InsecureNoAuth, "insecure-no-auth", false, "serve without authentication, every request acting as an admin (never in production)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	conn, err := connect(ctx, cfg, log, 32, *migrate, "")
	if err != nil {
		return err
	}
	defer conn.Close()
	pool, tc, tel := conn.Pool, conn.Temporal, conn.Telemetry
	svc, err := startAPI(cfg, log, pool, tc, tel)
	if err != nil {
		return err
	}
	select {
	case <-ctx.Done():
	case <-svc.done:
		return fmt.Errorf("API stopped serving: %w", svc.err)
	}
	log.Info("shutting down API")
	stopCtx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	return svc.Stop(stopCtx)
}

func runWorkerCommand(ctx context.Context, cfg config, log *slog.Logger, args []string) error {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	if err := fs.Parse(args); err != nil {
		return err
	}
	conn, err := connect(ctx, cfg, log, int32(min(cfg.MaxActivities, 64)), false, cfg.MetricsAddr)
	if err != nil {
		return err
	}
	defer conn.Close()
	pool, tc, tel := conn.Pool, conn.Temporal, conn.Telemetry
	svc, err := startWorker(cfg, log, pool, tc, tel)
	if err != nil {
		return err
	}
	<-ctx.Done()
	log.Info("shutting down worker")
	return svc.Stop()
}

func runMigrate(ctx context.Context, cfg config, log *slog.Logger, args []string) error {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	if err := fs.Parse(args); err != nil {
		return err
	}
	pool, err := openDB(ctx, cfg, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	return activities.Migrate(ctx, pool, log)
}

func metricsHandler(tel *telemetry) client.MetricsHandler {
	if tel == nil {
		return nil
	}
	return tel.Temporal.Handler()
}

// connection is what a service process holds: Postgres, Temporal and its
// metrics (served on metricsAddr when the process has no API to serve them).
type connection struct {
	Pool      *pgxpool.Pool
	Temporal  client.Client
	Telemetry *telemetry
	closers   []func()
}

// connect opens what every service command needs, migrating first if asked.
func connect(ctx context.Context, cfg config, log *slog.Logger, maxConns int32, migrate bool, metricsAddr string) (c *connection, err error) {
	c = &connection{Telemetry: newTelemetry()}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	if c.Pool, err = openDB(ctx, cfg, maxConns); err != nil {
		return c, err
	}
	c.closers = append(c.closers, c.Pool.Close)
	if migrate {
		if err := activities.Migrate(ctx, c.Pool, log); err != nil {
			return c, err
		}
	}
	stopMetrics, err := serveMetrics(metricsAddr, c.Telemetry, log)
	if err != nil {
		return c, err
	}
	c.closers = append(c.closers, stopMetrics)
	if c.Temporal, err = dialTemporal(ctx, cfg, log, c.Telemetry); err != nil {
		return c, err
	}
	c.closers = append(c.closers, c.Temporal.Close)
	return c, nil
}

// Close releases in reverse order of opening.
func (c *connection) Close() {
	for i := len(c.closers) - 1; i >= 0; i-- {
		c.closers[i]()
	}
	c.closers = nil
}
