// Package deploy checks the deployment files (docker-compose.yml,
// deploy/Dockerfile, deploy/k8s, Prometheus and Grafana provisioning)
// without a container engine: compose-go loads the compose file the way
// `docker compose` does, and the rest is parsed and cross-checked.
package deploy

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/dotenv"
	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
	"go.yaml.in/yaml/v4"

	"github.com/claimflow/claimflow/internal/config"
	"github.com/claimflow/claimflow/internal/kafka"
	"github.com/claimflow/claimflow/workflows"
)

const (
	composeFile      = "docker-compose.yml"
	clusterProfile   = "kafka-cluster"
	demoProfile      = "demo"
	demoEnvFile      = "demo.env"
	brokersOverride  = "CLAIMFLOW_KAFKA_BROKERS"
	appDockerfile    = "deploy/Dockerfile"
	postgresInitSQL  = "postgres/init.sh"
	prometheusConfig = "prometheus/prometheus.yml"
)

// requiredServices must exist without any profile.
var requiredServices = []string{
	"postgres", "temporal", "temporal-ui", "admin-tools", "kafka",
	"api", "worker", "migrate", "prometheus", "grafana",
}

// repoRoot is the repository root: the test runs in deploy/.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// requiredOperatorEnv is what the operator must set before compose loads
// the file at all (${VAR:?...}), with values as an operator would give
// them. The payout URL names no service of the file: it is the operator's.
var requiredOperatorEnv = map[string]string{
	"CLAIMFLOW_JWT_SECRET":        "operator-secret-0123456789abcdef0123456789abcdef",
	"CLAIMFLOW_EVENT_SIGNING_KEY": "operator-event-key-0123456789abcdef0123456789",
	"CLAIMFLOW_VENDOR_PAYOUT_URL": "https://payouts.vendor.example/v1/payouts",
	"GRAFANA_ADMIN_PASSWORD":      "operator-grafana-password",
}

// loadComposeErr loads docker-compose.yml as `docker compose` would, with
// the given profiles and an environment that holds only env: the test must
// not depend on the variables of the shell that runs it.
func loadComposeErr(t *testing.T, profiles []string, env map[string]string, skipInterpolation bool) (*types.Project, error) {
	t.Helper()
	root := repoRoot(t)
	details := types.ConfigDetails{
		WorkingDir:  root,
		ConfigFiles: []types.ConfigFile{{Filename: filepath.Join(root, composeFile)}},
		Environment: types.Mapping{},
	}
	maps.Copy(details.Environment, env)
	withDBPasswords(details.Environment) // compose_roles_test.go
	return loader.LoadWithContext(context.Background(), details, func(o *loader.Options) {
		o.ResolvePaths = true
		o.Profiles = profiles
		o.SkipInterpolation = skipInterpolation
	})
}

// loadCompose loads the file with the operator's required variables and
// env on top of them.
func loadCompose(t *testing.T, profiles []string, env map[string]string) *types.Project {
	t.Helper()
	all := maps.Clone(requiredOperatorEnv)
	maps.Copy(all, env)
	p, err := loadComposeErr(t, profiles, all, false)
	if err != nil {
		t.Fatalf("load %s with profiles %v: %v", composeFile, profiles, err)
	}
	return p
}

// demoEnv is the documented demo: deploy/demo.env on top of the operator's
// secrets (demo.env holds none), and the profiles it turns on.
func demoEnv(t *testing.T) (profiles []string, env map[string]string) {
	t.Helper()
	file, err := dotenv.Read(demoEnvFile)
	if err != nil {
		t.Fatalf("read %s: %v", demoEnvFile, err)
	}
	env = maps.Clone(requiredOperatorEnv)
	delete(env, "CLAIMFLOW_VENDOR_PAYOUT_URL") // the demo's comes from the file
	maps.Copy(env, file)
	profiles = strings.Split(file["COMPOSE_PROFILES"], ",")
	if !slices.Contains(profiles, demoProfile) {
		t.Errorf("%s: COMPOSE_PROFILES=%q does not turn on the %s profile", demoEnvFile, file["COMPOSE_PROFILES"], demoProfile)
	}
	return profiles, env
}

// projects are the ways the stack is started: by default, with the Kafka
// cluster, and the demo.
func projects(t *testing.T) map[string]*types.Project {
	demoProfiles, env := demoEnv(t)
	return map[string]*types.Project{
		"default":      loadCompose(t, nil, nil),
		clusterProfile: loadCompose(t, []string{clusterProfile}, nil),
		demoProfile:    loadCompose(t, demoProfiles, env),
	}
}

// knownEnvVars are the variables the binary reads (internal/config), the
// only ones compose and k8s may set for it.
func knownEnvVars(t *testing.T) map[string]bool {
	t.Helper()
	vars := map[string]bool{}
	for _, name := range config.Names() {
		vars[name] = true
	}
	if len(vars) == 0 {
		t.Fatal("config.Names() is empty")
	}
	return vars
}

// simulatorCommands are the claimflow subcommands that serve the demo's
// simulators: no service of claimflow's own, so they read no configuration.
var simulatorCommands = []string{"payoutsim", "notifysim"}

// appServices are the services that run claimflow's own services: those
// built from deploy/Dockerfile, except the simulators.
func appServices(t *testing.T, p *types.Project) map[string]types.ServiceConfig {
	t.Helper()
	out := imageServices(t, p)
	for name, s := range out {
		if len(s.Command) > 0 && slices.Contains(simulatorCommands, s.Command[0]) {
			delete(out, name)
		}
	}
	return out
}

// imageServices are the services built from deploy/Dockerfile.
func imageServices(t *testing.T, p *types.Project) map[string]types.ServiceConfig {
	t.Helper()
	root := repoRoot(t)
	out := map[string]types.ServiceConfig{}
	for name, s := range p.AllServices() {
		if s.Build == nil {
			continue
		}
		df := s.Build.Dockerfile
		if !filepath.IsAbs(df) {
			df = filepath.Join(s.Build.Context, df)
		}
		if rel, err := filepath.Rel(root, df); err == nil && filepath.ToSlash(rel) == appDockerfile {
			out[name] = s
		}
	}
	return out
}

func envValue(s types.ServiceConfig, key string) (string, bool) {
	v, ok := s.Environment[key]
	if !ok || v == nil {
		return "", false
	}
	return *v, true
}

func TestComposeLoads(t *testing.T) {
	var top map[string]any
	readYAML(t, filepath.Join("..", composeFile), &top)
	if _, ok := top["version"]; ok {
		t.Error("docker-compose.yml has a top-level version: key (obsolete in the compose spec)")
	}
	for name, p := range projects(t) {
		if p.Name != "claimflow" {
			t.Errorf("%s: project name %q, want claimflow (top-level name:)", name, p.Name)
		}
		if len(p.Services) == 0 {
			t.Errorf("%s: no services", name)
		}
	}
}

func TestComposeRequiredServices(t *testing.T) {
	for name, p := range projects(t) {
		for _, want := range requiredServices {
			if _, ok := p.Services[want]; !ok {
				t.Errorf("%s: service %q missing (enabled: %v)", name, want, p.ServiceNames())
			}
		}
	}
}

func TestComposeAppEnvIsKnownToTheBinary(t *testing.T) {
	known := knownEnvVars(t)
	for name, p := range projects(t) {
		apps := appServices(t, p)
		for _, want := range []string{"api", "worker", "migrate"} {
			if _, ok := apps[want]; !ok {
				t.Errorf("%s: service %q is not built from %s", name, want, appDockerfile)
			}
		}
		for svc, s := range apps {
			if len(s.EnvFiles) > 0 {
				t.Errorf("%s: %s uses env_file; set variables inline so this test sees them", name, svc)
			}
			for key := range s.Environment {
				if !known[key] {
					t.Errorf("%s: %s sets %s, which claimflow does not read (config.Names(): %v)", name, svc, key, mapKeys(known))
				}
			}
		}
	}
}

var validConditions = []string{
	types.ServiceConditionStarted, types.ServiceConditionHealthy, types.ServiceConditionCompletedSuccessfully,
}

func TestComposeDependsOn(t *testing.T) {
	for name, p := range projects(t) {
		for svc, s := range p.Services {
			for dep, d := range s.DependsOn {
				target, enabled := p.Services[dep]
				if !enabled {
					disabled, exists := p.DisabledServices[dep]
					switch {
					case !exists:
						t.Errorf("%s: %s depends on %q, which is not defined", name, svc, dep)
					case d.Required:
						t.Errorf("%s: %s requires %q, which profiles %v disable", name, svc, dep, disabled.Profiles)
					}
					continue
				}
				if !slices.Contains(validConditions, d.Condition) {
					t.Errorf("%s: %s -> %s: condition %q", name, svc, dep, d.Condition)
				}
				switch d.Condition {
				case types.ServiceConditionHealthy:
					if target.HealthCheck == nil || target.HealthCheck.Disable || len(target.HealthCheck.Test) == 0 {
						t.Errorf("%s: %s waits for %s to be healthy, but %s has no healthcheck", name, svc, dep, dep)
					}
				case types.ServiceConditionCompletedSuccessfully:
					if target.Restart != "" && target.Restart != types.RestartPolicyNo {
						t.Errorf("%s: %s waits for %s to complete, but %s has restart: %s", name, svc, dep, dep, target.Restart)
					}
				}
			}
		}
	}
}

func TestComposeAppStartOrder(t *testing.T) {
	want := map[string]string{
		"migrate":                    types.ServiceConditionCompletedSuccessfully,
		"postgres":                   types.ServiceConditionHealthy,
		"temporal":                   types.ServiceConditionHealthy,
		"temporal-search-attributes": types.ServiceConditionCompletedSuccessfully,
		"kafka":                      types.ServiceConditionHealthy,
		"kafka-init":                 types.ServiceConditionCompletedSuccessfully,
	}
	for name, p := range projects(t) {
		for _, svc := range []string{"api", "worker"} {
			s, ok := p.Services[svc]
			if !ok {
				t.Errorf("%s: no %s service", name, svc)
				continue
			}
			for dep, cond := range want {
				d, ok := s.DependsOn[dep]
				if !ok {
					t.Errorf("%s: %s does not depend on %s", name, svc, dep)
				} else if d.Condition != cond {
					t.Errorf("%s: %s -> %s: condition %q, want %q", name, svc, dep, d.Condition, cond)
				}
			}
			if name == clusterProfile {
				if d, ok := s.DependsOn["kafka-cluster-init"]; !ok || d.Condition != types.ServiceConditionCompletedSuccessfully {
					t.Errorf("%s: %s does not wait for kafka-cluster-init to complete", name, svc)
				}
			}
		}
		if m, ok := p.Services["migrate"]; ok {
			if !slices.Equal([]string(m.Command), []string{"migrate"}) {
				t.Errorf("%s: migrate runs %v, want [migrate]", name, m.Command)
			}
			if d, ok := m.DependsOn["postgres"]; !ok || d.Condition != types.ServiceConditionHealthy {
				t.Errorf("%s: migrate does not wait for postgres to be healthy", name)
			}
		}
	}
}

// imageTagRE splits an image reference into name and optional tag; the
// name's last path element may not contain ':'.
var imageTagRE = regexp.MustCompile(`^([^@]+?)(?::([\w][\w.-]{0,127}))?(@sha256:[0-9a-f]{64})?$`)

func checkPinned(ref string) error {
	if ref == "" {
		return errors.New("no image")
	}
	if strings.Contains(ref, "${") {
		return fmt.Errorf("image %q is not resolved", ref)
	}
	m := imageTagRE.FindStringSubmatch(ref)
	if m == nil || strings.Contains(path.Base(m[1]), ":") {
		return fmt.Errorf("image %q does not parse", ref)
	}
	if m[3] != "" {
		return nil // digest-pinned
	}
	switch m[2] {
	case "":
		return fmt.Errorf("image %q has no tag (means :latest)", ref)
	case "latest":
		return fmt.Errorf("image %q uses :latest", ref)
	}
	return nil
}

