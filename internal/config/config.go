// Package config is claimflow's configuration: every environment variable
// the binaries read, its default and its check, in one place. Defaults fit
// the local stack, so `claimflow api` and `claimflow worker` run with no
// setup against `claimflow dev`'s services.
package config

import (
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/claimflow/claimflow/internal/kafka"
	"github.com/claimflow/claimflow/internal/tlsfiles"
)

// Defaults that other packages fall back to when a caller leaves an option
// zero; they are the environment's defaults too, so a test that builds an
// option struct by hand runs what production runs.
const (
	// TemporalCompressionGzip and TemporalCompressionNone are the values of
	// TEMPORAL_GRPC_COMPRESSION.
	TemporalCompressionGzip = "gzip"
	TemporalCompressionNone = "none"
	// DefaultKafkaLinger is KAFKA_LINGER's default. Without a wait, sarama
	// sends a batch's first events alone and the rest behind them, one
	// request in flight a broker (the idempotent producer's rule): on three
	// Apache Kafka brokers at RF 3, 42 events took 16 requests (p50 8.3
	// ms), with 1 ms of linger 3 (4.0 ms). The production shape's figures
	// with and without it: docs/performance.md#the-production-shape.
	DefaultKafkaLinger = "1ms"
	// DefaultClaimBatchMax bounds the claims of one batch.
	DefaultClaimBatchMax = 500
	// DefaultClaimDesks is how many desk runs an API process sends
	// batches to, one batch on each at a time: the batches it has under
	// way at once. One: at 2,000 claims/s on two cores a second desk made
	// batches a third smaller and every answer slower (p50 35–41 ms
	// against 28–31 ms, three runs each; docs/performance.md); a larger
	// Temporal cluster may differ.
	DefaultClaimDesks = 1
	// DefaultClaimDeskBatches is how many batches a desk run decides before
	// it continues as new: well below the 2,000 updates the Temporal server
	// lets one run take (history.maxTotalUpdates).
	DefaultClaimDeskBatches = 500
	// DefaultClaimBatchAttrBytes keeps a batch's CourseId/StudentId search
	// attribute values below the server's default per-value limit
	// (frontend.searchAttributesSizeOfValueLimit, 2 KiB).
	DefaultClaimBatchAttrBytes = 2000
	// MinClaimBatchAttrBytes lists one ID of the longest kind the API takes
	// (64 characters, quoted, with a comma), so that a desk's fresh run
	// takes any batch of one claim.
	MinClaimBatchAttrBytes = 67
	// DefaultRecoveryAfter is the age of a reservation after which no
	// desk holds it: a desk finishes a batch in one workflow task, bounded
	// by its local activities' timeouts (25 s), so a reservation older than
	// this is stranded (workflows.RecoverReservations).
	DefaultRecoveryAfter = time.Minute
	// DefaultRecoveryEvery is how often the recovery schedule runs: the
	// longest a stranded reservation waits for it, beyond DefaultRecoveryAfter.
	DefaultRecoveryEvery = 15 * time.Second
	// minRecoveryAfter keeps the recovery off the reservations a live desk
	// still holds: its workflow task's bound (a claim's DecisionDeadline,
	// 25 s) with a margin.
	minRecoveryAfter = 30 * time.Second
	// DefaultWaitlistPerSeat bounds a course's waitlist at this many places
	// per seat of capacity.
	DefaultWaitlistPerSeat = 2
	// DefaultConsumerBatch is large enough that a batch's round trips (one
	// commit, one offset commit) are shared by many records, small enough
	// that a batch lost to a crash is redone quickly.
	DefaultConsumerBatch = 500
	// DefaultMaxInflightClaims is above what group commit holds at once
	// (CLAIM_DESKS × CLAIM_BATCH_MAX plus the next batch forming),
	// so the bound sheds a true overload rather than a healthy burst.
	DefaultMaxInflightClaims = 8192
	defaultRatePerSubject    = 50
	defaultRateBurst         = 100
	defaultReadRate          = 50
	defaultReadBurst         = 100
	// DefaultConfirmWaiters bounds the ?wait=confirmed requests one API
	// process holds at once; each costs a goroutine and a channel, not a
	// database connection.
	DefaultConfirmWaiters = 1024
	// DefaultRequestTimeout bounds a request's own database and Temporal
	// calls; a route that waits for a claim's decision gets that wait on
	// top (api.Config.RequestTimeout).
	DefaultRequestTimeout = "5s"
	// DefaultRoleClaim is the claim a token's role is read from.
	DefaultRoleClaim = "role"
)

