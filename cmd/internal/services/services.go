// Package services runs claimflow's processes: the HTTP API, the Temporal
// worker and the event consumer, alone (the `claimflow api|worker|consumer`
// commands) or all together with their infrastructure (the dev stack).
package services

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/interceptor"
	temporallog "go.temporal.io/sdk/log"
	sdkworker "go.temporal.io/sdk/worker"
	"google.golang.org/grpc"

	"github.com/claimflow/claimflow/activities"
	"github.com/claimflow/claimflow/api"
	"github.com/claimflow/claimflow/consumer"
	"github.com/claimflow/claimflow/internal/config"
	"github.com/claimflow/claimflow/internal/kafka"
	"github.com/claimflow/claimflow/internal/store"
	"github.com/claimflow/claimflow/internal/temporalconn"
	"github.com/claimflow/claimflow/internal/tracing"
	"github.com/claimflow/claimflow/worker"
	"github.com/exaring/otelpgx"
)

// OpenDB opens a pool of at most maxConns connections to cfg.DatabaseURL
// and checks that it answers (store.Open).
func OpenDB(ctx context.Context, cfg config.Config, maxConns int32) (*pgxpool.Pool, error) {
	if tracing.On() {
		return store.Open(ctx, cfg.DatabaseURL, maxConns, otelpgx.NewTracer())
	}
	return store.Open(ctx, cfg.DatabaseURL, maxConns)
}

// DialTemporal connects to cfg's Temporal namespace; tel, when not nil,
// receives the SDK's metrics.
func DialTemporal(ctx context.Context, cfg config.Config, log *slog.Logger, tel *Telemetry) (client.Client, error) {
	var compression client.GrpcCompression // nil: gzip, the SDK's default
	if cfg.TemporalCompression == config.TemporalCompressionNone {
		// Compressing loopback calls costs CPU on both ends and saves nothing.
		compression = &client.GrpcCompressionNone{}
	}
	var retries *prometheus.CounterVec
	if tel != nil {
		retries = tel.ClosingRetries
	}
	var interceptors []interceptor.ClientInterceptor
	if tracing.On() {
		// Carries the trace through Temporal's headers into the workflows
		// and their activities.
		ti, err := tracing.TemporalInterceptor()
		if err != nil {
			return nil, err
		}
		interceptors = append(interceptors, ti)
	}
	return temporalconn.Dial(ctx, cfg, client.Options{
		Interceptors: interceptors,
		ConnectionOptions: client.ConnectionOptions{
			GrpcCompression: compression,
			// Appended to the SDK's interceptors, so innermost: it sees
			// each attempt of a call (closing.go).
			DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(retryClosingRun(retries))},
		},
		Logger: temporallog.NewStructuredLogger(log.With("component", "temporal-sdk")),
		// nil telemetry (one-shot tools such as replay) records nothing.
		MetricsHandler: metricsHandler(tel),
	})
}

// APIService is a running HTTP API.
type APIService struct {
	server   *http.Server
	internal *http.Server // nil without INTERNAL_HTTP_ADDR
	handler  *api.Handler
	done     chan struct{} // closed when Serve returned; err says why
	err      error
	Addr     string
	// InternalAddr serves /metrics, /healthz and the detailed /readyz
	// when INTERNAL_HTTP_ADDR is set; empty otherwise.
	InternalAddr string
}

// Done is closed when the server stopped serving; Err then says why.
func (s *APIService) Done() <-chan struct{} { return s.done }

// Err is why the server stopped serving on its own (nil after Stop).
func (s *APIService) Err() error { return s.err }

