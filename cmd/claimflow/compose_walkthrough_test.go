package main

// The README's docker compose walk-through, run as written against what
// compose would run: `claimflow dev --services none` stands in for the
// containers of Postgres, Temporal and Kafka, and migrate, api, worker,
// consumer and the demo's simulators run as their own processes with the
// commands and the environment the compose model gives them (compose-go
// loads docker-compose.yml with the README's env file and profile), their
// container addresses mapped to the dev stack's local ones.

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/compose-spec/compose-go/v2/dotenv"
	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"

	"github.com/claimflow/claimflow/dev/devstack"
	"github.com/claimflow/claimflow/internal/kafka"
)

// walkthrough is the README's compose walk-through: the fenced block after
// the <!-- compose-walkthrough --> marker.
type walkthrough struct {
	exports  []string // the export line's variable names
	export   string   // the export line itself
	envFile  string   // docker compose --env-file
	profiles []string // docker compose --profile
	script   []string // every other line, run by bash
}

func readWalkthrough(t *testing.T) walkthrough {
	t.Helper()
	raw, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(raw), "<!-- compose-walkthrough -->\n```sh\n")
	if !ok {
		t.Fatal("README.md has no <!-- compose-walkthrough --> block")
	}
	block, _, ok := strings.Cut(after, "\n```")
	if !ok {
		t.Fatal("README.md: the compose walk-through block does not end")
	}
	var w walkthrough
	for _, line := range strings.Split(block, "\n") {
		switch {
		case strings.HasPrefix(line, "export "):
			w.export = line
			for _, m := range regexp.MustCompile(`(\w+)=`).FindAllStringSubmatch(line, -1) {
				w.exports = append(w.exports, m[1])
			}
		case strings.HasPrefix(line, "docker compose "):
			f := strings.Fields(line)
			for i := 0; i+1 < len(f); i++ {
				switch f[i] {
				case "--env-file":
					w.envFile = f[i+1]
				case "--profile":
					w.profiles = append(w.profiles, f[i+1])
				}
			}
			if !slices.Contains(f, "up") {
				t.Fatalf("README walk-through: %q does not start the stack", line)
			}
		default:
			w.script = append(w.script, line)
		}
	}
	if w.export == "" || w.envFile == "" || len(w.profiles) == 0 {
		t.Fatalf("README walk-through: want an export line and docker compose --env-file F --profile P up; got %+v", w)
	}
	return w
}

// operatorValues runs the walk-through's export line and returns the
// values it sets, as an operator's shell would have them.
func operatorValues(t *testing.T, w walkthrough) map[string]string {
	t.Helper()
	script := w.export
	for _, name := range w.exports {
		script += fmt.Sprintf("; printf '%%s=%%s\\n' %s \"$%s\"", name, name)
	}
	out, err := exec.Command("bash", "-ec", script).Output()
	if err != nil {
		t.Fatalf("README export line: %v", err)
	}
	vals := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		k, v, _ := strings.Cut(line, "=")
		if v == "" {
			t.Fatalf("README export line leaves %s empty", k)
		}
		vals[k] = v
	}
	return vals
}

// loadWalkthroughCompose loads docker-compose.yml as `docker compose` would
// with the README's env file, profiles and exported variables, and nothing
// from the test's own environment.
func loadWalkthroughCompose(t *testing.T, w walkthrough, operator map[string]string) *types.Project {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	file, err := dotenv.Read(filepath.Join(root, w.envFile))
	if err != nil {
		t.Fatalf("README's --env-file: %v", err)
	}
	env := types.Mapping{}
	maps.Copy(env, file)
	maps.Copy(env, operator) // the shell wins over the env file
	p, err := loader.LoadWithContext(context.Background(), types.ConfigDetails{
		WorkingDir:  root,
		ConfigFiles: []types.ConfigFile{{Filename: filepath.Join(root, "docker-compose.yml")}},
		Environment: env,
	}, func(o *loader.Options) {
		o.ResolvePaths = true
		o.Profiles = w.profiles
	})
	if err != nil {
		t.Fatalf("docker compose would not start as the README says: %v", err)
	}
	return p
}