func TestComposeImagesPinned(t *testing.T) {
	p := loadCompose(t, nil, nil)
	for svc, s := range p.AllServices() {
		if err := checkPinned(s.Image); err != nil {
			t.Errorf("%s: %v", svc, err)
		}
	}
	for _, bad := range []string{"postgres", "postgres:latest", "apache/kafka", "localhost:5000/x"} {
		if checkPinned(bad) == nil {
			t.Errorf("checkPinned(%q) accepted an unpinned image", bad)
		}
	}
	for _, good := range []string{"postgres:16", "localhost:5000/x:1.2", "apache/kafka:4.1.1", "x@sha256:" + strings.Repeat("a", 64)} {
		if err := checkPinned(good); err != nil {
			t.Errorf("checkPinned(%q): %v", good, err)
		}
	}
}

func TestComposeAPIHealthcheck(t *testing.T) {
	p := loadCompose(t, nil, nil)
	api, ok := p.Services["api"]
	if !ok {
		t.Fatal("no api service")
	}
	hc := api.HealthCheck
	if hc == nil || hc.Disable || len(hc.Test) < 2 {
		t.Fatalf("api has no healthcheck: %+v", hc)
	}
	if !strings.Contains(strings.Join(hc.Test, " "), "/readyz") {
		t.Errorf("api healthcheck %v does not probe /readyz", hc.Test)
	}
	// The runtime image is distroless: an exec-form check must run a binary
	// the Dockerfile puts into the final stage.
	if hc.Test[0] == "CMD-SHELL" {
		t.Errorf("api healthcheck %v needs a shell, which the runtime image lacks", hc.Test)
	} else if hc.Test[0] == "CMD" {
		if !slices.Contains(runtimeCopies(t), hc.Test[1]) {
			t.Errorf("api healthcheck runs %s, which %s does not copy into the runtime image", hc.Test[1], appDockerfile)
		}
	}
	// Probes belong on the internal address (the public /readyz hides
	// the checks' detail).
	port := strings.TrimPrefix(strings.SplitN(hc.Test[len(hc.Test)-1], "/readyz", 2)[0], "http://")
	addr, _ := envValue(api, "INTERNAL_HTTP_ADDR")
	if _, hp, err := net.SplitHostPort(addr); err != nil || !strings.HasSuffix(port, ":"+hp) {
		t.Errorf("api healthcheck targets %q but INTERNAL_HTTP_ADDR is %q", port, addr)
	}
}

// TestComposeSetupMatchesCode checks that the one-shots register what the
// code uses: the namespace the app connects to, the search attributes its
// workflows set, the topics it publishes to, and the task queue named in
// Temporal's dynamic config.
func TestComposeSetupMatchesCode(t *testing.T) {
	for name, p := range projects(t) {
		sa, ok := p.Services["temporal-search-attributes"]
		if !ok {
			t.Fatalf("%s: no temporal-search-attributes service", name)
		}
		ns, _ := envValue(sa, "NAMESPACE")
		registered := map[string]string{}
		attrs, _ := envValue(sa, "SEARCH_ATTRIBUTES")
		for _, spec := range strings.Fields(attrs) {
			k, v, _ := strings.Cut(spec, ":")
			registered[k] = v
		}
		for attr, typ := range workflows.SearchAttributeTypes {
			if registered[attr] != typ {
				t.Errorf("%s: search attribute %s: registered as %q, workflows use %q", name, attr, registered[attr], typ)
			}
		}
		for svc, s := range appServices(t, p) {
			if v, ok := envValue(s, "TEMPORAL_NAMESPACE"); ok && v != ns {
				t.Errorf("%s: %s uses namespace %q, but %q is the one set up", name, svc, v, ns)
			}
		}
		for _, init := range []string{"kafka-init", "kafka-cluster-init"} {
			s, ok := p.Services[init]
			if !ok {
				if init == "kafka-init" || name == clusterProfile {
					t.Errorf("%s: no %s service", name, init)
				}
				continue
			}
			checkTopicInit(t, name+": "+init, p, s)
		}
	}
	var dc map[string][]struct {
		Constraints map[string]any `yaml:"constraints"`
	}
	readYAML(t, "temporal/dynamicconfig.yaml", &dc)
	for key, values := range dc {
		for _, v := range values {
			if tq, ok := v.Constraints["taskQueueName"]; ok && tq != workflows.TaskQueue {
				t.Errorf("dynamicconfig %s: taskQueueName %v, workers poll %q", key, tq, workflows.TaskQueue)
			}
		}
	}
}

// checkTopicInit checks a kafka-init service against internal/kafka's one
// list: it runs the service's own command with kafka-topics.sh replaced by
// a script that records its arguments, so what is checked is what the
// container would create, topic by topic: the list's names and partitions,
// and kafka.Replication of the brokers it bootstraps from.
func checkTopicInit(t *testing.T, where string, p *types.Project, s types.ServiceConfig) {
	t.Helper()
	const tool = "/opt/kafka/bin/kafka-topics.sh"
	script := strings.Join(s.Command, "\n")
	if len(s.Command) < 3 || s.Command[0] != "/bin/sh" || s.Command[1] != "-c" || !strings.Contains(script, tool) {
		t.Errorf("%s: command %q is not a /bin/sh -c script running %s", where, s.Command, tool)
		return
	}
	dir := t.TempDir()
	record := filepath.Join(dir, "calls")
	fake := filepath.Join(dir, "kafka-topics.sh")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\necho \"$*\" >> "+record+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/bin/sh", "-c", strings.ReplaceAll(s.Command[2], tool, fake))
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range s.Environment {
		if v != nil {
			cmd.Env = append(cmd.Env, k+"="+*v)
		}
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("%s: its command failed: %v\n%s", where, err, out)
		return
	}
	raw, err := os.ReadFile(record)
	if err != nil {
		t.Fatal(err)
	}
	bootstrap, _ := envValue(s, "BOOTSTRAP")
	brokers := strings.Split(bootstrap, ",")
	for _, b := range brokers {
		host, _, _ := net.SplitHostPort(b)
		if _, ok := kafkaBrokers(p)[host]; !ok {
			t.Errorf("%s: BOOTSTRAP %s is not a broker service of the stack", where, b)
		}
	}
	replicas, minInsync := kafka.Replication(len(brokers))
	created := map[string]kafka.Topic{}
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		f := strings.Fields(line)
		arg := func(name string) string {
			if i := slices.Index(f, name); i >= 0 && i+1 < len(f) {
				return f[i+1]
			}
			return ""
		}
		if !slices.Contains(f, "--create") {
			continue
		}
		if !slices.Contains(f, "--if-not-exists") {
			t.Errorf("%s: creates without --if-not-exists, so a rerun fails: %s", where, line)
		}
		part, _ := strconv.Atoi(arg("--partitions"))
		rf, _ := strconv.Atoi(arg("--replication-factor"))
		created[arg("--topic")] = kafka.Topic{Name: arg("--topic"), Partitions: int32(part), Replicas: int16(rf)}
		if want := fmt.Sprintf("min.insync.replicas=%d", minInsync); arg("--config") != want {
			t.Errorf("%s: %s with --config %s, want %s (kafka.Replication(%d))", where, arg("--topic"), arg("--config"), want, len(brokers))
		}
	}
	want := map[string]kafka.Topic{}
	for _, topic := range kafka.AllTopics(replicas) {
		want[topic.Name] = topic
	}
	for name, w := range want {
		if got, ok := created[name]; !ok {
			t.Errorf("%s: does not create %s", where, name)
		} else if got != w {
			t.Errorf("%s: creates %s with %d partitions and %d replicas, the topic list says %d and kafka.Replication(%d) %d",
				where, name, got.Partitions, got.Replicas, w.Partitions, len(brokers), w.Replicas)
		}
	}
	for name := range created {
		if _, ok := want[name]; !ok {
			t.Errorf("%s: creates %s, which is not in internal/kafka's topic list", where, name)
		}
	}
}

// TestComposeConsumerReadsTheTopicList: the consumer subscribes to the
// list's topics, by default (config's CONSUMER_TOPICS default) or as set.
func TestComposeConsumerReadsTheTopicList(t *testing.T) {
	want := strings.Join(kafka.EventTopicNames(), ",")
	if got := configDefaults(t)["CONSUMER_TOPICS"]; got != want {
		t.Errorf("CONSUMER_TOPICS defaults to %q, the topic list is %q", got, want)
	}
	for name, p := range projects(t) {
		c, ok := p.Services["consumer"]
		if !ok {
			t.Errorf("%s: no consumer service", name)
			continue
		}
		if got, ok := envValue(c, "CONSUMER_TOPICS"); ok && got != want {
			t.Errorf("%s: consumer reads %q, the topic list is %q", name, got, want)
		}
	}
}

// configDefaults are the defaults of config.Names() as config.Usage()
// prints them ("" for unset).
func configDefaults(t *testing.T) map[string]string {
	t.Helper()
	re := regexp.MustCompile(`^\s+(\S+)\s.*\(default: (.*)\)$`)
	out := map[string]string{}
	for _, line := range strings.Split(config.Usage(), "\n") {
		if m := re.FindStringSubmatch(line); m != nil {
			out[m[1]] = m[2]
			if m[2] == "unset" {
				out[m[1]] = ""
			}
		}
	}
	for _, name := range config.Names() {
		if _, ok := out[name]; !ok {
			t.Fatalf("config.Usage() shows no default for %s", name)
		}
	}
	return out
}

// serviceNeeds are the variables each claimflow service must be given in
// a deployment (compose and k8s): their defaults name the dev stack on
// 127.0.0.1, which is never right in a container. Authentication is
// checked apart (authConfigured), since hs256 and jwks need different ones.
var serviceNeeds = map[string][]string{
	"api":      {"DATABASE_URL", "TEMPORAL_ADDRESS", "TEMPORAL_UI_URL", "KAFKA_BROKERS", "HTTP_ADDR"},
	"worker":   {"DATABASE_URL", "TEMPORAL_ADDRESS", "KAFKA_BROKERS", "METRICS_ADDR", "VENDOR_PAYOUT_URL", "EVENT_SIGNING_KEY"},
	"consumer": {"DATABASE_URL", "TEMPORAL_ADDRESS", "KAFKA_BROKERS", "METRICS_ADDR", "EVENT_SIGNING_KEY"},
	"migrate":  {"MIGRATE_DATABASE_URL", "DATABASE_RUNTIME_ROLE"},
}

// authVariables are read by the API alone; authConfigured checks them.
var authVariables = []string{"AUTH_MODE", "JWT_SECRET", "JWKS_URL", "JWT_ISSUER", "JWT_AUDIENCE"}

// Reasons shared by a group of variables compose leaves unset.
const (
	composePlaintext = "compose's own Temporal, Kafka and PostgreSQL, on its private network, speak plaintext; a managed service sets it, docs/operations.md#secured-connections"
	composeNoTracing = "the SDK's defaults; CLAIMFLOW_OTLP_ENDPOINT turns tracing on (the demo's Jaeger), docs/architecture.md#tracing"
)