// The two database roles (docs/security.md#database-roles): the owner
// creates and alters the schema (`claimflow migrate`), the runtime role is
// what api, worker and consumer connect as, with only the DML they need.
// These are the names the dev stack and deploy/postgres/init.sh create.
const (
	DefaultOwnerRole   = "claimflow_owner"
	DefaultRuntimeRole = "claimflow_app"
)

// variable is one environment variable: its name, the default used when it
// is unset or empty, and what it means (for `claimflow help`).
type variable struct {
	Name, Default, Help string
}

// variables is every environment variable claimflow reads. Load asks for
// no other name (it panics on one not listed), so this list is complete.
// NoUI as TEMPORAL_UI_URL says there is no Web UI to link to (the
// production-shaped stack of `claimflow dev --shape cluster`).
const NoUI = "none"

var variables = []variable{
	{"DATABASE_URL", "postgres://" + DefaultRuntimeRole + "@127.0.0.1:55432/claimflow?sslmode=disable", "PostgreSQL URL of the runtime role the services connect as"},
	{"MIGRATE_DATABASE_URL", "postgres://" + DefaultOwnerRole + "@127.0.0.1:55432/claimflow?sslmode=disable", "PostgreSQL URL of the schema owner `claimflow migrate` connects as (unset while DATABASE_URL is set: DATABASE_URL)"},
	{"DATABASE_RUNTIME_ROLE", "", "role `claimflow migrate` grants the services' DML to (unset: DATABASE_URL's user)"},
	{"TEMPORAL_ADDRESS", "127.0.0.1:7233", "Temporal frontend host:port"},
	{"TEMPORAL_NAMESPACE", "default", "Temporal namespace"},
	{"TEMPORAL_UI_URL", "http://127.0.0.1:8233", "Temporal Web UI, linked from API answers (" + NoUI + ": no links)"},
	{"TEMPORAL_CLI", "", "temporal binary the dev stack runs (read by dev/devstack)"},
	{"TEMPORAL_GRPC_COMPRESSION", TemporalCompressionGzip, "gzip or none: compression of the services' calls to Temporal (claimflow dev, on loopback, uses none)"},
	{"TEMPORAL_TLS", "", "true or false: TLS to Temporal (unset: on when any TEMPORAL_TLS_* path, the server name or TEMPORAL_API_KEY is set)"},
	{"TEMPORAL_TLS_SERVER_CA_CERT_PATH", "", "PEM file of the CA that signs Temporal's certificate (unset: the system's roots)"},
	{"TEMPORAL_TLS_CLIENT_CERT_PATH", "", "PEM client certificate for mTLS to Temporal; re-read when the file changes"},
	{"TEMPORAL_TLS_CLIENT_KEY_PATH", "", "PEM key of TEMPORAL_TLS_CLIENT_CERT_PATH; re-read when the file changes"},
	{"TEMPORAL_TLS_SERVER_NAME", "", "name Temporal's certificate must carry (unset: TEMPORAL_ADDRESS's host)"},
	{"TEMPORAL_API_KEY", "", "API key for Temporal Cloud (needs TLS)"},
	{"KAFKA_BROKERS", "127.0.0.1:9092", "comma-separated Kafka bootstrap brokers"},
	{"KAFKA_VERSION", "", "Kafka protocol version (empty: the client's default)"},
	{"KAFKA_LINGER", DefaultKafkaLinger, "how long the producer holds a batch's first event so that the rest go in the same produce request (0 to " + maxKafkaLinger.String() + "; claimflow dev, on its in-process broker, uses 0)"},
	{"KAFKA_TLS", "", "true or false: TLS to Kafka (unset: on when any KAFKA_TLS_* path or the server name is set)"},
	{"KAFKA_TLS_CA_PATH", "", "PEM file of the CA that signs the brokers' certificates (unset: the system's roots)"},
	{"KAFKA_TLS_CERT_PATH", "", "PEM client certificate for mTLS to Kafka; re-read when the file changes"},
	{"KAFKA_TLS_KEY_PATH", "", "PEM key of KAFKA_TLS_CERT_PATH; re-read when the file changes"},
	{"KAFKA_TLS_SERVER_NAME", "", "name the brokers' certificates must carry (unset: each broker's host)"},
	{"KAFKA_SASL_MECHANISM", "", "PLAIN (needs KAFKA_TLS), SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER (unset: no SASL)"},
	{"KAFKA_SASL_USERNAME", "", "SASL user (PLAIN, SCRAM-*)"},
	{"KAFKA_SASL_PASSWORD", "", "SASL password (PLAIN, SCRAM-*)"},
	{"KAFKA_SASL_OAUTHBEARER_TOKEN_PATH", "", "file holding the current OAUTHBEARER token, read at every authentication"},
	{"HTTP_ADDR", "127.0.0.1:8080", "API listen address"},
	{"INTERNAL_HTTP_ADDR", "", "address of /metrics, /healthz, the detailed /readyz and /debug/pprof/ (empty: all but the profiles on HTTP_ADDR)"},
	{"REQUEST_TIMEOUT", DefaultRequestTimeout, "bound of a request's own work; routes waiting for a decision get that wait on top"},
	{"METRICS_ADDR", "127.0.0.1:9464", "/metrics of processes without an API"},
	{"LOG_LEVEL", "info", "debug, info, warn or error"},
	{"LOG_FORMAT", "json", "json or text"},
	{"WORKER_MAX_ACTIVITIES", "200", "concurrent activities per worker process"},
	{"SHUTDOWN_TIMEOUT", "25s", "graceful shutdown bound after SIGTERM"},
	{"AUTH_MODE", AuthHS256, "hs256, jwks or off (off needs --insecure-no-auth)"},
	{"JWT_SECRET", "", "HS256 secret, at least 32 bytes"},
	{"JWKS_URL", "", "RS256 key set (AUTH_MODE=jwks)"},
	{"JWT_ISSUER", "", "required iss claim (empty: not checked; AUTH_MODE=jwks requires it)"},
	{"JWT_AUDIENCE", "", "required aud claim (empty: not checked; AUTH_MODE=jwks requires it)"},
	{"JWT_ROLE_CLAIM", DefaultRoleClaim, "claim holding the role of an RS256 token (AUTH_MODE=jwks)"},
	{"RATE_LIMIT_PER_SUBJECT", strconv.Itoa(defaultRatePerSubject), "writes per second of a non-admin subject (0: unlimited)"},
	{"RATE_LIMIT_BURST", strconv.Itoa(defaultRateBurst), "burst of a non-admin subject's writes"},
	{"RATE_LIMIT_ADMIN", "0", "writes per second of an admin (0: unlimited)"},
	{"READ_RATE_LIMIT_PER_SUBJECT", strconv.Itoa(defaultReadRate), "reads per second of a non-admin subject (0: unlimited)"},
	{"READ_RATE_LIMIT_BURST", strconv.Itoa(defaultReadBurst), "burst of a non-admin subject's reads"},
	{"MAX_CONFIRM_WAITERS", strconv.Itoa(DefaultConfirmWaiters), "?wait=confirmed requests held at once per API process (beyond: 202 at once)"},
	{"MAX_INFLIGHT_CLAIMS", strconv.Itoa(DefaultMaxInflightClaims), "requests waiting on Temporal at once"},
	{"VENDOR_PAYOUT_URL", "http://127.0.0.1:8090/payouts", "vendors' payout API"},
	{"PAYOUT_TIMEOUT", "5s", "bound of one payout call (at most 15s)"},
	{"OTEL_EXPORTER_OTLP_ENDPOINT", "", "OTLP collector to send traces to (unset, with OTEL_TRACES_EXPORTER unset: no tracing, at no cost); read by the OpenTelemetry SDK"},
	{"OTEL_SERVICE_NAME", "", "service name on the traces (unset: claimflow-<command>)"},
	{"OTEL_TRACES_SAMPLER", "", "OpenTelemetry sampler, e.g. parentbased_traceidratio (unset: parentbased_always_on)"},
	{"OTEL_TRACES_SAMPLER_ARG", "", "the sampler's argument, e.g. 0.01"},
	{"OTEL_TRACES_EXPORTER", "", "otlp, console or none (unset: otlp when an endpoint is set)"},
	{"EVENT_SIGNING_KEY", "", "key (at least 32 bytes) workers sign events with and consumers verify them with; required by both"},
	{"CONSUMER_TOPICS", strings.Join(kafka.EventTopicNames(), ","), "topics the consumer reads"},
	{"CONSUMER_GROUP", "claimflow-notifications", "the consumer's group"},
	{"CONSUMER_BATCH", strconv.Itoa(DefaultConsumerBatch), "records the consumer applies together (1-10000)"},
	{"NOTIFY_WEBHOOK_URL", "", "webhook receiving every notification (empty: the table alone)"},
	{"CLAIM_BATCH_MAX", strconv.Itoa(DefaultClaimBatchMax), "claims of one batch"},
	{"CLAIM_BATCH_ATTR_BYTES", strconv.Itoa(DefaultClaimBatchAttrBytes), "bound of a batch's, and a desk run's, search attribute values"},
	{"CLAIM_DESKS", strconv.Itoa(DefaultClaimDesks), "desk runs an API process sends batches to, one at a time on each"},
	{"CLAIM_DESK_BATCHES", strconv.Itoa(DefaultClaimDeskBatches), "batches a desk run decides before it continues as new (at most 1500)"},
	{"WAITLIST_PER_SEAT", strconv.Itoa(DefaultWaitlistPerSeat), "waitlist places per seat of a course's capacity (0: no waitlist)"},
	{"RECOVERY_AFTER", DefaultRecoveryAfter.String(), "a desk's reservation still reserved this long after it was recorded has no live desk: the recovery finishes it (at least 30s)"},
	{"RECOVERY_EVERY", DefaultRecoveryEvery.String(), "how often the worker's schedule looks for such reservations"},
	{"MAX_INFLIGHT_CLAIMS_PER_SUBJECT", strconv.Itoa(DefaultMaxInflightPerSubject), "claims of one non-admin subject waiting on Temporal at once (0: unlimited)"},
	{"JWT_MAX_TTL", DefaultJWTMaxTTL.String(), "longest token lifetime (exp - iat) the API accepts and claimflow token mints"},
	{"JWT_ROLE_MAP", "", "token roles renamed to admin, vendor or student, e.g. registrar=admin,Admin=admin (other roles: 403)"},
}