// freeAddr is a free 127.0.0.1 address.
func freeAddr(t *testing.T) string {
	t.Helper()
	port, err := devstack.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", port)
}

// addrMap maps compose's in-network addresses (service:port) and the host
// ports it publishes (127.0.0.1:port, localhost:port) to where the same
// thing listens in this test.
type addrMap map[string]string

// rewrite replaces every mapped address in s; an address of a compose
// service left unmapped fails the test, so a new one cannot slip through
// pointed at nothing.
func (m addrMap) rewrite(t *testing.T, p *types.Project, where, s string) string {
	t.Helper()
	keys := slices.Sorted(maps.Keys(m))
	slices.SortStableFunc(keys, func(a, b string) int { return len(b) - len(a) })
	var pairs []string
	for _, k := range keys {
		pairs = append(pairs, k, m[k])
	}
	s = strings.NewReplacer(pairs...).Replace(s) // one pass: no chained rewrites
	for _, name := range p.ServiceNames() {
		if regexp.MustCompile(`(^|[/@,])` + regexp.QuoteMeta(name) + `:\d+`).MatchString(s) {
			t.Fatalf("%s: %q still names compose service %s: add it to the test's address map", where, s, name)
		}
	}
	return s
}

// composeProcess runs a compose service's command with its environment
// (addresses mapped) as a process of the built binary.
func composeProcess(t *testing.T, s *stack, p *types.Project, m addrMap, svc string, override map[string]string) *replica {
	t.Helper()
	sc, ok := p.Services[svc]
	if !ok {
		t.Fatalf("compose runs no %s with the README's profiles %v", svc, p.Profiles)
	}
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "LOG_FORMAT=text"}
	for _, k := range slices.Sorted(maps.Keys(sc.Environment)) {
		if sc.Environment[k] == nil {
			continue
		}
		v := *sc.Environment[k]
		if o, ok := override[k]; ok {
			v = o
		} else {
			v = m.rewrite(t, p, svc+" "+k, v)
		}
		env = append(env, k+"="+v)
	}
	args := slices.Clone(sc.Command)
	for i, a := range args {
		args[i] = m.rewrite(t, p, svc+" command", a)
	}
	logFile := filepath.Join(s.Options.DataDir, "logs", "compose-"+svc+".log")
	f, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(claimflowBinary(t), args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", svc, err)
	}
	_ = f.Close()
	r := &replica{name: svc, cmd: cmd, log: logFile, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(r.exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-r.exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-r.exited
		}
		if t.Failed() {
			if b, err := os.ReadFile(logFile); err == nil {
				t.Logf("--- %s log ---\n%s", svc, tail(b, 60))
			}
		}
	})
	return r
}

// listenAddr is where a compose service's listen address (0.0.0.0:P) goes.
func listenAddr(t *testing.T, m addrMap, containerAddr string) string {
	t.Helper()
	_, port, err := net.SplitHostPort(containerAddr)
	if err != nil {
		t.Fatalf("listen address %q: %v", containerAddr, err)
	}
	local := freeAddr(t)
	m["0.0.0.0:"+port] = local
	return local
}

