package services

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/claimflow/claimflow/dev/devstack"
	"github.com/claimflow/claimflow/internal/config"
)

// ClusterPorts are the production shape's defaults, clear of `claimflow
// dev`'s (a test in cmd/claimflow ties them): the Temporal frontend
// (its other nodes follow, deploy/temporal/server.sh), the first Kafka
// broker (deploy/kafka/kafka.sh), PostgreSQL, the first API (the second is
// one above), the workers' and the consumer's /metrics, and the simulators.
var ClusterPorts = struct {
	Temporal, Kafka, PG, API, Metrics, Payout, Notify int
}{17233, 19092, 15532, 18080, 18190, 18090, 18091}

// ClusterPort is one port the production shape binds, and the `claimflow
// dev` flag that moves it.
type ClusterPort struct {
	Port       int
	What, Flag string
}

// ClusterPortList is every port the production shape binds with o and r,
// with the ports each script derives from its base (deploy/temporal/
// server.sh: base+0..4 gRPC, +10 HTTP, +100..104 membership, +200..204
// metrics; deploy/kafka/kafka.sh: base+N clients, base+100+N controllers).
func ClusterPortList(o StackOptions, r Replicas) ([]ClusterPort, error) {
	_, p, err := net.SplitHostPort(o.HTTPAddr)
	if err != nil {
		return nil, fmt.Errorf("--http-addr %q: %w", o.HTTPAddr, err)
	}
	api, err := strconv.Atoi(p)
	if err != nil {
		return nil, fmt.Errorf("--http-addr %q: %w", o.HTTPAddr, err)
	}
	ports := []ClusterPort{{o.PGPort, "postgres", "--pg-port"}, {o.PayoutPort, "payoutsim", "--payout-port"},
		{o.NotifyPort, "notifysim", "--notify-port"}, {o.TemporalPort + 10, "temporal HTTP", "--temporal-port"}}
	for i := range 5 {
		ports = append(ports, ClusterPort{o.TemporalPort + i, "temporal gRPC", "--temporal-port"},
			ClusterPort{o.TemporalPort + 100 + i, "temporal membership", "--temporal-port"},
			ClusterPort{o.TemporalPort + 200 + i, "temporal metrics", "--temporal-port"})
	}
	for i := range ClusterKafka {
		ports = append(ports, ClusterPort{o.KafkaPort + i, "kafka", "--kafka-port"},
			ClusterPort{o.KafkaPort + 100 + i, "kafka controller", "--kafka-port"})
	}
	for i := range r.APIs {
		ports = append(ports, ClusterPort{api + i, "api", "--http-addr"})
	}
	for i := range r.Workers + ClusterConsumers {
		ports = append(ports, ClusterPort{o.MetricsPort + i, "worker and consumer metrics", "--metrics-port"})
	}
	return ports, nil
}

// checkPortsFree refuses, in one error, the ports someone else listens on:
// found halfway through the start, one would stop it with half a cluster
// up.
func checkPortsFree(ports []ClusterPort) error {
	var busy []string
	for _, p := range ports {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p.Port))
		if err != nil {
			busy = append(busy, fmt.Sprintf("%d (%s; move it with %s)", p.Port, p.What, p.Flag))
			continue
		}
		_ = l.Close()
	}
	if len(busy) > 0 {
		return fmt.Errorf("ports already in use: %s", strings.Join(busy, ", "))
	}
	return nil
}

// ClusterPGSettings are those of compose's postgres service: Temporal's
// five processes and the application's share it (a test ties them).
var ClusterPGSettings = []string{"max_connections=300"}

// Replicas are the application's processes of the production shape.
type Replicas struct{ APIs, Workers int }

// Replica counts of the production shape by default, and of deploy/k8s
// (a test ties them); ClusterKafka brokers.
const (
	ClusterAPIs      = 2
	ClusterWorkers   = 2
	ClusterConsumers = 2
	ClusterKafka     = 3
)

// Cluster is `claimflow dev --shape cluster`: the production shape on one
// machine. The Temporal server runs as five processes on PostgreSQL,
// Apache Kafka as three brokers, `claimflow migrate` once as the schema
// owner, and two APIs, two workers and a consumer as processes of their
// own with compose's environment names. The simulators run in this
// process.
type Cluster struct {
	Stack *Stack
	// Procs are the application's processes, APIs the base URLs of the APIs.
	Procs []*devstack.Supervised
	APIs  []string
}

