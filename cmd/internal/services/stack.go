package services

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/client"

	"github.com/claimflow/claimflow/dev/devstack"
	"github.com/claimflow/claimflow/dev/notifysim"
	"github.com/claimflow/claimflow/dev/payoutsim"
	"github.com/claimflow/claimflow/internal/config"
	"github.com/claimflow/claimflow/internal/kafka"
	"github.com/claimflow/claimflow/workflows"
)

// StackOptions says where the local stack keeps its data and listens.
type StackOptions struct {
	DataDir      string
	HTTPAddr     string
	TemporalPort int
	UIPort       int
	KafkaPort    int
	PGPort       int
	// PGBin holds initdb, pg_ctl and postgres (--pg-bin); empty: a system
	// install, else the build downloaded into the user cache.
	PGBin string
	// DatabaseURL, when set, is used instead of a private cluster.
	DatabaseURL string
	// KafkaBrokers, when set, name a real Kafka cluster to use instead of
	// kfake; KafkaReplicas is then the replication factor of new topics.
	KafkaBrokers  []string
	KafkaReplicas int16
	// TemporalCluster runs the Temporal server as deploy/temporal/server.sh
	// does, five processes on the stack's own PostgreSQL with the frontend
	// on TemporalPort, instead of the dev server (the production shape).
	TemporalCluster bool
	// KafkaNodes, when above zero, runs Apache Kafka with that many brokers
	// from KafkaPort (deploy/kafka/kafka.sh) instead of kfake.
	KafkaNodes int
	// MetricsPort, with the cluster shape, is the first worker's /metrics
	// port; the other workers and the consumers follow it.
	MetricsPort int
	// PGSettings are settings of the private PostgreSQL (name=value):
	// DevPGSettings under `claimflow dev`.
	PGSettings []string
	// PGTLS serves the private PostgreSQL over TLS only (--pg-tls).
	PGTLS bool
	// NoMigrate leaves `claimflow migrate` to a process of its own.
	NoMigrate bool
	// Headless skips the Temporal Web UI (tests).
	Headless bool
	// PayoutPort is where the payout simulator listens (0: a free port);
	// PayoutURL, when set, names a real payout API and no simulator starts.
	PayoutPort int
	PayoutURL  string
	// NotifyPort is where the notification webhook simulator listens (0: a
	// free port); NotifyURL, when set, names a real webhook instead.
	NotifyPort int
	NotifyURL  string
	// NoWorker leaves the worker to a separate process (fault tests kill it);
	// NoAPI and NoConsumer do the same for the API and the consumer.
	NoWorker   bool
	NoAPI      bool
	NoConsumer bool
	// InsecureNoAuth serves the API without tokens (--insecure-no-auth).
	InsecureNoAuth bool
	// Progress receives human-readable start-up messages.
	Progress io.Writer
}

// Topics are kafka.AllTopics as the dev stack's kfake creates them.
var Topics = func() []devstack.Topic {
	var out []devstack.Topic
	for _, t := range kafka.AllTopics(1) {
		out = append(out, devstack.Topic{Name: t.Name, Partitions: t.Partitions})
	}
	return out
}()

// TemporalDynamicConfig lets a batch run list every course and student it
// holds in its CourseId/StudentId search attributes (2 KiB per value by
// default); the batcher stays below ClaimBatchAttrBytes.
var TemporalDynamicConfig = map[string]string{
	"frontend.searchAttributesSizeOfValueLimit": "32768",
	"frontend.searchAttributesTotalSizeLimit":   "131072",
	// One partition per task queue: with the default four, a task written
	// to a partition no poller is waiting on waits to be forwarded, which
	// shows as schedule-to-start delay of batch runs under load. A single
	// dev server and a handful of pollers gain nothing from spreading.
	"matching.numTaskqueueReadPartitions":  "1",
	"matching.numTaskqueueWritePartitions": "1",
	// History's default poll rate of its task queues makes every new
	// workflow task wait before it reaches matching, and the bursts that
	// follow overrun the pollers and go through the backlog. A batch run is
	// short-lived; reading more often is what keeps answers fast.
	"history.transferProcessorMaxPollRPS":   "500",
	"history.visibilityProcessorMaxPollRPS": "200",
	"history.timerProcessorMaxPollRPS":      "200",
}

// ClaimBatchAttrBytes is the dev stack's CLAIM_BATCH_ATTR_BYTES, within the limit
// TemporalDynamicConfig raises (against 10,000 and 120,000: docs/performance.md).
const ClaimBatchAttrBytes = 30000