// RecoveryBound is the longest a reservation may have no run to finish it:
// RECOVERY_AFTER for it to count as stranded, then up to two periods of the
// recovery's schedule (one to come round, one for the run it starts).
func (c Config) RecoveryBound() time.Duration { return c.RecoveryAfter + 2*c.RecoveryEvery }

// Names lists every environment variable claimflow reads, for usage texts
// and for the deployment tests that check compose and k8s set only these.
func Names() []string {
	out := make([]string, len(variables))
	for i, v := range variables {
		out[i] = v.Name
	}
	return out
}

// Usage describes every variable with its default, one per line.
func Usage() string {
	var b strings.Builder
	for _, v := range variables {
		def := v.Default
		if def == "" {
			def = "unset"
		}
		fmt.Fprintf(&b, "  %-24s %s (default: %s)\n", v.Name, v.Help, def)
	}
	return b.String()
}

// Config is read from the environment by Load.
type Config struct {
	// DatabaseURL is the runtime role's: api, worker, consumer and audit
	// connect with it and never change the schema.
	DatabaseURL string
	// MigrateDatabaseURL is the schema owner's, for `claimflow migrate`
	// and the dev stack's migration.
	MigrateDatabaseURL string
	// RuntimeRole is the role `claimflow migrate` grants the services' DML to.
	RuntimeRole string

	TemporalAddress string
	Namespace       string
	TemporalUIURL   string
	// TemporalCompression is gzip or none (TEMPORAL_GRPC_COMPRESSION).
	TemporalCompression string
	// TemporalTLS and TemporalAPIKey secure the connection to Temporal
	// (connections.go).
	TemporalTLS    tlsfiles.Files
	TemporalAPIKey string
	KafkaBrokers   []string
	KafkaVersion   string
	// KafkaLinger is the producer's wait to fill a request (KAFKA_LINGER).
	KafkaLinger time.Duration
	// KafkaTLS and KafkaSASL secure the connections to Kafka.
	KafkaTLS  tlsfiles.Files
	KafkaSASL kafka.SASL
	HTTPAddr  string
	// InternalHTTPAddr, when set, serves /metrics, /healthz and the
	// detailed /readyz apart from the public HTTPAddr.
	InternalHTTPAddr string
	// RequestTimeout bounds a request's own database and Temporal calls.
	RequestTimeout time.Duration
	LogLevel       slog.Level
	// MaxActivities bounds concurrent activities per worker process.
	MaxActivities int
	// ShutdownTimeout bounds graceful shutdown after SIGTERM.
	ShutdownTimeout time.Duration
	// RecoveryAfter and RecoveryEvery are the reservation recovery's age
	// bound and period (RECOVERY_AFTER, RECOVERY_EVERY).
	RecoveryAfter, RecoveryEvery time.Duration
	// MetricsAddr serves /metrics for processes without an API (worker).
	MetricsAddr string
	// LogFormat is json (production) or text (a terminal).
	LogFormat string
	// Security is authentication and load limits of the API (security.go).
	Security Security
	// PayoutURL is the vendors' payout API; PayoutTimeout bounds one call.
	PayoutURL     string
	PayoutTimeout time.Duration
	// ConsumerTopics and ConsumerGroup are what `claimflow consumer` reads
	// and as whom; ConsumerBatch bounds the records applied together.
	ConsumerTopics []string
	ConsumerGroup  string
	ConsumerBatch  int
	// EventSigningKey signs the events the workers publish and verifies
	// them in the consumer (events.go).
	EventSigningKey string
	// NotifyWebhookURL, when set, receives every notification before it is
	// recorded (consumer and worker both); empty means the table alone.
	NotifyWebhookURL string
	// ClaimDesks is how many desk runs the API sends batches to, and
	// ClaimDeskBatches how many batches one run decides before it
	// continues as new.
	ClaimDesks       int
	ClaimDeskBatches int
	// ClaimBatchMax bounds the claims of one batch.
	ClaimBatchMax int
	// ClaimBatchAttrBytes bounds a batch's CourseId/StudentId search
	// attribute values; it must not exceed the server's
	// frontend.searchAttributesSizeOfValueLimit.
	ClaimBatchAttrBytes int
	// WaitlistPerSeat bounds each course's waitlist (places per seat).
	WaitlistPerSeat int

	// set records the variables given a non-empty value.
	set map[string]bool
}