// composeDefaulted are the variables compose deliberately leaves to the
// binary's default, with the reason. A variable config.Names() gains must
// be set in compose or added here.
var composeDefaulted = map[string]string{
	// Secured connections: TLS, mTLS, API key and SASL.
	"TEMPORAL_TLS":                      composePlaintext,
	"TEMPORAL_TLS_SERVER_CA_CERT_PATH":  composePlaintext,
	"TEMPORAL_TLS_CLIENT_CERT_PATH":     composePlaintext,
	"TEMPORAL_TLS_CLIENT_KEY_PATH":      composePlaintext,
	"TEMPORAL_TLS_SERVER_NAME":          composePlaintext,
	"TEMPORAL_API_KEY":                  composePlaintext,
	"KAFKA_TLS":                         composePlaintext,
	"KAFKA_TLS_CA_PATH":                 composePlaintext,
	"KAFKA_TLS_CERT_PATH":               composePlaintext,
	"KAFKA_TLS_KEY_PATH":                composePlaintext,
	"KAFKA_TLS_SERVER_NAME":             composePlaintext,
	"KAFKA_SASL_MECHANISM":              composePlaintext,
	"KAFKA_SASL_USERNAME":               composePlaintext,
	"KAFKA_SASL_PASSWORD":               composePlaintext,
	"KAFKA_SASL_OAUTHBEARER_TOKEN_PATH": composePlaintext,
	// Tracing (the OpenTelemetry SDK's variables).
	"OTEL_SERVICE_NAME":           composeNoTracing,
	"OTEL_TRACES_SAMPLER":         composeNoTracing,
	"OTEL_TRACES_SAMPLER_ARG":     composeNoTracing,
	"OTEL_TRACES_EXPORTER":        composeNoTracing,
	"TEMPORAL_CLI":                "only 'claimflow dev' runs a Temporal CLI",
	"TEMPORAL_GRPC_COMPRESSION":   "gzip, the SDK's default, for a Temporal across a network",
	"KAFKA_LINGER":                "the default, for brokers across a network",
	"MIGRATE_DATABASE_URL":        "only the migrate service migrates (as the owner); the others never do",
	"DATABASE_RUNTIME_ROLE":       "read by migrate alone, to grant the runtime role its privileges",
	"LOG_FORMAT":                  "json, what a log collector reads",
	"RATE_LIMIT_PER_SUBJECT":      "the default is the production limit",
	"RATE_LIMIT_BURST":            "the default is the production limit",
	"RATE_LIMIT_ADMIN":            "admins are not limited unless the operator says so",
	"MAX_INFLIGHT_CLAIMS":         "the default sheds only a true overload",
	"PAYOUT_TIMEOUT":              "5s, the payout activity's bound derives from it",
	"CONSUMER_TOPICS":             "the default is internal/kafka's topic list",
	"CONSUMER_BATCH":              "the default is tuned in docs/consumer.md",
	"CLAIM_BATCH_MAX":             "the default is tuned in docs/performance.md",
	"CLAIM_BATCH_ATTR_BYTES":      "set on the api, the only service that batches",
	"CLAIM_DESKS":                 "the default, per api replica; the server admits 10 updates in flight on a run",
	"CLAIM_DESK_BATCHES":          "the default stays well below the server's updates per run",
	"WORKER_MAX_ACTIVITIES":       "set on the worker, the only service that runs activities",
	"CONSUMER_GROUP":              "set on the consumer, the only service in the group",
	"REQUEST_TIMEOUT":             "the default bounds each request; documented waits are added per route",
	"JWT_ROLE_CLAIM":              "hs256 tokens carry role; the name matters only with jwks",
	"READ_RATE_LIMIT_PER_SUBJECT": "the default is the production limit",
	"READ_RATE_LIMIT_BURST":       "the default is the production limit",
	"MAX_CONFIRM_WAITERS":         "the default bounds the waiters of one API process",
	"INTERNAL_HTTP_ADDR":          "set on the api; the worker and the consumer serve METRICS_ADDR",
	"NOTIFY_WEBHOOK_URL":          "optional: unset, notifications go to the table alone",
	"WAITLIST_PER_SEAT":           "the default bound is documented in docs/waitlist.md",
	"RECOVERY_AFTER":              "the default outlasts any desk's workflow task (docs/architecture.md)",
	"RECOVERY_EVERY":              "the default bounds how long a stranded reservation waits",
	// Authentication: the api uses hs256 with JWT_SECRET (authConfigured).
	"AUTH_MODE": "hs256, with the operator's JWT_SECRET",
	"JWKS_URL":  "only with AUTH_MODE=jwks",
	// Token lifetime, role names and one subject's claims in flight.
	"JWT_MAX_TTL":                     "the default: claimflow token mints no longer, the API accepts no longer",
	"JWT_ROLE_MAP":                    "hs256 tokens carry the API's own roles; a map serves an identity provider's",
	"MAX_INFLIGHT_CLAIMS_PER_SUBJECT": "the default bounds one subject well below MAX_INFLIGHT_CLAIMS",
}

// claimflowServices are the app services that run the claimflow service
// subcommands (not the simulators), by subcommand.
func claimflowServices(t *testing.T, p *types.Project) map[string]types.ServiceConfig {
	t.Helper()
	out := map[string]types.ServiceConfig{}
	for name, s := range appServices(t, p) {
		if len(s.Command) > 0 {
			if _, ok := serviceNeeds[s.Command[0]]; ok {
				out[name] = s
			}
		}
	}
	return out
}

// TestServiceNeedsCoverLoopbackDefaults: a variable whose default is the
// dev stack's loopback address must be in some service's needs, so a new
// one cannot be left to its default in a container unnoticed.
func TestServiceNeedsCoverLoopbackDefaults(t *testing.T) {
	needed := map[string]bool{}
	for _, vars := range serviceNeeds {
		for _, v := range vars {
			needed[v] = true
		}
	}
	for name, def := range configDefaults(t) {
		if strings.Contains(def, "127.0.0.1") && !needed[name] {
			t.Errorf("%s defaults to the loopback %q but no service's needs list it (serviceNeeds)", name, def)
		}
	}
	for svc, vars := range serviceNeeds {
		for _, v := range vars {
			if !knownEnvVars(t)[v] {
				t.Errorf("serviceNeeds[%s]: %s is not in config.Names()", svc, v)
			}
		}
	}
}

// TestComposeEnvSetOrDefaulted: every variable the binary reads is, for
// every claimflow service, set in compose, or deliberately left to its
// default (composeDefaulted), or needed only by another service; what a
// service needs is set.
func TestComposeEnvSetOrDefaulted(t *testing.T) {
	otherServices := map[string]bool{}
	for _, vars := range serviceNeeds {
		for _, v := range vars {
			otherServices[v] = true
		}
	}
	for name, p := range projects(t) {
		services := claimflowServices(t, p)
		for _, want := range []string{"api", "worker", "consumer", "migrate"} {
			if _, ok := services[want]; !ok {
				t.Errorf("%s: no service runs claimflow %s", name, want)
			}
		}
		for svc, s := range services {
			sub := s.Command[0]
			for _, v := range serviceNeeds[sub] {
				if val, ok := envValue(s, v); !ok || val == "" {
					t.Errorf("%s: %s (claimflow %s) needs %s, which it is not given", name, svc, sub, v)
				}
			}
			if sub == "migrate" {
				continue // reads DATABASE_URL and LOG_LEVEL only
			}
			for _, v := range config.Names() {
				if sub != "api" && slices.Contains(authVariables, v) {
					continue // read by the api alone
				}
				_, set := envValue(s, v)
				_, defaulted := composeDefaulted[v]
				if !set && !defaulted && !otherServices[v] {
					t.Errorf("%s: %s leaves %s to its default %q, and composeDefaulted gives no reason", name, svc, v, configDefaults(t)[v])
				}
			}
			if sub == "api" {
				if err := authConfigured(func(k string) string { v, _ := envValue(s, k); return v }); err != nil {
					t.Errorf("%s: %s: %v", name, svc, err)
				}
			}
		}
	}
}

// authConfigured checks an api's authentication variables: hs256 with a
// secret of at least 32 bytes, or jwks with the key set, issuer and
// audience (never off).
func authConfigured(get func(string) string) error {
	switch mode := get("AUTH_MODE"); mode {
	case "", config.AuthHS256:
		if len(get("JWT_SECRET")) < 32 {
			return fmt.Errorf("AUTH_MODE %q without a JWT_SECRET of 32 bytes or more", mode)
		}
	case "jwks":
		for _, v := range []string{"JWKS_URL", "JWT_ISSUER", "JWT_AUDIENCE"} {
			if get(v) == "" {
				return fmt.Errorf("AUTH_MODE=jwks without %s", v)
			}
		}
	default:
		return fmt.Errorf("AUTH_MODE %q in a deployment", mode)
	}
	return nil
}

// TestComposeRequiresOperatorSecrets: without each required variable the
// file does not load (compose refuses to start); with them it does. The
// JWT secret and Grafana's password have no default, anonymous Grafana is
// off unless turned on, and the demo still needs the secrets.
func TestComposeRequiresOperatorSecrets(t *testing.T) {
	demoProfiles, demo := demoEnv(t)
	for _, tc := range []struct {
		label    string
		profiles []string
		env      map[string]string
	}{
		{"default", nil, requiredOperatorEnv},
		{clusterProfile, []string{clusterProfile}, requiredOperatorEnv},
		{demoProfile, demoProfiles, demo},
	} {
		if _, err := loadComposeErr(t, tc.profiles, tc.env, false); err != nil {
			t.Errorf("%s: does not load with the required variables: %v", tc.label, err)
		}
		for v := range tc.env {
			if _, required := requiredOperatorEnv[v]; !required {
				continue
			}
			env := maps.Clone(tc.env)
			delete(env, v)
			_, err := loadComposeErr(t, tc.profiles, env, false)
			if err == nil || !strings.Contains(err.Error(), v) {
				t.Errorf("%s: loads without %s (err %v); compose must refuse to start", tc.label, v, err)
			}
			env[v] = ""
			if _, err := loadComposeErr(t, tc.profiles, env, false); err == nil {
				t.Errorf("%s: loads with %s empty", tc.label, v)
			}
		}
	}
	grafana := func(env map[string]string) types.ServiceConfig {
		s, ok := loadCompose(t, nil, env).Services["grafana"]
		if !ok {
			t.Fatal("no grafana service")
		}
		return s
	}
	if v, _ := envValue(grafana(nil), "GF_AUTH_ANONYMOUS_ENABLED"); v != "false" {
		t.Errorf("grafana: anonymous viewing %q by default, want false", v)
	}
	if v, _ := envValue(grafana(map[string]string{"GRAFANA_ANONYMOUS_ENABLED": "true"}), "GF_AUTH_ANONYMOUS_ENABLED"); v != "true" {
		t.Errorf("grafana: GRAFANA_ANONYMOUS_ENABLED=true gives anonymous viewing %q", v)
	}
	if v, _ := envValue(grafana(nil), "GF_SECURITY_ADMIN_PASSWORD"); v != requiredOperatorEnv["GRAFANA_ADMIN_PASSWORD"] {
		t.Errorf("grafana: admin password %q, not the operator's", v)
	}
}

// TestComposeEventSigningKey: the worker signs with the operator's key and
// the consumer verifies with the same one; no other service holds it.
func TestComposeEventSigningKey(t *testing.T) {
	for name, p := range projects(t) {
		for svc, s := range claimflowServices(t, p) {
			key, ok := envValue(s, "EVENT_SIGNING_KEY")
			switch sub := s.Command[0]; sub {
			case "worker", "consumer":
				if key != requiredOperatorEnv["CLAIMFLOW_EVENT_SIGNING_KEY"] {
					t.Errorf("%s: %s signs or verifies events with %q, not the operator's CLAIMFLOW_EVENT_SIGNING_KEY", name, svc, key)
				}
			default:
				if ok {
					t.Errorf("%s: %s (claimflow %s) holds EVENT_SIGNING_KEY, which only workers and consumers use", name, svc, sub)
				}
			}
		}
	}
}

// TestComposeDefaultedReasonsLink: a reason that points into the docs
// points at a heading that exists.
func TestComposeDefaultedReasonsLink(t *testing.T) {
	link := regexp.MustCompile(`docs/(\w+\.md)#([\w-]+)`)
	for v, reason := range composeDefaulted {
		for _, m := range link.FindAllStringSubmatch(reason, -1) {
			if !slices.Contains(docAnchors(t, filepath.Join(repoRoot(t), "docs", m[1])), m[2]) {
				t.Errorf("composeDefaulted[%s] points at docs/%s#%s, which has no such heading", v, m[1], m[2])
			}
		}
	}
}