// Stack is the whole system on one machine: Temporal dev server, kfake,
// Postgres, and the API and worker in this process.
type Stack struct {
	Config   config.Config
	Temporal *devstack.TemporalServer // nil with TemporalCluster
	Kafka    *devstack.Kafka          // nil with KafkaBrokers or KafkaNodes
	// TemporalCluster and KafkaCluster run through the deploy/ scripts.
	TemporalCluster *devstack.ScriptCluster
	KafkaCluster    *devstack.ScriptCluster
	Postgres        *devstack.Postgres // nil when DATABASE_URL was given
	Payout          *payoutsim.Server  // nil when VENDOR_PAYOUT_URL was given
	Notify          *notifysim.Server  // nil when NOTIFY_WEBHOOK_URL was given
	Pool            *pgxpool.Pool
	Client          client.Client
	API             *APIService
	Worker          *WorkerService
	Consumer        *ConsumerService
	// Telemetry is served on the API's /metrics.
	Telemetry *Telemetry
	// Options are as started, with an absolute DataDir.
	Options StackOptions
	// Log is the logger the services were started with.
	Log *slog.Logger
}

// StartStack starts every part and returns once the API answers. On error
// it stops what it had started.
func StartStack(ctx context.Context, base config.Config, log *slog.Logger, o StackOptions) (s *Stack, err error) {
	dataDir, err := filepath.Abs(o.DataDir)
	if err != nil {
		return nil, fmt.Errorf("data dir %q: %w", o.DataDir, err)
	}
	if err := os.MkdirAll(filepath.Join(dataDir, "logs"), 0o755); err != nil {
		return nil, fmt.Errorf("create data dir: %w", err)
	}
	progress := o.Progress
	if progress == nil {
		progress = io.Discard
	}
	o.DataDir = dataDir
	s = &Stack{Config: base, Log: log, Options: o}
	defer func() {
		if err != nil {
			stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if stopErr := s.Stop(stopCtx); stopErr != nil {
				log.Warn("stopping a half-started stack", "error", stopErr)
			}
		}
	}()

	if o.DatabaseURL != "" {
		// The user's database: no roles are created there. Migrations
		// run as MIGRATE_DATABASE_URL (else this URL), the services as
		// this URL; grants go to DATABASE_RUNTIME_ROLE (else its user).
		s.Config.DatabaseURL = o.DatabaseURL
		if !base.IsSet("MIGRATE_DATABASE_URL") {
			s.Config.MigrateDatabaseURL = o.DatabaseURL
		}
		if !base.IsSet("DATABASE_RUNTIME_ROLE") {
			s.Config.RuntimeRole = urlUser(o.DatabaseURL)
		}
	} else {
		if s.Config.RuntimeRole == "" {
			s.Config.RuntimeRole = config.DefaultRuntimeRole
		}
		fmt.Fprintln(progress, "starting PostgreSQL...")
		s.Postgres, err = devstack.StartPostgres(ctx, devstack.PostgresOptions{
			DataDir:  filepath.Join(dataDir, "pg"),
			Port:     o.PGPort,
			LogFile:  filepath.Join(dataDir, "logs", "postgres.log"),
			BinDir:   o.PGBin,
			Progress: o.Progress,
			// The services run as the runtime role, as in compose and
			// k8s, so every test on this stack proves its grants suffice.
			OwnerRole:   config.DefaultOwnerRole,
			RuntimeRole: s.Config.RuntimeRole,
			Settings:    o.PGSettings,
			TLS:         o.PGTLS,
		})
		if err != nil {
			return s, err
		}
		s.Config.DatabaseURL = s.Postgres.RoleURL(s.Config.RuntimeRole)
		s.Config.MigrateDatabaseURL = s.Postgres.RoleURL(config.DefaultOwnerRole)
	}
	if o.TemporalCluster {
		if s.Postgres == nil {
			return s, errors.New("the Temporal cluster runs on the stack's own PostgreSQL: unset DATABASE_URL")
		}
		s.TemporalCluster, err = devstack.StartTemporalCluster(ctx, devstack.TemporalClusterOptions{
			Dir:      filepath.Join(dataDir, "temporal-cluster"),
			PGURL:    s.Postgres.URL,
			BasePort: o.TemporalPort,
			LogFile:  filepath.Join(dataDir, "logs", "temporal-cluster.log"),
			Progress: progress,
		})
		if err != nil {
			return s, err
		}
		s.Config.TemporalAddress = s.TemporalCluster.Value
		s.Config.TemporalUIURL = "" // no Web UI runs here: answers carry no workflow_url
	} else {
		bin, err := devstack.TemporalCLI(ctx, progress)
		if err != nil {
			return s, err
		}
		fmt.Fprintln(progress, "starting Temporal dev server...")
		s.Temporal, err = devstack.StartTemporal(ctx, devstack.TemporalOptions{
			Binary:           bin,
			DBFile:           filepath.Join(dataDir, "temporal.db"),
			Port:             o.TemporalPort,
			UIPort:           o.UIPort,
			Namespace:        base.Namespace,
			SearchAttributes: workflows.SearchAttributeTypes,
			DynamicConfig:    TemporalDynamicConfig,
			Headless:         o.Headless,
			LogFile:          filepath.Join(dataDir, "logs", "temporal.log"),
		})
		if err != nil {
			return s, err
		}
		s.Config.TemporalAddress = s.Temporal.Addr
		s.Config.TemporalUIURL = s.Temporal.UIURL
	}
	s.Config.ClaimBatchAttrBytes = ClaimBatchAttrBytes
	// The server is on loopback: compressing its calls only costs CPU.
	s.Config.TemporalCompression = config.TemporalCompressionNone

	if o.KafkaNodes > 0 {
		s.KafkaCluster, err = devstack.StartKafkaCluster(ctx, devstack.KafkaClusterOptions{
			Dir:      filepath.Join(dataDir, "kafka-cluster"),
			Nodes:    o.KafkaNodes,
			BasePort: o.KafkaPort,
			LogFile:  filepath.Join(dataDir, "logs", "kafka-cluster.log"),
			Progress: progress,
		})
		if err != nil {
			return s, err
		}
		o.KafkaBrokers = strings.Split(s.KafkaCluster.Value, ",")
		o.KafkaReplicas = int16(min(o.KafkaNodes, 3))
	}
	if len(o.KafkaBrokers) > 0 {
		s.Config.KafkaBrokers = o.KafkaBrokers
		fmt.Fprintf(progress, "using Kafka at %v...\n", o.KafkaBrokers)
		if err := kafka.EnsureTopics(ctx, s.Config.Kafka("claimflow-dev"), kafka.AllTopics(o.KafkaReplicas)); err != nil {
			return s, err
		}
	} else {
		fmt.Fprintln(progress, "starting Kafka (kfake)...")
		s.Kafka, err = devstack.StartKafka(ctx, devstack.KafkaOptions{
			DataDir: filepath.Join(dataDir, "kafka"),
			Port:    o.KafkaPort,
			Topics:  Topics,
		})
		if err != nil {
			return s, err
		}
		s.Config.KafkaBrokers = s.Kafka.Brokers
		// An in-process broker answers a request in about 0.3 ms: a
		// linger only adds its wait (`burst --rate 20`, 3 pairs: p50 13.0
		// (11.7–14.7) ms without, 15.3 (14.9–15.7) with 1 ms).
		s.Config.KafkaLinger = 0
	}

	// Once per stack, as the owner: the one-shot migration of compose
	// and k8s. Services started (and restarted) below never migrate.
	if !o.NoMigrate {
		if err := Migrate(ctx, s.Config, s.Log); err != nil {
			return s, err
		}
	}
	if o.PayoutURL != "" {
		s.Config.PayoutURL = o.PayoutURL
	} else {
		s.Payout, err = payoutsim.Start(fmt.Sprintf("127.0.0.1:%d", o.PayoutPort))
		if err != nil {
			return s, err
		}
		s.Config.PayoutURL = s.Payout.PayoutsURL()
		fmt.Fprintf(progress, "payout simulator at %s (switch it: PUT %s/admin/mode)\n", s.Config.PayoutURL, s.Payout.URL)
	}
	if o.NotifyURL != "" {
		s.Config.NotifyWebhookURL = o.NotifyURL
	} else {
		s.Notify, err = notifysim.Start(fmt.Sprintf("127.0.0.1:%d", o.NotifyPort))
		if err != nil {
			return s, err
		}
		s.Config.NotifyWebhookURL = s.Notify.WebhookURL()
		fmt.Fprintf(progress, "notification webhook simulator at %s (switch it: PUT %s/admin/mode)\n", s.Config.NotifyWebhookURL, s.Notify.URL)
	}
	s.Config.HTTPAddr = o.HTTPAddr
	s.Config.Security.InsecureNoAuth = s.Config.Security.InsecureNoAuth || o.InsecureNoAuth
	if err := config.EnsureStackSecret(&s.Config.Security, dataDir); err != nil {
		return s, err
	}
	if err := config.EnsureStackEventKey(&s.Config, dataDir); err != nil {
		return s, err
	}

	if err := s.StartServices(ctx); err != nil {
		return s, err
	}
	return s, nil
}