// StartCluster starts the stack o describes, then the application's
// processes: self (this binary) with the commands api, worker and
// consumer.
func StartCluster(ctx context.Context, cfg config.Config, log *slog.Logger, o StackOptions, r Replicas, self string) (*Cluster, error) {
	dataDir, err := filepath.Abs(o.DataDir)
	if err != nil {
		return nil, err
	}
	// The scripts format Kafka anew on every start, while PostgreSQL and
	// Temporal's databases stay: an old data dir would hold runs and rows
	// whose events are gone.
	if _, err := os.Stat(filepath.Join(dataDir, "kafka-cluster")); err == nil {
		return nil, fmt.Errorf("--shape cluster starts on a new data dir, and %s holds an earlier cluster: remove it or choose another --data-dir", dataDir)
	}
	ports, err := ClusterPortList(o, r)
	if err != nil {
		return nil, err
	}
	if err := checkPortsFree(ports); err != nil {
		return nil, err
	}
	o.TemporalCluster, o.KafkaNodes, o.NoMigrate, o.Headless = true, ClusterKafka, true, true
	o.PGSettings = append(o.PGSettings, ClusterPGSettings...)
	o.NoAPI, o.NoWorker, o.NoConsumer = true, true, true
	s, err := StartStack(ctx, cfg, log, o)
	if err != nil {
		return nil, err
	}
	c := &Cluster{Stack: s}
	defer func() {
		if err != nil {
			stopCtx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if stopErr := c.Stop(stopCtx, cfg); stopErr != nil {
				log.Warn("stopping a half-started cluster", "error", stopErr)
			}
		}
	}()

	env := os.Environ()
	for _, e := range s.OutsideEnv() {
		v := e.Value
		if e.FromFile {
			b, err := os.ReadFile(e.Value)
			if err != nil {
				return c, fmt.Errorf("read %s: %w", e.Name, err)
			}
			v = strings.TrimSpace(string(b))
		}
		env = append(env, e.Name+"="+v)
	}
	logs, run := filepath.Join(s.Options.DataDir, "logs"), filepath.Join(s.Options.DataDir, "run")
	if err := os.MkdirAll(run, 0o755); err != nil {
		return c, err
	}

	fmt.Fprintln(o.Progress, "running claimflow migrate as the schema owner...")
	migrate := exec.CommandContext(ctx, self, "migrate")
	migrate.Env = slices.Concat(env, []string{"MIGRATE_DATABASE_URL=" + s.Config.MigrateDatabaseURL})
	if out, err := migrate.CombinedOutput(); err != nil {
		return c, fmt.Errorf("claimflow migrate: %w\n%s", err, out)
	}

	host, _, _ := strings.Cut(o.HTTPAddr, ":")
	var apiPort int
	if _, err := fmt.Sscanf(o.HTTPAddr[len(host)+1:], "%d", &apiPort); err != nil {
		return c, fmt.Errorf("--http-addr %q: %w", o.HTTPAddr, err)
	}
	type proc struct {
		name string
		args []string
		env  []string
	}
	var procs []proc
	metrics := o.MetricsPort
	for i := 1; i <= r.Workers; i++ {
		procs = append(procs, proc{fmt.Sprintf("worker-%d", i), []string{"worker"}, []string{fmt.Sprintf("METRICS_ADDR=127.0.0.1:%d", metrics)}})
		metrics++
	}
	for i := 1; i <= ClusterConsumers; i++ {
		procs = append(procs, proc{fmt.Sprintf("consumer-%d", i), []string{"consumer"}, []string{fmt.Sprintf("METRICS_ADDR=127.0.0.1:%d", metrics)}})
		metrics++
	}
	for i := range r.APIs {
		addr := fmt.Sprintf("%s:%d", host, apiPort+i)
		args := []string{"api"}
		if s.Config.Security.InsecureNoAuth {
			args = append(args, "--insecure-no-auth")
		}
		procs = append(procs, proc{fmt.Sprintf("api-%d", i+1), args, []string{"HTTP_ADDR=" + addr}})
		c.APIs = append(c.APIs, "http://"+addr)
	}
	for _, p := range procs {
		sp, err := devstack.Supervise(p.name, append([]string{self}, p.args...), slices.Concat(env, p.env),
			filepath.Join(logs, p.name+".log"), filepath.Join(run, p.name+".pid"), log)
		if err != nil {
			return c, err
		}
		c.Procs = append(c.Procs, sp)
		fmt.Fprintf(o.Progress, "started claimflow %s as %s (pid %d, log %s)\n", strings.Join(p.args, " "), p.name, sp.PID(), sp.LogFile)
	}
	for _, api := range c.APIs {
		if err := waitReady(ctx, api+"/readyz", 2*time.Minute); err != nil {
			return c, err
		}
	}
	return c, nil
}

// waitReady polls url until it answers 200.
func waitReady(ctx context.Context, url string, within time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready within %s (last: %v)", url, within, err)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// Env is the environment that reaches the cluster, as one shell line.
func (c *Cluster) Env() string {
	return ShellLine(append(c.Stack.OutsideEnv(),
		Setting{Name: "CLAIMFLOW_API_URLS", Value: strings.Join(c.APIs, ",")},
		Setting{Name: "MIGRATE_DATABASE_URL", Value: c.Stack.Config.MigrateDatabaseURL}))
}

// stop stops the APIs first, then the consumer and the workers, then the
// infrastructure.
func (c *Cluster) Stop(ctx context.Context, cfg config.Config) error {
	var errs []error
	for i := len(c.Procs) - 1; i >= 0; i-- {
		pctx, cancel := context.WithTimeout(ctx, cfg.ShutdownTimeout+10*time.Second)
		errs = append(errs, c.Procs[i].Stop(pctx))
		cancel()
	}
	errs = append(errs, c.Stack.Stop(ctx))
	return errors.Join(errs...)
}