// docAnchors are the anchors GitHub gives a Markdown file's headings.
func docAnchors(t *testing.T, file string) []string {
	t.Helper()
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(raw), "\n") {
		title, ok := strings.CutPrefix(strings.TrimLeft(line, "#"), " ")
		if !ok || !strings.HasPrefix(line, "#") {
			continue
		}
		slug := strings.Map(func(r rune) rune {
			switch {
			case r == ' ':
				return '-'
			case r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z':
				return r
			}
			return -1
		}, strings.ToLower(title))
		out = append(out, slug)
	}
	return out
}

// addressVariable reports whether an app variable names a place the app
// connects to (a URL, a host:port, a broker list); *_ADDR are listen
// addresses.
func addressVariable(name, value string) bool {
	return strings.Contains(value, "://") || strings.HasSuffix(name, "_URL") ||
		strings.HasSuffix(name, "_ADDRESS") || strings.HasSuffix(name, "_BROKERS")
}

var (
	requiredVarRe = regexp.MustCompile(`^\$\{(\w+):\?[^}]+\}$`)
	optionalVarRe = regexp.MustCompile(`^\$\{(\w+):-\}$`)
)

// TestComposeURLsNameServices: every URL and address the app services are
// given names a service of the file (in the profiles that run), or is a
// required operator variable (${VAR:?...}: no default at all), or an
// optional one that is empty unless set (${VAR:-}); a browser link on
// localhost names a published port. Never a .invalid placeholder. In the
// demo, deploy/demo.env fills the operator's variables with services.
func TestComposeURLsNameServices(t *testing.T) {
	demoProfiles, demo := demoEnv(t)
	for _, tc := range []struct {
		label    string
		profiles []string
		env      map[string]string
	}{
		{"default", nil, nil},
		{clusterProfile, []string{clusterProfile}, nil},
		{demoProfile, demoProfiles, demo},
	} {
		p := loadCompose(t, tc.profiles, tc.env)
		raw, err := loadComposeErr(t, tc.profiles, nil, true)
		if err != nil {
			t.Fatalf("%s: load without interpolation: %v", tc.label, err)
		}
		published := map[string]bool{}
		for _, s := range p.Services {
			for _, port := range s.Ports {
				published[port.Published] = true
			}
		}
		for svc, s := range appServices(t, p) {
			for key := range s.Environment {
				value, _ := envValue(s, key)
				rawValue, _ := envValue(raw.Services[svc], key)
				where := fmt.Sprintf("%s: %s %s=%q", tc.label, svc, key, value)
				if strings.Contains(value, ".invalid") || strings.Contains(rawValue, ".invalid") {
					t.Errorf("%s: a .invalid placeholder", where)
				}
				if !addressVariable(key, value) {
					continue
				}
				operator := requiredVarRe.MatchString(rawValue) || optionalVarRe.MatchString(rawValue)
				if operator && tc.label != demoProfile {
					continue // the operator's: compose cannot know it
				}
				if value == "" {
					if !optionalVarRe.MatchString(rawValue) {
						t.Errorf("%s: empty, and not an optional ${VAR:-}", where)
					}
					continue
				}
				for _, host := range addressHosts(value) {
					if h, port, _ := net.SplitHostPort(host); h == "localhost" || h == "127.0.0.1" {
						if !published[port] {
							t.Errorf("%s: %s is no port a service publishes", where, host)
						}
						continue
					} else if host != "" && h != "" {
						host = h
					}
					if _, ok := p.Services[host]; !ok {
						t.Errorf("%s: %s is not a service of the stack (%v)", where, host, p.ServiceNames())
					}
				}
			}
		}
	}
}

// addressHosts are the host:port (or host) parts of a URL, a host:port or
// a comma-separated broker list.
func addressHosts(value string) []string {
	var out []string
	for _, part := range strings.Split(value, ",") {
		if u, err := url.Parse(part); err == nil && u.Host != "" {
			out = append(out, u.Host)
			continue
		}
		out = append(out, part)
	}
	return out
}

// TestComposeDemoProfile: the simulators run only with the demo profile,
// from the claimflow image, with the subcommands the binary has, and the
// demo's URLs reach them on the ports they listen on.
func TestComposeDemoProfile(t *testing.T) {
	def := loadCompose(t, nil, nil)
	profiles, env := demoEnv(t)
	demo := loadCompose(t, profiles, env)
	sims := map[string]string{"payoutsim": "VENDOR_PAYOUT_URL", "notifysim": "NOTIFY_WEBHOOK_URL"}
	for sim, variable := range sims {
		if _, ok := def.Services[sim]; ok {
			t.Errorf("default: %s runs without the %s profile", sim, demoProfile)
		}
		s, ok := imageServices(t, demo)[sim]
		if !ok {
			t.Errorf("%s: no %s service built from %s", demoProfile, sim, appDockerfile)
			continue
		}
		if len(s.Command) != 3 || s.Command[0] != sim || s.Command[1] != "--addr" {
			t.Errorf("%s: command %v, want [%s --addr HOST:PORT]", sim, s.Command, sim)
			continue
		}
		_, port, err := net.SplitHostPort(s.Command[2])
		if err != nil {
			t.Errorf("%s: --addr %q: %v", sim, s.Command[2], err)
		}
		users := 0
		for svc, app := range claimflowServices(t, demo) {
			v, ok := envValue(app, variable)
			if !ok || v == "" {
				continue
			}
			users++
			u, err := url.Parse(v)
			if err != nil || u.Hostname() != sim || u.Port() != port {
				t.Errorf("%s: %s %s=%q does not reach %s on port %s", demoProfile, svc, variable, v, sim, port)
			}
			if d, ok := app.DependsOn[sim]; !ok || d.Required {
				t.Errorf("%s: %s does not depend on %s, or requires it outside the demo", demoProfile, svc, sim)
			}
		}
		if users == 0 {
			t.Errorf("%s: no service is given %s", demoProfile, variable)
		}
	}
}

// kafkaBrokers returns the enabled services that run a Kafka broker.
func kafkaBrokers(p *types.Project) map[string]types.ServiceConfig {
	out := map[string]types.ServiceConfig{}
	for name, s := range p.Services {
		roles, _ := envValue(s, "KAFKA_PROCESS_ROLES")
		if slices.Contains(strings.Split(roles, ","), "broker") {
			out[name] = s
		}
	}
	return out
}

// advertisedPlaintext is the in-network address a broker advertises.
func advertisedPlaintext(s types.ServiceConfig) string {
	adv, _ := envValue(s, "KAFKA_ADVERTISED_LISTENERS")
	for _, l := range strings.Split(adv, ",") {
		if addr, ok := strings.CutPrefix(l, "PLAINTEXT://"); ok {
			return addr
		}
	}
	return ""
}

func TestComposeKafkaClusterProfile(t *testing.T) {
	def := loadCompose(t, nil, nil)
	for name := range kafkaBrokers(def) {
		if name != "kafka" {
			t.Errorf("default: broker %s runs without the %s profile", name, clusterProfile)
		}
	}
	p := loadCompose(t, []string{clusterProfile}, nil)
	var cluster []string
	for name, s := range kafkaBrokers(p) {
		if slices.Contains(s.Profiles, clusterProfile) {
			cluster = append(cluster, name)
		}
	}
	slices.Sort(cluster)
	if len(cluster) != 3 {
		t.Fatalf("%s profile has brokers %v, want 3", clusterProfile, cluster)
	}
	ids := map[string]string{}
	for _, name := range cluster {
		s := p.Services[name]
		if v, _ := envValue(s, "KAFKA_MIN_INSYNC_REPLICAS"); v != "2" {
			t.Errorf("%s: KAFKA_MIN_INSYNC_REPLICAS=%q, want 2", name, v)
		}
		if v, _ := envValue(s, "KAFKA_DEFAULT_REPLICATION_FACTOR"); v != "3" {
			t.Errorf("%s: KAFKA_DEFAULT_REPLICATION_FACTOR=%q, want 3", name, v)
		}
		id, _ := envValue(s, "KAFKA_NODE_ID")
		if other, dup := ids[id]; dup || id == "" {
			t.Errorf("%s: KAFKA_NODE_ID %q (also %s)", name, id, other)
		}
		ids[id] = name
		voters, _ := envValue(s, "KAFKA_CONTROLLER_QUORUM_VOTERS")
		for _, peer := range cluster {
			if !strings.Contains(voters, "@"+peer+":") {
				t.Errorf("%s: quorum voters %q leave out %s", name, voters, peer)
			}
		}
		if s.HealthCheck == nil || len(s.HealthCheck.Test) == 0 {
			t.Errorf("%s: no healthcheck", name)
		}
	}
	init, ok := p.Services["kafka-cluster-init"]
	if !ok {
		t.Fatal("no kafka-cluster-init service in the profile")
	}
	if v, _ := envValue(init, "REPLICATION_FACTOR"); v != "3" {
		t.Errorf("kafka-cluster-init: REPLICATION_FACTOR=%q, want 3", v)
	}
	if v, _ := envValue(init, "MIN_INSYNC_REPLICAS"); v != "2" {
		t.Errorf("kafka-cluster-init: MIN_INSYNC_REPLICAS=%q, want 2", v)
	}
}

// TestComposeKafkaBrokersResolve checks that the app's KAFKA_BROKERS names
// brokers of the stack, by default and with the documented override for the
// kafka-cluster profile.
func TestComposeKafkaBrokersResolve(t *testing.T) {
	check := func(label string, p *types.Project, want string) {
		t.Helper()
		brokers := kafkaBrokers(p)
		byAddr := map[string]string{}
		for name, s := range brokers {
			byAddr[advertisedPlaintext(s)] = name
		}
		for svc, s := range appServices(t, p) {
			v, ok := envValue(s, "KAFKA_BROKERS")
			if !ok {
				if svc != "migrate" {
					t.Errorf("%s: %s has no KAFKA_BROKERS", label, svc)
				}
				continue
			}
			if want != "" && v != want {
				t.Errorf("%s: %s KAFKA_BROKERS=%q, want %q", label, svc, v, want)
			}
			for _, addr := range strings.Split(v, ",") {
				if _, ok := byAddr[addr]; !ok {
					t.Errorf("%s: %s KAFKA_BROKERS entry %q is no broker's advertised PLAINTEXT listener (%v)", label, svc, addr, mapKeys(byAddr))
				}
			}
		}
	}
	check("default", loadCompose(t, nil, nil), "")

	// The override documented in docker-compose.yml: the cluster brokers'
	// own advertised addresses.
	p := loadCompose(t, []string{clusterProfile}, nil)
	var addrs []string
	for _, s := range kafkaBrokers(p) {
		if slices.Contains(s.Profiles, clusterProfile) {
			addrs = append(addrs, advertisedPlaintext(s))
		}
	}
	slices.Sort(addrs)
	want := strings.Join(addrs, ",")
	check(clusterProfile, loadCompose(t, []string{clusterProfile}, map[string]string{brokersOverride: want}), want)
}

func TestComposeDatabaseURLIsNotSuperuser(t *testing.T) {
	p := loadCompose(t, nil, nil)
	pg, ok := p.Services["postgres"]
	if !ok {
		t.Fatal("no postgres service")
	}
	superuser, ok := envValue(pg, "POSTGRES_USER")
	if !ok || superuser == "" {
		superuser = "postgres"
	}
	initSQL, err := os.ReadFile(postgresInitSQL)
	if err != nil {
		t.Fatal(err)
	}
	for svc, s := range appServices(t, p) {
		raw, ok := envValue(s, "DATABASE_URL")
		if m, isMigrate := envValue(s, "MIGRATE_DATABASE_URL"); isMigrate {
			raw, ok = m, true
		}
		if !ok {
			t.Errorf("%s: no DATABASE_URL", svc)
			continue
		}
		u, err := url.Parse(raw)
		if err != nil {
			t.Errorf("%s: DATABASE_URL: %v", svc, err)
			continue
		}
		user := u.User.Username()
		switch user {
		case "":
			t.Errorf("%s: DATABASE_URL names no user", svc)
		case superuser, "postgres":
			t.Errorf("%s: DATABASE_URL connects as the superuser %q", svc, user)
		}
		if _, ok := p.Services[u.Hostname()]; !ok {
			t.Errorf("%s: DATABASE_URL host %q is not a service", svc, u.Hostname())
		}
		// The role must be created by init.sh, explicitly without superuser.
		stmt := regexp.MustCompile(`(?is)CREATE\s+ROLE\s+` + regexp.QuoteMeta(user) + `\b[^;]*;`).Find(initSQL)
		switch {
		case stmt == nil:
			t.Errorf("%s: %s does not create role %q", svc, postgresInitSQL, user)
		case !regexp.MustCompile(`(?i)\bNOSUPERUSER\b`).Match(stmt) || regexp.MustCompile(`(?i)[^O]SUPERUSER\b`).Match(stmt):
			t.Errorf("%s: role %q is not created NOSUPERUSER: %s", svc, user, stmt)
		}
	}
}