func TestComposeWalkthrough(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the dev stack")
	}
	w := readWalkthrough(t)
	operator := operatorValues(t, w)
	p := loadWalkthroughCompose(t, w, operator)

	// The containers of the infrastructure: `claimflow dev --services none`.
	// The simulators run below as compose's own services instead of the
	// stack's.
	o := testStackOptions(t, dataDir(t))
	if err := o.ChooseServices("none"); err != nil {
		t.Fatal(err)
	}
	m := addrMap{}
	sims := map[string]string{} // service -> local address
	for _, sim := range []string{"payoutsim", "notifysim"} {
		sc, ok := p.Services[sim]
		if !ok {
			t.Fatalf("the README's profiles %v run no %s", w.profiles, sim)
		}
		i := slices.Index(sc.Command, "--addr")
		if i < 0 || i+1 >= len(sc.Command) {
			t.Fatalf("%s: command %v has no --addr", sim, sc.Command)
		}
		_, port, _ := net.SplitHostPort(sc.Command[i+1])
		sims[sim] = freeAddr(t)
		m[sim+":"+port] = sims[sim]
		m[sc.Command[i+1]] = sims[sim]
		for _, pp := range sc.Ports {
			m["127.0.0.1:"+pp.Published] = sims[sim]
		}
	}
	o.PayoutURL = "http://" + sims["payoutsim"] + "/payouts"
	o.NotifyURL = "http://" + sims["notifysim"] + "/notifications"
	s := startTestStack(t, o)

	// The broker the services meet has the topics compose's kafka-init
	// creates: internal/kafka's list, with its partitions.
	checkBrokerTopics(t, s, p)

	db, err := url.Parse(s.Config.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	m["postgres:5432"] = db.Host
	m["temporal:7233"] = s.Config.TemporalAddress
	// The demo's Jaeger: a receiver that keeps which services' spans
	// share a trace.
	traces := startOTLPSink(t)
	m["jaeger:4318"] = traces.addr
	for _, b := range strings.Split(*p.Services["api"].Environment["KAFKA_BROKERS"], ",") {
		m[b] = strings.Join(s.Config.KafkaBrokers, ",")
	}
	for _, svc := range p.Services {
		for _, pp := range svc.Ports {
			if pp.Target == 8080 && svc.Name == "temporal-ui" {
				// A link for browsers only; the test stack runs no UI.
				m["localhost:"+pp.Published] = fmt.Sprintf("127.0.0.1:%d", s.Options.UIPort)
			}
		}
	}
	// DATABASE_URL's credentials are the roles of compose's init script,
	// which the dev stack's cluster does not have: the services get the
	// stack's URL, after a check that compose's names the same database.
	// migrate connects as the owner (MIGRATE_DATABASE_URL), the services as
	// the runtime role: each gets the dev stack's URL of the same role.
	dbOverride := func(svc string) map[string]string {
		name, stackURL := "DATABASE_URL", s.Config.DatabaseURL
		if svc == "migrate" {
			name, stackURL = "MIGRATE_DATABASE_URL", s.Config.MigrateDatabaseURL
		}
		v := p.Services[svc].Environment[name]
		if v == nil {
			t.Fatalf("%s: compose gives it no %s", svc, name)
		}
		u, err := url.Parse(*v)
		su, serr := url.Parse(stackURL)
		if err != nil || serr != nil || u.Host != "postgres:5432" || u.Path != db.Path || u.User.Username() != su.User.Username() {
			t.Fatalf("%s: compose's %s %q is not role %s on database %s at postgres:5432", svc, name, *v, su.User.Username(), db.Path)
		}
		return map[string]string{name: stackURL}
	}

	for _, sim := range []string{"payoutsim", "notifysim"} {
		r := composeProcess(t, s, p, m, sim, nil)
		waitFor(t, 30*time.Second, sim+" listening", func() bool {
			r.alive(t)
			c, err := net.DialTimeout("tcp", sims[sim], time.Second)
			if err == nil {
				_ = c.Close()
			}
			return err == nil
		})
	}
	migrate := composeProcess(t, s, p, m, "migrate", dbOverride("migrate"))
	select {
	case <-migrate.exited:
		if !migrate.cmd.ProcessState.Success() {
			b, _ := os.ReadFile(migrate.log)
			t.Fatalf("migrate failed: %v\n%s", migrate.cmd.ProcessState, tail(b, 40))
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("migrate did not finish in 2 minutes")
	}
	apiAddr := listenAddr(t, m, *p.Services["api"].Environment["HTTP_ADDR"])
	for _, pp := range p.Services["api"].Ports {
		m["127.0.0.1:"+pp.Published] = apiAddr
	}
	for _, svc := range []string{"worker", "consumer"} {
		listenAddr(t, m, *p.Services[svc].Environment["METRICS_ADDR"])
	}
	var procs []*replica
	for _, svc := range []string{"api", "worker", "consumer"} {
		procs = append(procs, composeProcess(t, s, p, m, svc, dbOverride(svc)))
	}
	waitFor(t, 2*time.Minute, "api ready", func() bool {
		for _, r := range procs {
			r.alive(t)
		}
		resp, err := http.Get("http://" + apiAddr + "/readyz")
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})

	// The walk-through, as written: published host ports mapped to the
	// processes, `go run ./cmd/claimflow` to the built binary.
	type step struct {
		line string
		want []string
	}
	var script []string
	var steps []step
	for _, line := range w.script {
		line = m.rewrite(t, p, "README line", line)
		line = strings.ReplaceAll(line, "go run ./cmd/claimflow", claimflowBinary(t))
		code, want, ok := strings.Cut(line, "   # → ")
		if !ok {
			script = append(script, line)
			continue
		}
		steps = append(steps, step{line: code, want: strings.Split(want, ", ")})
		script = append(script, fmt.Sprintf("echo '@@step %d'", len(steps)-1), code, "echo")
	}
	if len(steps) == 0 {
		t.Fatal("the README walk-through states no expected answer (# → ...)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", strings.Join(script, "\n"))
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	for k, v := range operator {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		stderr := ""
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("the walk-through failed: %v\nstdout:\n%s\nstderr:\n%s", err, out, stderr)
	}
	answers := map[int]string{}
	for _, part := range strings.Split(string(out), "@@step ")[1:] {
		n, rest, _ := strings.Cut(part, "\n")
		i, _ := strconv.Atoi(n)
		answers[i] = rest
	}
	for i, st := range steps {
		for _, want := range st.want {
			if !strings.Contains(answers[i], want) {
				t.Errorf("README walk-through: %s\nanswered %q, the README says it contains %s", st.line, answers[i], want)
			}
		}
	}
	t.Logf("walk-through answers:\n%s", out)

	// The demo profile sends traces to Jaeger: a claim's spans from the
	// API, the worker and the consumer arrive under one trace ID.
	if env := p.Services["api"].Environment["OTEL_EXPORTER_OTLP_ENDPOINT"]; env != nil && *env != "" {
		want := []string{"claimflow-api", "claimflow-worker", "claimflow-consumer"}
		var per map[string]int
		var spanning int
		waitFor(t, 30*time.Second, "one trace across api, worker and consumer", func() bool {
			per, spanning = traces.services(want...)
			return spanning > 0
		})
		t.Logf("traces received per service: %v; %d hold spans of all of %v", per, spanning, want)
	}
}

// checkBrokerTopics compares the dev stack's broker with the topic list
// and with what compose's kafka-init creates (name:partitions pairs).
func checkBrokerTopics(t *testing.T, s *stack, p *types.Project) {
	t.Helper()
	cfg := sarama.NewConfig()
	admin, err := sarama.NewClusterAdmin(s.Config.KafkaBrokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	have, err := admin.ListTopics()
	if err != nil {
		t.Fatal(err)
	}
	composeTopics := map[string]int32{}
	if init, ok := p.Services["kafka-init"]; ok && init.Environment["TOPICS"] != nil {
		for _, spec := range strings.Fields(*init.Environment["TOPICS"]) {
			name, n, _ := strings.Cut(spec, ":")
			parts, _ := strconv.Atoi(n)
			composeTopics[name] = int32(parts)
		}
	} else {
		t.Error("compose has no kafka-init with TOPICS")
	}
	for _, want := range kafka.AllTopics(1) {
		d, ok := have[want.Name]
		switch {
		case !ok:
			t.Errorf("the dev stack's broker has no topic %s", want.Name)
		case d.NumPartitions != want.Partitions:
			t.Errorf("the dev stack's broker has %s with %d partitions, the topic list says %d", want.Name, d.NumPartitions, want.Partitions)
		}
		if got := composeTopics[want.Name]; got != want.Partitions {
			t.Errorf("compose's kafka-init creates %s with %d partitions, the topic list says %d", want.Name, got, want.Partitions)
		}
	}
}