// StartAPI serves the API on cfg.HTTPAddr until Stop.
func StartAPI(cfg config.Config, log *slog.Logger, pool *pgxpool.Pool, tc client.Client, tel *Telemetry) (*APIService, error) {
	security, err := APISecurity(cfg.Security, log)
	if err != nil {
		return nil, err
	}
	handler := api.New(api.Config{
		Security: security,
		Batching: api.BatchOptions{MaxBatch: cfg.ClaimBatchMax, Desks: cfg.ClaimDesks, DeskBatches: cfg.ClaimDeskBatches,
			MaxAttrBytes: cfg.ClaimBatchAttrBytes},
		Metrics:          tel.Registry,
		Gatherer:         tel.Registry,
		Temporal:         tc,
		DB:               pool,
		Log:              log.With("component", "api"),
		UIURL:            cfg.TemporalUIURL,
		Namespace:        cfg.Namespace,
		PayoutTimeout:    cfg.PayoutTimeout,
		RequestTimeout:   cfg.RequestTimeout,
		SeparateInternal: cfg.InternalHTTPAddr != "",
		Checks: map[string]api.Check{
			"postgres": pool.Ping,
			"temporal": func(ctx context.Context) error {
				_, err := tc.CheckHealth(ctx, &client.CheckHealthRequest{})
				return err
			},
			"kafka": func(ctx context.Context) error {
				return kafka.Ping(ctx, cfg.Kafka("claimflow-readyz"))
			},
		},
	})
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		handler.Close()
		return nil, fmt.Errorf("listen on %s (HTTP_ADDR): %w", cfg.HTTPAddr, err)
	}
	s := &APIService{
		handler: handler,
		server: &http.Server{
			Handler:           handler,
			ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout:       10 * time.Second,
			// Outlasts the longest route's deadline (a coupon use,
			// whose payout policy runs first), so an answer is never cut
			// off mid-write.
			WriteTimeout: handler.LongestRequest() + 10*time.Second,
			IdleTimeout:  120 * time.Second,
		},
		done: make(chan struct{}),
		Addr: ln.Addr().String(),
	}
	var internalLn net.Listener
	if cfg.InternalHTTPAddr != "" {
		if internalLn, err = net.Listen("tcp", cfg.InternalHTTPAddr); err != nil {
			_ = ln.Close()
			handler.Close()
			return nil, fmt.Errorf("listen on %s (INTERNAL_HTTP_ADDR): %w", cfg.InternalHTTPAddr, err)
		}
		s.InternalAddr = internalLn.Addr().String()
		s.internal = &http.Server{Handler: handler.Internal, ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout: 10 * time.Second, WriteTimeout: 30 * time.Second, IdleTimeout: 120 * time.Second}
	}
	go func() {
		// done closes when either server stops: a dead probe address takes
		// the replica out as surely as a dead API.
		defer close(s.done)
		errs := make(chan error, 2)
		go func() { errs <- serveUntilClosed(s.server, ln) }()
		if s.internal != nil {
			go func() { errs <- serveUntilClosed(s.internal, internalLn) }()
			log.Info("API internal address listening", "addr", "http://"+s.InternalAddr, "serves", "/metrics /healthz /readyz")
		}
		s.err = <-errs
	}()
	log.Info("API listening", "addr", "http://"+s.Addr)
	return s, nil
}