// StartServices connects to the infrastructure and starts worker, consumer
// and API, those that s.Options do not leave to other processes.
func (s *Stack) StartServices(ctx context.Context) (err error) {
	s.Pool, err = OpenDB(ctx, s.Config, 64)
	if err != nil {
		return err
	}
	// A fresh registry per start: services restarted in this process
	// register their metrics again.
	s.Telemetry = NewTelemetry()
	s.Telemetry.WatchPool(s.Pool, "services")
	s.Client, err = DialTemporal(ctx, s.Config, s.Log, s.Telemetry)
	if err != nil {
		return err
	}
	if !s.Options.NoWorker {
		s.Worker, err = StartWorker(s.Config, s.Log, s.Pool, s.Client, s.Telemetry)
		if err != nil {
			return err
		}
	}
	if !s.Options.NoConsumer {
		s.Consumer, err = StartConsumer(s.Config, s.Log, s.Pool, s.Client, s.Telemetry)
		if err != nil {
			return err
		}
	}
	if !s.Options.NoAPI {
		s.API, err = StartAPI(s.Config, s.Log, s.Pool, s.Client, s.Telemetry)
	}
	return err
}

// StopServices stops API, consumer and worker, letting in-flight work
// finish; the infrastructure keeps running.
func (s *Stack) StopServices(ctx context.Context) error {
	var errs []error
	if s.API != nil {
		errs = append(errs, s.API.Stop(ctx))
		s.API = nil
	}
	// Before the worker: the consumer's last batches may still hand events
	// to DeliverEvent runs.
	if s.Consumer != nil {
		errs = append(errs, s.Consumer.Stop())
		s.Consumer = nil
	}
	if s.Worker != nil {
		errs = append(errs, s.Worker.Stop())
		s.Worker = nil
	}
	if s.Client != nil {
		s.Client.Close()
		s.Client = nil
	}
	if s.Pool != nil {
		s.Pool.Close()
		s.Pool = nil
	}
	return errors.Join(errs...)
}