func TestComposeMountedFilesExist(t *testing.T) {
	root := repoRoot(t)
	inRepo := func(p string) error {
		rel, err := filepath.Rel(root, p)
		if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
			return fmt.Errorf("%s is outside the repository", p)
		}
		if _, err := os.Stat(p); err != nil {
			return err
		}
		return nil
	}
	p := loadCompose(t, []string{clusterProfile}, nil)
	for svc, s := range p.AllServices() {
		for _, v := range s.Volumes {
			if v.Type != types.VolumeTypeBind {
				if _, ok := p.Volumes[v.Source]; v.Type == types.VolumeTypeVolume && v.Source != "" && !ok {
					t.Errorf("%s: volume %q is not declared", svc, v.Source)
				}
				continue
			}
			if err := inRepo(v.Source); err != nil {
				t.Errorf("%s: bind mount %s -> %s: %v", svc, v.Source, v.Target, err)
			}
		}
		if s.Build != nil {
			if err := inRepo(s.Build.Context); err != nil {
				t.Errorf("%s: build context: %v", svc, err)
			}
			if err := inRepo(filepath.Join(s.Build.Context, s.Build.Dockerfile)); err != nil {
				t.Errorf("%s: dockerfile: %v", svc, err)
			}
		}
		for _, f := range s.EnvFiles {
			if err := inRepo(f.Path); err != nil && f.Required {
				t.Errorf("%s: env_file: %v", svc, err)
			}
		}
	}
}

// TestPrometheusScrapesComposeServices checks that every scrape target is a
// compose service (or Prometheus itself) and that Temporal's is the port
// its PROMETHEUS_ENDPOINT opens.
func TestPrometheusScrapesComposeServices(t *testing.T) {
	var cfg struct {
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			MetricsPath   string `yaml:"metrics_path"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	readYAML(t, prometheusConfig, &cfg)
	p := loadCompose(t, nil, nil)
	targets := map[string]bool{}
	for _, sc := range cfg.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			for _, target := range st.Targets {
				host, _, err := net.SplitHostPort(target)
				if err != nil {
					t.Errorf("job %s: target %q: %v", sc.JobName, target, err)
					continue
				}
				if _, ok := p.Services[host]; !ok && host != "localhost" {
					t.Errorf("job %s: target %q is not a compose service", sc.JobName, target)
				}
				targets[target] = true
			}
		}
	}
	if temporal, ok := p.Services["temporal"]; ok {
		ep, _ := envValue(temporal, "PROMETHEUS_ENDPOINT")
		_, port, err := net.SplitHostPort(ep)
		if err != nil || !targets["temporal:"+port] {
			t.Errorf("temporal exposes metrics on %q but Prometheus does not scrape temporal:%s", ep, port)
		}
	}
	if api, ok := p.Services["api"]; ok {
		addr, _ := envValue(api, "INTERNAL_HTTP_ADDR")
		_, port, err := net.SplitHostPort(addr)
		if err != nil || !targets["api:"+port] {
			t.Errorf("Prometheus does not scrape the API's internal address (INTERNAL_HTTP_ADDR %q)", addr)
		}
	}
}

// TestGrafanaProvisioning checks that the dashboard parses and uses the
// provisioned datasource, and that the provisioning points where compose
// mounts the dashboard.
func TestGrafanaProvisioning(t *testing.T) {
	var ds struct {
		Datasources []struct {
			UID  string `yaml:"uid"`
			Type string `yaml:"type"`
			URL  string `yaml:"url"`
		} `yaml:"datasources"`
	}
	readYAML(t, "grafana/datasource.yaml", &ds)
	uids := map[string]bool{}
	// Jaeger runs with the demo profile, whose services every datasource
	// may name.
	p := loadCompose(t, []string{"demo"}, nil)
	for _, d := range ds.Datasources {
		uids[d.UID] = true
		u, err := url.Parse(d.URL)
		if err != nil {
			t.Errorf("datasource %s: %v", d.UID, err)
		} else if _, ok := p.Services[u.Hostname()]; !ok {
			t.Errorf("datasource %s: %s is not a compose service", d.UID, d.URL)
		}
	}

	raw, err := os.ReadFile("grafana/claimflow.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		UID    string `json:"uid"`
		Panels []struct {
			Title      string `json:"title"`
			Datasource struct {
				UID string `json:"uid"`
			} `json:"datasource"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("claimflow.json: %v", err)
	}
	if dash.UID == "" || len(dash.Panels) == 0 {
		t.Errorf("claimflow.json: uid %q, %d panels", dash.UID, len(dash.Panels))
	}
	for _, panel := range dash.Panels {
		if !uids[panel.Datasource.UID] {
			t.Errorf("panel %q uses datasource %q, not provisioned (%v)", panel.Title, panel.Datasource.UID, mapKeys(uids))
		}
		for _, tg := range panel.Targets {
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("panel %q has an empty query", panel.Title)
			}
		}
	}

	var prov struct {
		Providers []struct {
			Options struct {
				Path string `yaml:"path"`
			} `yaml:"options"`
		} `yaml:"providers"`
	}
	readYAML(t, "grafana/dashboards.yaml", &prov)
	grafana, ok := p.Services["grafana"]
	if !ok {
		t.Fatal("no grafana service")
	}
	mounted := map[string]string{} // container path -> host file
	for _, v := range grafana.Volumes {
		mounted[v.Target] = v.Source
	}
	for _, pr := range prov.Providers {
		found := false
		for target, source := range mounted {
			if path.Dir(target) == pr.Options.Path && strings.HasSuffix(source, ".json") {
				found = true
			}
		}
		if !found {
			t.Errorf("dashboard provider path %s has no dashboard mounted into it (%v)", pr.Options.Path, mounted)
		}
	}
	for _, dir := range []string{"/etc/grafana/provisioning/datasources", "/etc/grafana/provisioning/dashboards"} {
		found := false
		for target := range mounted {
			found = found || path.Dir(target) == dir
		}
		if !found {
			t.Errorf("grafana: nothing mounted into %s", dir)
		}
	}
}

// ---------------------------------------------------------------- Dockerfile

type dockerStage struct {
	from   string
	name   string
	lines  []string
	copies []string // destinations of COPY in this stage
}

func dockerStages(t *testing.T) []dockerStage {
	t.Helper()
	raw, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	args := map[string]string{}
	var stages []dockerStage
	inHeredoc := ""
	for _, line := range strings.Split(string(raw), "\n") {
		trim := strings.TrimSpace(line)
		if inHeredoc != "" {
			if trim == inHeredoc {
				inHeredoc = ""
			}
			continue
		}
		if trim == "" || strings.HasPrefix(trim, "#") {
			continue
		}
		if m := regexp.MustCompile(`<<-?'?"?(\w+)`).FindStringSubmatch(trim); m != nil {
			inHeredoc = m[1]
		}
		fields := strings.Fields(trim)
		switch strings.ToUpper(fields[0]) {
		case "ARG":
			if k, v, ok := strings.Cut(fields[1], "="); ok && len(stages) == 0 {
				args[k] = v
			}
		case "FROM":
			from := fields[1]
			for k, v := range args {
				from = strings.ReplaceAll(from, "${"+k+"}", v)
			}
			st := dockerStage{from: from}
			if len(fields) >= 4 && strings.EqualFold(fields[2], "AS") {
				st.name = fields[3]
			}
			stages = append(stages, st)
			continue
		case "COPY":
			if len(stages) > 0 {
				stages[len(stages)-1].copies = append(stages[len(stages)-1].copies, fields[len(fields)-1])
			}
		}
		if len(stages) > 0 {
			stages[len(stages)-1].lines = append(stages[len(stages)-1].lines, trim)
		}
	}
	if len(stages) == 0 {
		t.Fatal("Dockerfile has no FROM")
	}
	return stages
}

// runtimeCopies are the paths the Dockerfile's final stage copies in.
func runtimeCopies(t *testing.T) []string {
	stages := dockerStages(t)
	return stages[len(stages)-1].copies
}

func TestDockerfile(t *testing.T) {
	stages := dockerStages(t)
	if len(stages) < 2 {
		t.Fatalf("want a multi-stage build, got %d stage(s)", len(stages))
	}
	for _, st := range stages {
		if err := checkPinned(st.from); err != nil {
			t.Errorf("FROM: %v", err)
		}
	}
	gomod, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	goLine := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(gomod)
	build := stages[0]
	if goLine == nil || !strings.HasPrefix(build.from, "golang:"+string(goLine[1])) {
		t.Errorf("build stage %q does not match go.mod's go %s", build.from, goLine[1])
	}
	if !strings.Contains(strings.Join(build.lines, "\n"), "CGO_ENABLED=0") {
		t.Error("build stage does not set CGO_ENABLED=0")
	}
	buildLine := slices.IndexFunc(build.lines, func(l string) bool {
		return strings.Contains(l, "go build") && strings.Contains(l, "-o /out/claimflow ./cmd/claimflow")
	})
	if buildLine < 0 {
		t.Error("build stage has no `go build ... -o /out/claimflow ./cmd/claimflow` line")
	} else if !strings.Contains(build.lines[buildLine], "-trimpath") {
		t.Errorf("claimflow is built without -trimpath: %s", build.lines[buildLine])
	}
	// Cache-friendly order: modules are downloaded before the source lands.
	idx := func(sub string) int {
		return slices.IndexFunc(build.lines, func(l string) bool { return strings.Contains(l, sub) })
	}
	mod, download, src := idx("COPY go.mod go.sum"), idx("go mod download"), idx("COPY . .")
	if mod < 0 || download < 0 || src < 0 || !(mod < download && download < src) {
		t.Errorf("want COPY go.mod go.sum, go mod download, COPY . . in that order (lines %d, %d, %d)", mod, download, src)
	}
	final := stages[len(stages)-1]
	if !strings.HasPrefix(final.from, "gcr.io/distroless/static") || !strings.HasSuffix(final.from, ":nonroot") {
		t.Errorf("runtime stage %q is not distroless static nonroot", final.from)
	}
	if !slices.Contains(final.lines, `ENTRYPOINT ["/claimflow"]`) {
		t.Errorf(`runtime stage has no ENTRYPOINT ["/claimflow"]`)
	}
	if !slices.Contains(final.copies, "/claimflow") {
		t.Errorf("runtime stage does not copy /claimflow")
	}
}