// serveUntilClosed serves ln until srv is shut down (nil) or fails.
func serveUntilClosed(srv *http.Server, ln net.Listener) error {
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Stop lets in-flight requests finish, up to ctx.
func (s *APIService) Stop(ctx context.Context) error {
	err := s.server.Shutdown(ctx)
	if s.internal != nil {
		err = errors.Join(err, s.internal.Shutdown(ctx))
	}
	<-s.done
	s.handler.Close()
	return errors.Join(err, s.err)
}

// WorkerService is a running Temporal worker with its Kafka producer.
type WorkerService struct {
	w        sdkworker.Worker
	producer sarama.SyncProducer
}

// StartWorker polls claimflow's task queue until Stop.
func StartWorker(cfg config.Config, log *slog.Logger, pool *pgxpool.Pool, tc client.Client, tel *Telemetry) (*WorkerService, error) {
	if err := cfg.RequireEventKey("the worker"); err != nil {
		return nil, err
	}
	unsigned, err := kafka.NewProducer(cfg.Kafka("claimflow-worker"))
	if err != nil {
		return nil, err
	}
	// Every record the worker writes is signed: the consumers act on no
	// other (docs/security.md).
	producer := kafka.SigningProducer{SyncProducer: unsigned, Key: []byte(cfg.EventSigningKey)}
	acts := &activities.Activities{DB: pool, Producer: producer, Log: log.With("component", "activities"),
		Metrics: tel.Activities, Payouts: activities.NewPayouts(cfg.PayoutURL, cfg.PayoutTimeout),
		WaitlistPerSeat: cfg.WaitlistPerSeat}
	delivery := &consumer.Activities{DB: pool, Producer: producer, Log: log.With("component", "delivery"),
		Sink: NotifySink(cfg, pool)}
	w := worker.New(tc, acts, delivery, worker.Options{
		MaxConcurrentActivities: cfg.MaxActivities,
		Interceptors:            append([]interceptor.WorkerInterceptor{worker.NewAttemptMetrics(tel.Registry)}, crashInterceptors()...),
	})
	if err := w.Start(); err != nil {
		_ = producer.Close()
		return nil, fmt.Errorf("start worker: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := worker.ScheduleRecovery(ctx, tc, cfg.RecoveryAfter, cfg.RecoveryEvery); err != nil {
		w.Stop()
		_ = producer.Close()
		return nil, err
	}
	log.Info("worker polling", "task_queue", "claimflow")
	return &WorkerService{w: w, producer: producer}, nil
}

// Stop waits for in-flight activities (bounded by the worker's stop timeout)
// before closing the producer they publish with.
func (s *WorkerService) Stop() error {
	s.w.Stop()
	return s.producer.Close()
}

// RunAPI is the `claimflow api` process: it serves until ctx ends, then
// shuts down within cfg.ShutdownTimeout. With migrate it first runs
// Migrate (as the owner), for a single-process setup; a deployment runs
// `claimflow migrate` once instead.
func RunAPI(ctx context.Context, cfg config.Config, log *slog.Logger, migrate bool) error {
	if err := CheckAuth(cfg.Security); err != nil {
		return err
	}
	if err := checkKafkaSecurity(ctx, cfg, log); err != nil {
		return err
	}
	if migrate {
		if err := Migrate(ctx, cfg, log); err != nil {
			return err
		}
	}
	conn, err := Connect(ctx, cfg, log, 32, "")
	if err != nil {
		return err
	}
	defer conn.Close()
	pool, tc, tel := conn.Pool, conn.Temporal, conn.Telemetry
	svc, err := StartAPI(cfg, log, pool, tc, tel)
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

// checkKafkaSecurity connects to Kafka once when TLS or SASL is set, and
// fails when Kafka refuses those settings (a kafka.AuthError: wrong
// password, untrusted certificate): the API does not otherwise use Kafka
// at startup, and its /readyz would fail on them forever. A broker that
// does not answer is left to /readyz, as before. The worker's producer and
// the consumer connect at startup and fail the same way by themselves.
func checkKafkaSecurity(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	if !cfg.KafkaTLS.Enabled && cfg.KafkaSASL.Mechanism == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err := kafka.Ping(ctx, cfg.Kafka("claimflow-api"))
	if kafka.IsAuthError(err) {
		return err
	}
	if err != nil {
		log.Warn("Kafka does not answer yet; /readyz reports it until it does", "error", err)
	}
	return nil
}

// RunWorker is the `claimflow worker` process: it polls until ctx ends.
func RunWorker(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	if err := cfg.RequireEventKey("claimflow worker"); err != nil {
		return err
	}
	conn, err := Connect(ctx, cfg, log, int32(min(cfg.MaxActivities, 64)), cfg.MetricsAddr)
	if err != nil {
		return err
	}
	defer conn.Close()
	pool, tc, tel := conn.Pool, conn.Temporal, conn.Telemetry
	svc, err := StartWorker(cfg, log, pool, tc, tel)
	if err != nil {
		return err
	}
	<-ctx.Done()
	log.Info("shutting down worker")
	return svc.Stop()
}

// Migrate applies the database migrations as the schema owner
// (cfg.MigrateDatabaseURL) and grants the runtime role (cfg.RuntimeRole)
// its DML, then returns: `claimflow migrate`, run once per release.
func Migrate(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	pool, err := store.Open(ctx, cfg.MigrateDatabaseURL, 2)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer pool.Close()
	if err := store.Migrate(ctx, pool, log); err != nil {
		return err
	}
	return store.GrantRuntime(ctx, pool, cfg.RuntimeRole, log)
}

func metricsHandler(tel *Telemetry) client.MetricsHandler {
	if tel == nil {
		return nil
	}
	return tel.Temporal.Handler()
}

// Connection is what a service process holds: Postgres, Temporal and its
// metrics (served on metricsAddr when the process has no API to serve them).
type Connection struct {
	Pool      *pgxpool.Pool
	Temporal  client.Client
	Telemetry *Telemetry
	closers   []func()
}

// Connect opens what every service command needs. It never migrates: the
// services connect as the runtime role, which cannot.
func Connect(ctx context.Context, cfg config.Config, log *slog.Logger, maxConns int32, metricsAddr string) (c *Connection, err error) {
	c = &Connection{Telemetry: NewTelemetry()}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	if c.Pool, err = OpenDB(ctx, cfg, maxConns); err != nil {
		return c, err
	}
	c.closers = append(c.closers, c.Pool.Close)
	c.Telemetry.WatchPool(c.Pool, "services")
	stopMetrics, err := ServeMetrics(metricsAddr, c.Telemetry, log)
	if err != nil {
		return c, err
	}
	c.closers = append(c.closers, stopMetrics)
	if c.Temporal, err = DialTemporal(ctx, cfg, log, c.Telemetry); err != nil {
		return c, err
	}
	c.closers = append(c.closers, c.Temporal.Close)
	return c, nil
}

// Close releases in reverse order of opening.
func (c *Connection) Close() {
	for i := len(c.closers) - 1; i >= 0; i-- {
		c.closers[i]()
	}
	c.closers = nil
}