// IsSet reports whether the environment gave name a value, as opposed to
// its default: the dev stack runs its own PostgreSQL unless DATABASE_URL
// names one.
func (c Config) IsSet(name string) bool { return c.set[name] }

// Load reads the environment.
func Load() (Config, error) { return load(os.LookupEnv) }

// env reads variables through lookup, falling back to their defaults.
type env struct {
	lookup func(string) (string, bool)
	set    map[string]bool
}

func (e env) get(name string) string {
	for _, v := range variables {
		if v.Name != name {
			continue
		}
		if s, ok := e.lookup(name); ok && s != "" {
			e.set[name] = true
			return s
		}
		return v.Default
	}
	panic("config: " + name + " is not in the variables list")
}

// raw is the variable as given, for error messages.
func (e env) raw(name string) string { s, _ := e.lookup(name); return s }

func (e env) positive(name string) (int, error) {
	n, err := strconv.Atoi(e.get(name))
	if err != nil || n < 1 {
		return 0, fmt.Errorf("%s must be a positive integer, got %q", name, e.raw(name))
	}
	return n, nil
}

func load(lookup func(string) (string, bool)) (Config, error) {
	e := env{lookup: lookup, set: map[string]bool{}}
	c := Config{
		DatabaseURL:         e.get("DATABASE_URL"),
		TemporalAddress:     e.get("TEMPORAL_ADDRESS"),
		Namespace:           e.get("TEMPORAL_NAMESPACE"),
		TemporalUIURL:       e.get("TEMPORAL_UI_URL"),
		TemporalCompression: e.get("TEMPORAL_GRPC_COMPRESSION"),
		KafkaBrokers:        strings.Split(e.get("KAFKA_BROKERS"), ","),
		KafkaVersion:        e.get("KAFKA_VERSION"),
		HTTPAddr:            e.get("HTTP_ADDR"),
		InternalHTTPAddr:    e.get("INTERNAL_HTTP_ADDR"),
		MetricsAddr:         e.get("METRICS_ADDR"),
		LogFormat:           e.get("LOG_FORMAT"),
		set:                 e.set,
	}
	if c.TemporalUIURL == NoUI {
		c.TemporalUIURL = ""
	}
	_ = e.get("TEMPORAL_CLI") // read by dev/devstack; listed here so deployments may set it
	// Read by the OpenTelemetry SDK (internal/tracing); listed here so
	// deployments may set them.
	for _, name := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_SERVICE_NAME", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG", "OTEL_TRACES_EXPORTER"} {
		_ = e.get(name)
	}
	if err := loadDatabase(e, &c); err != nil {
		return c, err
	}
	if err := loadConnections(e, &c); err != nil {
		return c, err
	}
	if err := loadEvents(e, &c); err != nil {
		return c, err
	}
	if c.TemporalCompression != TemporalCompressionGzip && c.TemporalCompression != TemporalCompressionNone {
		return c, fmt.Errorf("TEMPORAL_GRPC_COMPRESSION must be gzip or none, got %q", c.TemporalCompression)
	}
	if c.LogFormat != "json" && c.LogFormat != "text" {
		return c, fmt.Errorf("LOG_FORMAT must be json or text, got %q", c.LogFormat)
	}
	if err := c.LogLevel.UnmarshalText([]byte(e.get("LOG_LEVEL"))); err != nil {
		return c, fmt.Errorf("LOG_LEVEL: %w", err)
	}
	var err error
	if c.MaxActivities, err = e.positive("WORKER_MAX_ACTIVITIES"); err != nil {
		return c, err
	}
	if c.ClaimDesks, err = e.positive("CLAIM_DESKS"); err != nil {
		return c, err
	}
	if c.ClaimDeskBatches, err = e.positive("CLAIM_DESK_BATCHES"); err != nil {
		return c, err
	}
	if c.ClaimDeskBatches > 1500 {
		return c, fmt.Errorf("CLAIM_DESK_BATCHES must be at most 1500 (the server takes 2,000 updates a run), got %d", c.ClaimDeskBatches)
	}
	if c.ClaimBatchMax, err = e.positive("CLAIM_BATCH_MAX"); err != nil {
		return c, err
	}
	if c.ClaimBatchAttrBytes, err = e.positive("CLAIM_BATCH_ATTR_BYTES"); err != nil {
		return c, err
	}
	if c.ClaimBatchAttrBytes < MinClaimBatchAttrBytes {
		return c, fmt.Errorf("CLAIM_BATCH_ATTR_BYTES must be at least %d (one ID of 64 characters, listed), got %d",
			MinClaimBatchAttrBytes, c.ClaimBatchAttrBytes)
	}
	if c.WaitlistPerSeat, err = strconv.Atoi(e.get("WAITLIST_PER_SEAT")); err != nil || c.WaitlistPerSeat < 0 || c.WaitlistPerSeat > 1000 {
		return c, fmt.Errorf("WAITLIST_PER_SEAT must be a whole number from 0 to 1000, got %q", e.raw("WAITLIST_PER_SEAT"))
	}
	c.RecoveryAfter, err = time.ParseDuration(e.get("RECOVERY_AFTER"))
	if err != nil || c.RecoveryAfter < minRecoveryAfter {
		return c, fmt.Errorf("RECOVERY_AFTER must be a duration of at least %s, got %q", minRecoveryAfter, e.raw("RECOVERY_AFTER"))
	}
	c.RecoveryEvery, err = time.ParseDuration(e.get("RECOVERY_EVERY"))
	if err != nil || c.RecoveryEvery < time.Second {
		return c, fmt.Errorf("RECOVERY_EVERY must be a duration of at least 1s, got %q", e.raw("RECOVERY_EVERY"))
	}
	c.ShutdownTimeout, err = time.ParseDuration(e.get("SHUTDOWN_TIMEOUT"))
	if err != nil {
		return c, fmt.Errorf("SHUTDOWN_TIMEOUT: %w", err)
	}
	c.RequestTimeout, err = time.ParseDuration(e.get("REQUEST_TIMEOUT"))
	if err != nil || c.RequestTimeout < 100*time.Millisecond || c.RequestTimeout > time.Minute {
		return c, fmt.Errorf("REQUEST_TIMEOUT must be a duration from 100ms to 1m, got %q", e.raw("REQUEST_TIMEOUT"))
	}
	c.PayoutURL = e.get("VENDOR_PAYOUT_URL")
	c.PayoutTimeout, err = time.ParseDuration(e.get("PAYOUT_TIMEOUT"))
	if err != nil || c.PayoutTimeout <= 0 || c.PayoutTimeout > 15*time.Second {
		// The payout activity's own deadline is 20 s: a longer client
		// timeout would turn a slow answer into a lost one.
		return c, fmt.Errorf("PAYOUT_TIMEOUT must be a duration above 0 and at most 15s, got %q", e.raw("PAYOUT_TIMEOUT"))
	}
	c.ConsumerTopics = SplitList(e.get("CONSUMER_TOPICS"))
	c.ConsumerGroup = e.get("CONSUMER_GROUP")
	c.ConsumerBatch, err = strconv.Atoi(e.get("CONSUMER_BATCH"))
	if err != nil || c.ConsumerBatch < 1 || c.ConsumerBatch > 10000 {
		return c, fmt.Errorf("CONSUMER_BATCH must be an integer from 1 to 10000, got %q", e.raw("CONSUMER_BATCH"))
	}
	// No default webhook: an unset URL must not make every notification fail.
	c.NotifyWebhookURL = e.get("NOTIFY_WEBHOOK_URL")
	if err := loadSecurity(e, &c.Security); err != nil {
		return c, err
	}
	return c, nil
}