// TestDockerignore checks that the context leaves out local state and keeps
// everything the build compiles.
func TestDockerignore(t *testing.T) {
	raw, err := os.ReadFile("../.dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	var patterns []string
	for _, l := range strings.Split(string(raw), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			patterns = append(patterns, l)
		}
	}
	ignored := func(p string) bool {
		out := false
		for _, pat := range patterns {
			neg := strings.HasPrefix(pat, "!")
			if dockerignoreMatch(strings.TrimPrefix(pat, "!"), p) {
				out = !neg
			}
		}
		return out
	}
	for _, p := range []string{".claimflow", "bin", "deploy/kafka/lib", "deploy/kafka/run", ".git"} {
		if !ignored(p) {
			t.Errorf(".dockerignore does not exclude %s", p)
		}
	}
	// Every non-test file of the packages the binary is built from.
	keep := []string{"go.mod", "go.sum"}
	root := repoRoot(t)
	err = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if strings.HasPrefix(d.Name(), ".") && rel != "." || rel == "bin" || rel == "deploy/kafka/lib" || rel == "deploy/kafka/run" || rel == "tools" {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(rel, ".go") && !strings.HasSuffix(rel, "_test.go") || strings.HasSuffix(rel, ".sql") && strings.Contains(rel, "migrations/") {
			keep = append(keep, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range keep {
		if ignored(p) {
			t.Errorf(".dockerignore excludes %s, which the build needs", p)
		}
	}
}

// dockerignoreMatch reports whether pattern excludes p (slash-separated,
// relative to the context): the pattern matches p or one of its parent
// directories; "**" matches any number of directories.
func dockerignoreMatch(pattern, p string) bool {
	pattern = strings.Trim(path.Clean(pattern), "/")
	re := regexp.MustCompile(`^` + globToRegexp(pattern) + `(/.*)?$`)
	return re.MatchString(p)
}

func globToRegexp(g string) string {
	var b strings.Builder
	for i := 0; i < len(g); i++ {
		switch c := g[i]; {
		case strings.HasPrefix(g[i:], "**/"):
			b.WriteString(`(.*/)?`)
			i += 2
		case strings.HasPrefix(g[i:], "**"):
			b.WriteString(`.*`)
			i++
		case c == '*':
			b.WriteString(`[^/]*`)
		case c == '?':
			b.WriteString(`[^/]`)
		default:
			b.WriteString(regexp.QuoteMeta(string(c)))
		}
	}
	return b.String()
}

// ---------------------------------------------------------------- helpers

func readYAML(t *testing.T, file string, into any) {
	t.Helper()
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, into); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
}

func mapKeys[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}

// ---------------------------------------------------------------- Kubernetes

// k8sObject holds the fields of the manifests in deploy/k8s that the test
// looks at.
type k8sObject struct {
	file       string
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name   string            `yaml:"name"`
		Labels map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	Data map[string]string `yaml:"data"`
	Spec struct {
		// Deployment, Job
		Template struct {
			Metadata struct {
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"metadata"`
			Spec struct {
				Containers []k8sContainer `yaml:"containers"`
				Volumes    []struct {
					Name   string `yaml:"name"`
					Secret *struct {
						SecretName string `yaml:"secretName"`
					} `yaml:"secret"`
				} `yaml:"volumes"`
			} `yaml:"spec"`
		} `yaml:"template"`
		// Service: a label map; Deployment: {matchLabels: ...}
		Selector map[string]any `yaml:"selector"`
		Ports    []struct {
			Name       string `yaml:"name"`
			TargetPort any    `yaml:"targetPort"`
		} `yaml:"ports"`
		// HorizontalPodAutoscaler
		ScaleTargetRef struct {
			Kind string `yaml:"kind"`
			Name string `yaml:"name"`
		} `yaml:"scaleTargetRef"`
		MinReplicas int `yaml:"minReplicas"`
		MaxReplicas int `yaml:"maxReplicas"`
		// NetworkPolicy
		PodSelector *k8sLabelSelector `yaml:"podSelector"`
		PolicyTypes []string          `yaml:"policyTypes"`
		Ingress     []k8sPolicyRule   `yaml:"ingress"`
		Egress      []k8sPolicyRule   `yaml:"egress"`
		Metrics     []struct {
			Type     string `yaml:"type"`
			Resource struct {
				Name string `yaml:"name"`
			} `yaml:"resource"`
		} `yaml:"metrics"`
	} `yaml:"spec"`
}

type k8sProbe struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port any    `yaml:"port"`
	} `yaml:"httpGet"`
}

type k8sKeyRef struct {
	Name string `yaml:"name"`
	Key  string `yaml:"key"`
}

type k8sEnv struct {
	Name      string  `yaml:"name"`
	Value     *string `yaml:"value"`
	ValueFrom *struct {
		SecretKeyRef    *k8sKeyRef `yaml:"secretKeyRef"`
		ConfigMapKeyRef *k8sKeyRef `yaml:"configMapKeyRef"`
	} `yaml:"valueFrom"`
}

type k8sContainer struct {
	Name    string   `yaml:"name"`
	Image   string   `yaml:"image"`
	Command []string `yaml:"command"`
	Args    []string `yaml:"args"`
	Ports   []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	Env          []k8sEnv `yaml:"env"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
		SubPath   string `yaml:"subPath"`
		ReadOnly  bool   `yaml:"readOnly"`
	} `yaml:"volumeMounts"`
	EnvFrom []struct {
		ConfigMapRef *struct {
			Name string `yaml:"name"`
		} `yaml:"configMapRef"`
		SecretRef *struct {
			Name string `yaml:"name"`
		} `yaml:"secretRef"`
	} `yaml:"envFrom"`
	LivenessProbe  *k8sProbe `yaml:"livenessProbe"`
	ReadinessProbe *k8sProbe `yaml:"readinessProbe"`
	Resources      struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
}

// secretVariable reports whether a variable holds a secret: a password,
// key or token, or the database URL (its password is in it). A *_PATH
// names a file (of a mounted Secret), not the secret itself.
func secretVariable(name string) bool {
	name = strings.ToUpper(name)
	if strings.HasSuffix(name, "_PATH") {
		return false
	}
	if strings.HasSuffix(name, "_KEY") {
		return true
	}
	for _, s := range []string{"SECRET", "PASSWORD", "PASSWD", "TOKEN", "PRIVATE_KEY", "DATABASE_URL", "_DSN"} {
		if strings.Contains(name, s) {
			return true
		}
	}
	return false
}

// TestSecretVariables: the secrets among the variables claimflow reads are
// the ones secretVariable holds to secretKeyRef in k8s; the TLS files'
// paths and the SASL user are not secrets.
func TestSecretVariables(t *testing.T) {
	known := knownEnvVars(t)
	for name, secret := range map[string]bool{
		"DATABASE_URL": true, "MIGRATE_DATABASE_URL": true, "JWT_SECRET": true,
		"EVENT_SIGNING_KEY": true, "TEMPORAL_API_KEY": true, "KAFKA_SASL_PASSWORD": true,
		"TEMPORAL_TLS_CLIENT_KEY_PATH": false, "KAFKA_TLS_KEY_PATH": false,
		"KAFKA_SASL_OAUTHBEARER_TOKEN_PATH": false, "KAFKA_SASL_USERNAME": false, "JWKS_URL": false,
	} {
		if !known[name] {
			t.Errorf("%s is not in config.Names()", name)
		}
		if secretVariable(name) != secret {
			t.Errorf("secretVariable(%s) = %v, want %v", name, !secret, secret)
		}
	}
}

// urlPassword matches a URL with a password in it.
var urlPassword = regexp.MustCompile(`://[^/@\s:]+:[^/@\s]+@`)

// checkK8sSecrets: a secret reaches a container only through secretKeyRef;
// no env value is a literal secret (nor a URL with a password in it).
func checkK8sSecrets(t *testing.T, where string, c k8sContainer) {
	t.Helper()
	for _, e := range c.Env {
		if e.Value != nil && urlPassword.MatchString(*e.Value) {
			t.Errorf("%s: env %s is a URL with a literal password", where, e.Name)
		}
		if !secretVariable(e.Name) {
			continue
		}
		if e.Value != nil || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.ValueFrom.SecretKeyRef.Name == "" || e.ValueFrom.SecretKeyRef.Key == "" {
			t.Errorf("%s: env %s is a secret and must come from a secretKeyRef, not a value or ConfigMap", where, e.Name)
		}
	}
}

// k8sEnvOf is a container's environment as the pod would see it: its
// ConfigMaps taken whole, then its env (a configMapKeyRef resolved, a
// secretKeyRef as a placeholder of 32 bytes, since the secret's value is
// the operator's).
func k8sEnvOf(t *testing.T, c k8sContainer, configMaps map[string]k8sObject) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, ef := range c.EnvFrom {
		if ef.ConfigMapRef != nil {
			maps.Copy(env, configMaps[ef.ConfigMapRef.Name].Data)
		}
	}
	for _, e := range c.Env {
		switch {
		case e.Value != nil:
			env[e.Name] = *e.Value
		case e.ValueFrom != nil && e.ValueFrom.ConfigMapKeyRef != nil:
			ref := e.ValueFrom.ConfigMapKeyRef
			cm, ok := configMaps[ref.Name]
			if !ok || cm.Data[ref.Key] == "" {
				t.Errorf("%s: env %s refers to ConfigMap %s key %s, which is not in the kustomization", c.Name, e.Name, ref.Name, ref.Key)
			}
			env[e.Name] = cm.Data[ref.Key]
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
			env[e.Name] = "secret:" + strings.Repeat("x", 32)
		}
	}
	return env
}

// checkK8sTemporalSetup: a Job registers the namespace the services use
// and every search attribute of workflows.SearchAttributeTypes with its
// type, with compose's script and admin-tools image.
func checkK8sTemporalSetup(t *testing.T, others map[string]k8sContainer, configMaps map[string]k8sObject, workloads map[string]k8sContainer) {
	t.Helper()
	script, err := os.ReadFile("temporal/setup-namespace.sh")
	if err != nil {
		t.Fatal(err)
	}
	var setup *k8sContainer
	for _, c := range others {
		if len(c.Args) == 1 && c.Args[0] == string(script) {
			setup = &c
		}
	}
	if setup == nil {
		t.Fatal("no Job runs deploy/temporal/setup-namespace.sh verbatim (args: [script], command: [/bin/sh, -c])")
	}
	if !slices.Equal(setup.Command, []string{"/bin/sh", "-c"}) {
		t.Errorf("temporal setup: command %v, want [/bin/sh -c]", setup.Command)
	}
	if admin, ok := loadCompose(t, nil, nil).Services["admin-tools"]; ok && admin.Image != setup.Image {
		t.Errorf("temporal setup: image %s, compose's admin-tools run %s", setup.Image, admin.Image)
	}
	env := k8sEnvOf(t, *setup, configMaps)
	registered := map[string]string{}
	for _, spec := range strings.Fields(env["SEARCH_ATTRIBUTES"]) {
		k, v, _ := strings.Cut(spec, ":")
		registered[k] = v
	}
	if !maps.Equal(registered, workflows.SearchAttributeTypes) {
		t.Errorf("temporal setup registers %v, the workflows use %v", registered, workflows.SearchAttributeTypes)
	}
	ns := configMaps["claimflow-config"].Data["TEMPORAL_NAMESPACE"]
	if env["NAMESPACE"] == "" || env["NAMESPACE"] != ns {
		t.Errorf("temporal setup creates namespace %q, the services use %q", env["NAMESPACE"], ns)
	}
	if env["TEMPORAL_ADDRESS"] != configMaps["claimflow-config"].Data["TEMPORAL_ADDRESS"] {
		t.Errorf("temporal setup talks to %q, the services to %q", env["TEMPORAL_ADDRESS"], configMaps["claimflow-config"].Data["TEMPORAL_ADDRESS"])
	}
	// It reaches Temporal as the services do: the temporal CLI reads the
	// names claimflow reads.
	for _, sub := range []string{"api", "worker", "consumer"} {
		c, ok := workloads[sub]
		if !ok {
			continue
		}
		svc := k8sEnvOf(t, c, configMaps)
		for _, v := range temporalConnectionVars {
			if env[v] != svc[v] {
				t.Errorf("temporal setup: %s=%q, the %s's is %q", v, env[v], sub, svc[v])
			}
		}
	}
}

// k8sManifests reads every resource kustomization.yaml lists.
func k8sManifests(t *testing.T) (objs []k8sObject, imageNames []string) {
	t.Helper()
	var kust struct {
		Resources []string `yaml:"resources"`
		Images    []struct {
			Name string `yaml:"name"`
		} `yaml:"images"`
	}
	readYAML(t, "k8s/kustomization.yaml", &kust)
	for _, img := range kust.Images {
		imageNames = append(imageNames, img.Name)
	}
	listed := map[string]bool{}
	for _, r := range kust.Resources {
		listed[r] = true
		f, err := os.Open(filepath.Join("k8s", r))
		if err != nil {
			t.Fatalf("kustomization resource: %v", err)
		}
		dec := yaml.NewDecoder(f)
		for {
			var o k8sObject
			err := dec.Decode(&o)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				f.Close()
				t.Fatalf("k8s/%s: %v", r, err)
			}
			if o.Kind == "" {
				continue
			}
			o.file = r
			objs = append(objs, o)
		}
		f.Close()
	}
	// A manifest left out of the kustomization is never applied.
	files, _ := filepath.Glob("k8s/*.yaml")
	for _, f := range files {
		if base := filepath.Base(f); base != "kustomization.yaml" && !listed[base] {
			t.Errorf("k8s/%s is not listed in kustomization.yaml", base)
		}
	}
	return objs, imageNames
}

func TestK8sManifests(t *testing.T) {
	known := knownEnvVars(t)
	objs, imageNames := k8sManifests(t)
	byKind := map[string]map[string]k8sObject{}
	for _, o := range objs {
		if byKind[o.Kind] == nil {
			byKind[o.Kind] = map[string]k8sObject{}
		}
		byKind[o.Kind][o.Metadata.Name] = o
	}
	// Workloads: the binary's subcommand is args[0]. Other containers
	// (the Temporal setup Job) run pinned images of their own.
	workloads := map[string]k8sContainer{}
	podLabels := map[string]map[string]string{}
	others := map[string]k8sContainer{}
	// pods are every Deployment's and Job's, by role: the subcommand, or
	// temporalSetupRole for the Job that runs the setup script.
	setupScript, err := os.ReadFile("temporal/setup-namespace.sh")
	if err != nil {
		t.Fatal(err)
	}
	var pods []k8sPod
	for _, kind := range []string{"Deployment", "Job"} {
		for name, o := range byKind[kind] {
			for _, c := range o.Spec.Template.Spec.Containers {
				where := fmt.Sprintf("%s %s container %s", kind, name, c.Name)
				checkK8sSecrets(t, where, c)
				env := k8sEnvOf(t, c, byKind["ConfigMap"])
				checkK8sSecretFiles(t, where, o, c, env)
				pod := k8sPod{where: where, labels: o.Spec.Template.Metadata.Labels, annotations: o.Spec.Template.Metadata.Annotations, env: env}
				if !slices.Contains(imageNames, c.Image) {
					if err := checkPinned(c.Image); err != nil {
						t.Errorf("%s: image %q is neither claimflow (kustomization images %v) nor pinned: %v", where, c.Image, imageNames, err)
					}
					others[name] = c
					if len(c.Args) == 1 && c.Args[0] == string(setupScript) {
						pod.role = temporalSetupRole
					}
					pods = append(pods, pod)
					continue
				}
				if len(c.Args) == 0 {
					t.Errorf("%s: no args (subcommand)", where)
					continue
				}
				workloads[c.Args[0]] = c
				podLabels[c.Args[0]] = o.Spec.Template.Metadata.Labels
				pod.role = c.Args[0]
				pods = append(pods, pod)
				for _, e := range c.Env {
					if !known[e.Name] {
						t.Errorf("%s: env %s is not read by cmd/claimflow", where, e.Name)
					}
				}
				for _, ef := range c.EnvFrom {
					switch {
					case ef.SecretRef != nil:
						t.Errorf("%s: envFrom secret %s hides its variable names; use secretKeyRef", where, ef.SecretRef.Name)
					case ef.ConfigMapRef != nil:
						cm, ok := byKind["ConfigMap"][ef.ConfigMapRef.Name]
						if !ok {
							t.Errorf("%s: envFrom ConfigMap %s is not in the kustomization", where, ef.ConfigMapRef.Name)
						}
						for key := range cm.Data {
							if !known[key] {
								t.Errorf("ConfigMap %s: %s is not read by cmd/claimflow", cm.Metadata.Name, key)
							}
						}
					}
				}
				if c.Resources.Requests["cpu"] == "" || c.Resources.Requests["memory"] == "" || c.Resources.Limits["memory"] == "" {
					t.Errorf("%s: want cpu and memory requests and a memory limit, got %+v", where, c.Resources)
				}
			}
		}
	}
	for _, sub := range []string{"api", "worker", "migrate"} {
		if _, ok := workloads[sub]; !ok {
			t.Errorf("no workload runs %q", sub)
		}
	}
	if migrate, ok := workloads["migrate"]; ok && len(byKind["Job"]) == 0 {
		t.Errorf("migrate (%s) should be a Job", migrate.Name)
	}

	// What each service needs is given, from the container's env or the
	// ConfigMaps it takes whole; the api authenticates strictly.
	for sub, c := range workloads {
		env := k8sEnvOf(t, c, byKind["ConfigMap"])
		for _, v := range serviceNeeds[sub] {
			if env[v] == "" {
				t.Errorf("%s (%s) needs %s, which it is not given", sub, c.Name, v)
			}
		}
		if sub == "api" {
			if err := authConfigured(func(k string) string { return env[k] }); err != nil {
				t.Errorf("api: %v", err)
			}
		}
	}
	for _, cm := range byKind["ConfigMap"] {
		for key, value := range cm.Data {
			if secretVariable(key) || strings.Contains(value, ".invalid") || urlPassword.MatchString(value) {
				t.Errorf("ConfigMap %s: %s holds a secret or a placeholder (%q); take secrets through secretKeyRef", cm.Metadata.Name, key, value)
			}
		}
	}
	for name := range byKind["Secret"] {
		t.Errorf("Secret %s is in the kustomization: secret values are created by the operator, never committed", name)
	}
	checkK8sTemporalSetup(t, others, byKind["ConfigMap"], workloads)
	checkK8sEventKey(t, workloads)
	checkK8sNetworkPolicies(t, pods, byKind["NetworkPolicy"])

	// API probes and Service.
	if api, ok := workloads["api"]; ok {
		portNames := map[string]bool{}
		for _, p := range api.Ports {
			portNames[p.Name] = true
			portNames[strconv.Itoa(p.ContainerPort)] = true
		}
		for _, pr := range []struct {
			kind  string
			probe *k8sProbe
			path  string
		}{{"liveness", api.LivenessProbe, "/healthz"}, {"readiness", api.ReadinessProbe, "/readyz"}} {
			switch {
			case pr.probe == nil || pr.probe.HTTPGet == nil:
				t.Errorf("api: no HTTP %s probe", pr.kind)
			case pr.probe.HTTPGet.Path != pr.path:
				t.Errorf("api: %s probe on %s, want %s", pr.kind, pr.probe.HTTPGet.Path, pr.path)
			case !portNames[fmt.Sprint(pr.probe.HTTPGet.Port)]:
				t.Errorf("api: %s probe port %v is not a container port", pr.kind, pr.probe.HTTPGet.Port)
			}
		}
		found := false
		for name, svc := range byKind["Service"] {
			matches := len(svc.Spec.Selector) > 0
			for k, v := range svc.Spec.Selector {
				matches = matches && podLabels["api"][k] == fmt.Sprint(v)
			}
			if !matches {
				continue
			}
			found = true
			for _, p := range svc.Spec.Ports {
				if !portNames[fmt.Sprint(p.TargetPort)] {
					t.Errorf("Service %s: targetPort %v is not an api container port", name, p.TargetPort)
				}
			}
		}
		if !found {
			t.Error("no Service selects the api pods")
		}
	}

	// Worker autoscaling.
	var workerDeployment string
	for name, o := range byKind["Deployment"] {
		for _, c := range o.Spec.Template.Spec.Containers {
			if len(c.Args) > 0 && c.Args[0] == "worker" {
				workerDeployment = name
			}
		}
	}
	hpaFound := false
	for name, h := range byKind["HorizontalPodAutoscaler"] {
		if h.Spec.ScaleTargetRef.Kind != "Deployment" || h.Spec.ScaleTargetRef.Name != workerDeployment {
			continue
		}
		hpaFound = true
		if h.Spec.MinReplicas != 2 || h.Spec.MaxReplicas != 20 {
			t.Errorf("HPA %s: replicas %d..%d, want 2..20", name, h.Spec.MinReplicas, h.Spec.MaxReplicas)
		}
		cpu := slices.ContainsFunc(h.Spec.Metrics, func(m struct {
			Type     string `yaml:"type"`
			Resource struct {
				Name string `yaml:"name"`
			} `yaml:"resource"`
		}) bool {
			return m.Type == "Resource" && m.Resource.Name == "cpu"
		})
		if !cpu {
			t.Errorf("HPA %s does not scale on CPU", name)
		}
	}
	if !hpaFound {
		t.Errorf("no HPA targets the worker Deployment %q", workerDeployment)
	}
}

// ---------------------------------------------------------------- k8s: secured connections

// temporalConnectionVars are how a client reaches Temporal: the names
// claimflow and the temporal CLI read alike.
var temporalConnectionVars = []string{
	"TEMPORAL_TLS", "TEMPORAL_TLS_SERVER_CA_CERT_PATH", "TEMPORAL_TLS_CLIENT_CERT_PATH",
	"TEMPORAL_TLS_CLIENT_KEY_PATH", "TEMPORAL_TLS_SERVER_NAME", "TEMPORAL_API_KEY",
}

// checkK8sSecretFiles: every file a container is pointed at (a *_PATH
// variable: certificates, keys, a token) lies in a directory mounted
// read-only from a Secret, whole (no subPath), so a renewed file reaches
// the running pod, which re-reads it.
func checkK8sSecretFiles(t *testing.T, where string, o k8sObject, c k8sContainer, env map[string]string) {
	t.Helper()
	fromSecret := map[string]bool{}
	for _, v := range o.Spec.Template.Spec.Volumes {
		fromSecret[v.Name] = v.Secret != nil && v.Secret.SecretName != ""
	}
	for name, value := range env {
		if !strings.HasSuffix(name, "_PATH") || value == "" {
			continue
		}
		found := false
		for _, m := range c.VolumeMounts {
			if !strings.HasPrefix(value, strings.TrimSuffix(m.MountPath, "/")+"/") {
				continue
			}
			found = true
			if !fromSecret[m.Name] || !m.ReadOnly || m.SubPath != "" {
				t.Errorf("%s: %s=%s is in volume %s, which is not a Secret's mounted read-only and whole (no subPath)", where, name, value, m.Name)
			}
		}
		if !found {
			t.Errorf("%s: %s=%s is in no volume the container mounts", where, name, value)
		}
	}
}

// checkK8sEventKey: the workers sign with, and the consumers verify with,
// one key from one Secret; no other workload holds it.
func checkK8sEventKey(t *testing.T, workloads map[string]k8sContainer) {
	t.Helper()
	refs := map[string]k8sKeyRef{}
	for sub, c := range workloads {
		for _, e := range c.Env {
			if e.Name != "EVENT_SIGNING_KEY" {
				continue
			}
			if sub != "worker" && sub != "consumer" {
				t.Errorf("%s holds EVENT_SIGNING_KEY, which only workers and consumers use", sub)
			}
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				refs[sub] = *e.ValueFrom.SecretKeyRef
			}
		}
	}
	if refs["worker"].Name == "" || refs["worker"] != refs["consumer"] {
		t.Errorf("EVENT_SIGNING_KEY: the worker's %+v and the consumer's %+v must be one Secret's key", refs["worker"], refs["consumer"])
	}
}

// ---------------------------------------------------------------- k8s: NetworkPolicies

type k8sLabelSelector struct {
	MatchLabels      map[string]string `yaml:"matchLabels"`
	MatchExpressions []any             `yaml:"matchExpressions"`
}

// selects: every label the selector names matches (empty: every pod).
func (s k8sLabelSelector) selects(labels map[string]string) bool {
	for k, v := range s.MatchLabels {
		if labels[k] != v {
			return false
		}
	}
	return true
}

type k8sPolicyPeer struct {
	PodSelector       *k8sLabelSelector `yaml:"podSelector"`
	NamespaceSelector *k8sLabelSelector `yaml:"namespaceSelector"`
	IPBlock           *struct {
		CIDR   string   `yaml:"cidr"`
		Except []string `yaml:"except"`
	} `yaml:"ipBlock"`
}

// namespace is the namespace the peer names by its kubernetes.io/metadata.name
// label ("" if none: all namespaces, its own, or an ipBlock).
func (p k8sPolicyPeer) namespace() string {
	if p.NamespaceSelector == nil {
		return ""
	}
	return p.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"]
}

type k8sPolicyRule struct {
	From  []k8sPolicyPeer `yaml:"from"`
	To    []k8sPolicyPeer `yaml:"to"`
	Ports []struct {
		Port     any    `yaml:"port"`
		Protocol string `yaml:"protocol"`
	} `yaml:"ports"`
}

// k8sPod is the pod of a Deployment or Job: its role (the claimflow
// subcommand, or temporalSetupRole), labels, annotations and environment.
type k8sPod struct {
	where, role         string
	labels, annotations map[string]string
	env                 map[string]string
}

const (
	temporalSetupRole = "temporal-setup"
	// k8sPostgresPort is where the services reach PostgreSQL: the URLs are
	// the operator's Secrets, kustomization.yaml shows them on 5432.
	k8sPostgresPort = 5432
	dnsPort         = 53
)

// k8sEgressNeeds are what each pod may reach, and must: the namespace's
// DNS, Temporal (TEMPORAL_ADDRESS), Kafka (KAFKA_BROKERS), PostgreSQL, the
// vendors' payout API, the webhook (NOTIFY_WEBHOOK_URL, or HTTPS while it
// is the operator's to add) and the identity provider's key set (JWKS_URL).
var k8sEgressNeeds = map[string][]string{
	"api":             {"dns", "temporal", "kafka", "postgres", "jwks"},
	"worker":          {"dns", "temporal", "kafka", "postgres", "payout", "webhook"},
	"consumer":        {"dns", "temporal", "kafka", "postgres", "webhook"},
	"migrate":         {"dns", "postgres"},
	temporalSetupRole: {"dns", "temporal"},
}

// policyPort is a rule's port as a number; named ports are refused so the
// test can hold them to the addresses.
func policyPort(t *testing.T, where string, p any) int {
	t.Helper()
	n, ok := p.(int)
	if !ok {
		t.Errorf("%s: port %v: give the number", where, p)
	}
	return n
}

// addrPort is the port of a host:port, or of a URL (by its scheme when it
// names none).
func addrPort(t *testing.T, where, addr string) (host string, port int) {
	t.Helper()
	if u, err := url.Parse(addr); err == nil && u.Host != "" {
		host, p := u.Hostname(), u.Port()
		if p == "" {
			p = map[string]string{"https": "443", "http": "80"}[u.Scheme]
		}
		port, _ = strconv.Atoi(p)
		return host, port
	}
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Errorf("%s: address %q: %v", where, addr, err)
	}
	port, _ = strconv.Atoi(p)
	return h, port
}