// Stop shuts everything down, services first so that no work is cut off by
// its infrastructure disappearing.
func (s *Stack) Stop(ctx context.Context) error {
	errs := []error{s.StopServices(ctx)}
	if s.Temporal != nil {
		errs = append(errs, s.Temporal.Stop(ctx))
		s.Temporal = nil
	}
	if s.TemporalCluster != nil {
		errs = append(errs, s.TemporalCluster.Stop(ctx))
		s.TemporalCluster = nil
	}
	if s.Kafka != nil {
		s.Kafka.Close()
		s.Kafka = nil
	}
	if s.KafkaCluster != nil {
		errs = append(errs, s.KafkaCluster.Stop(ctx))
		s.KafkaCluster = nil
	}
	if s.Postgres != nil {
		errs = append(errs, s.Postgres.Stop(ctx))
		s.Postgres = nil
	}
	if s.Payout != nil {
		errs = append(errs, s.Payout.Close(ctx))
		s.Payout = nil
	}
	if s.Notify != nil {
		errs = append(errs, s.Notify.Close(ctx))
		s.Notify = nil
	}
	return errors.Join(errs...)
}

// ReadyLine is what `claimflow dev` prints once everything answers.
func (s *Stack) ReadyLine() string {
	ui := s.Config.TemporalUIURL
	if ui == "" {
		ui = "(headless)"
	}
	api := "(none: run 'claimflow api')"
	if s.API != nil {
		api = "http://" + s.API.Addr
	}
	return fmt.Sprintf("claimflow ready: api=%s ui=%s temporal=%s kafka=%s database=%s",
		api, ui, s.Config.TemporalAddress, strings.Join(s.Config.KafkaBrokers, ","), config.RedactURL(s.Config.DatabaseURL))
}

// urlUser is the user a postgres:// URL names ("" for none, or for the
// key=value form).
func urlUser(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return u.User.Username()
}

// ChooseServices sets which services run in the dev process from a list
// of api, worker and consumer, or "none".
func (o *StackOptions) ChooseServices(list string) error {
	o.NoAPI, o.NoWorker, o.NoConsumer = true, true, true
	if list == "none" {
		return nil
	}
	for name := range strings.SplitSeq(list, ",") {
		switch strings.TrimSpace(name) {
		case "api":
			o.NoAPI = false
		case "worker":
			o.NoWorker = false
		case "consumer":
			o.NoConsumer = false
		default:
			return fmt.Errorf("--services: unknown service %q (want a list of api, worker, consumer, or none)", name)
		}
	}
	return nil
}

// DevPGSettings are the private PostgreSQL's settings under `claimflow dev`.
// The user's 4-minute scenario leaves 470 MB of enrollment indexes and
// writes about 9 MB of WAL a second. With PostgreSQL's defaults (128 MB of
// shared buffers, a checkpoint per 1 GB of WAL) the minutely autovacuum of
// enrollments read those indexes from outside the buffers, taking longer
// as they grew, and checkpoints fell in the run; with these it does
// neither (docs/performance.md#the-full-scenario). The log
// (<data-dir>/logs/postgres.log) names each autovacuum and autoanalyze
// with its CPU and time, which is how the p95's minutely bumps were tied to
// them.
var DevPGSettings = []string{"shared_buffers=1GB", "max_wal_size=4GB", "log_autovacuum_min_duration=0"}