// roleName is what DATABASE_RUNTIME_ROLE accepts: a plain PostgreSQL
// identifier, so the role named in grants is the one the operator meant.
var roleName = regexp.MustCompile(`^[a-z_][a-z0-9_$]{0,62}$`)

// loadDatabase reads the two database URLs and the runtime role. An
// operator who sets DATABASE_URL alone (one role for everything) migrates
// with it too; the runtime role defaults to DATABASE_URL's user.
func loadDatabase(e env, c *Config) error {
	c.MigrateDatabaseURL = e.get("MIGRATE_DATABASE_URL")
	if !e.set["MIGRATE_DATABASE_URL"] && e.set["DATABASE_URL"] {
		c.MigrateDatabaseURL = c.DatabaseURL
	}
	c.RuntimeRole = e.get("DATABASE_RUNTIME_ROLE")
	if c.RuntimeRole == "" {
		// A URL without a user, or in key=value form, leaves it empty:
		// `claimflow migrate` then asks for DATABASE_RUNTIME_ROLE.
		if u, err := url.Parse(c.DatabaseURL); err == nil {
			c.RuntimeRole = u.User.Username()
		}
		return nil
	}
	if !roleName.MatchString(c.RuntimeRole) {
		return fmt.Errorf("DATABASE_RUNTIME_ROLE must be a lower-case PostgreSQL identifier, got %q", c.RuntimeRole)
	}
	return nil
}

// SplitList splits a comma-separated list, dropping blanks.
func SplitList(s string) []string {
	var out []string
	for x := range strings.SplitSeq(s, ",") {
		if x = strings.TrimSpace(x); x != "" {
			out = append(out, x)
		}
	}
	return out
}