// clusterNamespace is the namespace of an in-cluster service name
// (name.namespace.svc[.cluster.local]), "" for any other host.
func clusterNamespace(host string) string {
	parts := strings.Split(host, ".")
	if len(parts) >= 3 && parts[2] == "svc" {
		return parts[1]
	}
	return ""
}

// checkK8sNetworkPolicies: one namespace-wide policy denies every pod's
// traffic both ways, and one policy of its own opens what each pod uses:
// the api's HTTP port from anywhere (nothing else from outside), each
// metrics port Prometheus scrapes from Prometheus alone, and egress only to
// the ports of the pod's own needs (k8sEgressNeeds), each in the namespace
// its in-cluster address names.
func checkK8sNetworkPolicies(t *testing.T, pods []k8sPod, policies map[string]k8sObject) {
	t.Helper()
	if len(policies) == 0 {
		t.Fatal("no NetworkPolicy in the kustomization")
	}
	selects := map[string]int{}
	for name, np := range policies {
		sel := np.Spec.PodSelector
		switch {
		case sel == nil:
			t.Errorf("NetworkPolicy %s: no podSelector", name)
			continue
		case len(sel.MatchExpressions) > 0:
			t.Errorf("NetworkPolicy %s: select by matchLabels only", name)
		}
		if !slices.Contains(np.Spec.PolicyTypes, "Ingress") || !slices.Contains(np.Spec.PolicyTypes, "Egress") {
			t.Errorf("NetworkPolicy %s: policyTypes %v, want Ingress and Egress (an Egress policy without it is not enforced)", name, np.Spec.PolicyTypes)
		}
		if len(sel.MatchLabels) == 0 && (len(np.Spec.Ingress) > 0 || len(np.Spec.Egress) > 0) {
			t.Errorf("NetworkPolicy %s selects every pod and allows traffic: the namespace-wide policy only denies", name)
		}
	}
	for _, pod := range pods {
		if _, ok := k8sEgressNeeds[pod.role]; !ok {
			t.Errorf("%s: a pod of no known role (%q): give it its policy and its needs", pod.where, pod.role)
			continue
		}
		var deny, own []string
		var ingress, egress []k8sPolicyRule
		for name, np := range policies {
			if np.Spec.PodSelector == nil || !np.Spec.PodSelector.selects(pod.labels) {
				continue
			}
			selects[name]++
			if len(np.Spec.PodSelector.MatchLabels) == 0 {
				deny = append(deny, name)
			} else {
				own = append(own, name)
			}
			ingress = append(ingress, np.Spec.Ingress...)
			egress = append(egress, np.Spec.Egress...)
		}
		if len(deny) != 1 || len(own) != 1 {
			t.Errorf("%s: selected by namespace-wide %v and own %v, want the default deny and one policy of its own", pod.where, deny, own)
		}
		checkK8sIngress(t, pod, ingress)
		checkK8sEgress(t, pod, egress)
	}
	for name, np := range policies {
		switch n := selects[name]; {
		case n == 0:
			t.Errorf("NetworkPolicy %s selects no pod of the kustomization", name)
		case n > 1 && np.Spec.PodSelector != nil && len(np.Spec.PodSelector.MatchLabels) > 0:
			t.Errorf("NetworkPolicy %s selects %d workloads' pods: give each its own", name, n)
		}
	}
}

// checkK8sIngress: only the api's HTTP port (HTTP_ADDR) takes traffic from
// anywhere; the only other port open is the metrics port Prometheus
// scrapes (prometheus.io/port, the address the pod serves metrics on),
// from Prometheus's pods in their namespace.
func checkK8sIngress(t *testing.T, pod k8sPod, rules []k8sPolicyRule) {
	t.Helper()
	httpPort, metricsPort := -1, -1
	if pod.role == "api" {
		_, httpPort = addrPort(t, pod.where, pod.env["HTTP_ADDR"])
		if a := pod.env["INTERNAL_HTTP_ADDR"]; a != "" {
			_, metricsPort = addrPort(t, pod.where, a)
		}
	} else if a := pod.env["METRICS_ADDR"]; a != "" {
		_, metricsPort = addrPort(t, pod.where, a)
	}
	scrape := pod.annotations["prometheus.io/port"]
	if scrape != "" && scrape != strconv.Itoa(metricsPort) {
		t.Errorf("%s: Prometheus scrapes port %s, the pod serves metrics on %d", pod.where, scrape, metricsPort)
	}
	open, scraped := false, false
	for _, r := range rules {
		if len(r.Ports) == 0 {
			t.Errorf("%s: an ingress rule without ports opens them all", pod.where)
		}
		anywhere := len(r.From) == 0
		for _, peer := range r.From {
			if peer.IPBlock != nil || peer.namespace() == "" && peer.NamespaceSelector != nil {
				anywhere = true
			}
		}
		for _, p := range r.Ports {
			port := policyPort(t, pod.where, p.Port)
			switch {
			case anywhere && pod.role == "api" && port == httpPort:
				open = true
			case anywhere:
				t.Errorf("%s: takes port %d from anywhere; only the api's HTTP port (HTTP_ADDR) does", pod.where, port)
			case scrape == "" || port != metricsPort:
				t.Errorf("%s: takes port %d; only its metrics port, scraped by Prometheus (prometheus.io/port %q), is open", pod.where, port, scrape)
			default:
				scraped = true
				for _, peer := range r.From {
					if peer.namespace() == "" || peer.PodSelector == nil || len(peer.PodSelector.MatchLabels) == 0 {
						t.Errorf("%s: metrics port %d open to %+v, not to Prometheus's pods in their namespace", pod.where, port, peer)
					}
				}
			}
		}
	}
	if pod.role == "api" && !open {
		t.Errorf("%s: the api's HTTP port %d takes no traffic", pod.where, httpPort)
	}
	if scrape != "" && !scraped {
		t.Errorf("%s: Prometheus scrapes port %s, which no policy opens to it", pod.where, scrape)
	}
}

// checkK8sEgress: a pod reaches exactly the ports its needs name, DNS over
// UDP and TCP, an in-cluster address only in its namespace, and nothing
// but PostgreSQL (whose host is the operator's Secret) without a named
// destination.
func checkK8sEgress(t *testing.T, pod k8sPod, rules []k8sPolicyRule) {
	t.Helper()
	want := map[int]string{} // port -> what the pod reaches on it
	inNS := map[int]string{} // port -> the namespace its address names
	addNeed := func(what, addr string) {
		host, port := addrPort(t, pod.where+" "+what, addr)
		want[port] = what + " " + addr
		if ns := clusterNamespace(host); ns != "" {
			inNS[port] = ns
		}
	}
	for _, need := range k8sEgressNeeds[pod.role] {
		switch need {
		case "dns":
			want[dnsPort], inNS[dnsPort] = "DNS", "kube-system"
		case "postgres":
			want[k8sPostgresPort] = "PostgreSQL"
		case "temporal":
			addNeed("Temporal", pod.env["TEMPORAL_ADDRESS"])
		case "kafka":
			for _, b := range strings.Split(pod.env["KAFKA_BROKERS"], ",") {
				addNeed("Kafka", b)
			}
		case "payout":
			addNeed("the payout API", pod.env["VENDOR_PAYOUT_URL"])
		case "jwks":
			if pod.env["AUTH_MODE"] == "jwks" {
				addNeed("the identity provider", pod.env["JWKS_URL"])
			}
		case "webhook":
			if u := pod.env["NOTIFY_WEBHOOK_URL"]; u != "" {
				addNeed("the webhook", u)
			} else {
				want[443] = "the webhook (https)"
			}
		}
	}
	got := map[int]bool{}
	dnsProtocols := map[string]bool{}
	for _, r := range rules {
		if len(r.Ports) == 0 {
			t.Errorf("%s: an egress rule without ports opens them all", pod.where)
		}
		for _, p := range r.Ports {
			port := policyPort(t, pod.where, p.Port)
			proto := cmp.Or(p.Protocol, "TCP")
			if port == dnsPort {
				dnsProtocols[proto] = true
			} else if proto != "TCP" {
				t.Errorf("%s: egress on %s port %d", pod.where, proto, port)
			}
			what, ok := want[port]
			if !ok {
				t.Errorf("%s: egress on port %d, which none of its needs %v uses", pod.where, port, k8sEgressNeeds[pod.role])
				continue
			}
			got[port] = true
			if len(r.To) == 0 && port != k8sPostgresPort {
				t.Errorf("%s: egress on port %d (%s) to anywhere: name its destination", pod.where, port, what)
			}
			if ns := inNS[port]; ns != "" {
				for _, peer := range r.To {
					if peer.namespace() != ns {
						t.Errorf("%s: egress on port %d goes to %+v, not namespace %s of %s", pod.where, port, peer, ns, what)
					}
				}
			}
		}
	}
	for port, what := range want {
		if !got[port] {
			t.Errorf("%s: reaches %s on port %d, which its policies do not allow", pod.where, what, port)
		}
	}
	if _, ok := want[dnsPort]; ok && (!dnsProtocols["UDP"] || !dnsProtocols["TCP"]) {
		t.Errorf("%s: DNS over %v, want UDP and TCP", pod.where, mapKeys(dnsProtocols))
	}
}
