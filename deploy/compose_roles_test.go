package deploy

// The database roles and their passwords in compose and k8s: compose
// refuses to load without the operator's passwords, services connect as the
// runtime role and only migrate as the owner, no password is written in a
// file, and deploy/postgres/init.sh really creates what the code expects.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.yaml.in/yaml/v4"

	"github.com/claimflow/claimflow/dev/devstack"
	"github.com/claimflow/claimflow/internal/config"
	"github.com/claimflow/claimflow/internal/store"
)

const postgresInitScript = "postgres/init.sh"

// dbPasswords are the operator's database passwords compose requires, with
// the values the tests give them (distinct, so a test can tell which one
// reached which place).
var dbPasswords = map[string]string{
	"CLAIMFLOW_PG_PASSWORD":          "test-superuser-pw",
	"CLAIMFLOW_PG_OWNER_PASSWORD":    "test-owner-pw",
	"CLAIMFLOW_PG_APP_PASSWORD":      "test-app-pw",
	"CLAIMFLOW_PG_TEMPORAL_PASSWORD": "test-temporal-pw",
}

// withDBPasswords gives env the database passwords it does not set, so the
// compose tests load the file as an operator who set them would.
func withDBPasswords(env types.Mapping) {
	for k, v := range dbPasswords {
		if _, ok := env[k]; !ok {
			env[k] = v
		}
	}
}

// requiredVars are the variables docker-compose.yml refuses to load
// without (${NAME:?message}), read from the file itself.
func requiredVars(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), composeFile))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*):\?`).FindAllSubmatch(b, -1) {
		names = append(names, string(m[1]))
	}
	slices.Sort(names)
	return slices.Compact(names)
}

func loadComposeEnv(t *testing.T, env map[string]string) error {
	t.Helper()
	root := repoRoot(t)
	_, err := loader.LoadWithContext(context.Background(), types.ConfigDetails{
		WorkingDir:  root,
		ConfigFiles: []types.ConfigFile{{Filename: filepath.Join(root, composeFile)}},
		Environment: types.Mapping(env),
	}, func(o *loader.Options) { o.ResolvePaths = true })
	return err
}

// TestComposeRequiresDBPasswords: with every required variable set the
// file loads; with any one database password unset it does not, and says
// which.
func TestComposeRequiresDBPasswords(t *testing.T) {
	required := requiredVars(t)
	for name := range dbPasswords {
		if !slices.Contains(required, name) {
			t.Errorf("docker-compose.yml does not require %s (${%s:?…})", name, name)
		}
	}
	all := map[string]string{}
	for _, name := range required {
		all[name] = "x-" + strings.ToLower(name)
	}
	if err := loadComposeEnv(t, all); err != nil {
		t.Fatalf("compose does not load with %v set: %v", required, err)
	}
	for name := range dbPasswords {
		t.Run(name+" unset", func(t *testing.T) {
			env := maps.Clone(all)
			delete(env, name)
			err := loadComposeEnv(t, env)
			if err == nil || !strings.Contains(err.Error(), name) {
				t.Fatalf("compose loaded without %s (err = %v)", name, err)
			}
		})
		t.Run(name+" empty", func(t *testing.T) {
			env := maps.Clone(all)
			env[name] = ""
			if err := loadComposeEnv(t, env); err == nil {
				t.Fatalf("compose loaded with %s empty", name)
			}
		})
	}
}

// TestComposeDatabaseRoles: api, worker and consumer connect as the
// runtime role with its password; only migrate connects as the owner, and
// grants to the runtime role; the postgres service hands init.sh each
// password from the operator's variables; Temporal's come from there too.
func TestComposeDatabaseRoles(t *testing.T) {
	p := loadCompose(t, nil, nil)
	apps := appServices(t, p)
	if len(apps) < 4 {
		t.Fatalf("found only %d claimflow services: %v", len(apps), slices.Collect(maps.Keys(apps)))
	}
	checkURL := func(svc, key, raw, user, password string) {
		t.Helper()
		u, err := url.Parse(raw)
		if err != nil {
			t.Errorf("%s: %s: %v", svc, key, err)
			return
		}
		pw, _ := u.User.Password()
		if u.User.Username() != user || pw != password {
			t.Errorf("%s: %s connects as %q with password %q, want %q with %q", svc, key, u.User.Username(), pw, user, password)
		}
	}
	for svc, s := range apps {
		dbURL, hasDB := envValue(s, "DATABASE_URL")
		migrateURL, hasMigrate := envValue(s, "MIGRATE_DATABASE_URL")
		if svc == "migrate" {
			if !hasMigrate {
				t.Errorf("migrate: no MIGRATE_DATABASE_URL")
			}
			checkURL(svc, "MIGRATE_DATABASE_URL", migrateURL, config.DefaultOwnerRole, dbPasswords["CLAIMFLOW_PG_OWNER_PASSWORD"])
			if role, _ := envValue(s, "DATABASE_RUNTIME_ROLE"); role != config.DefaultRuntimeRole {
				t.Errorf("migrate grants to DATABASE_RUNTIME_ROLE=%q, want %q", role, config.DefaultRuntimeRole)
			}
			if hasDB {
				t.Errorf("migrate holds the runtime role's DATABASE_URL, which it does not need")
			}
			if slices.Contains(s.Command, "migrate") {
				continue
			}
			t.Errorf("migrate runs %v, not claimflow migrate", s.Command)
			continue
		}
		if hasMigrate {
			t.Errorf("%s holds the owner's MIGRATE_DATABASE_URL: only migrate may", svc)
		}
		if !hasDB {
			t.Errorf("%s: no DATABASE_URL", svc)
			continue
		}
		checkURL(svc, "DATABASE_URL", dbURL, config.DefaultRuntimeRole, dbPasswords["CLAIMFLOW_PG_APP_PASSWORD"])
		if slices.Contains(s.Command, "-migrate") || slices.Contains(s.Command, "--migrate") {
			t.Errorf("%s migrates on start (%v): the runtime role cannot", svc, s.Command)
		}
	}

	pg := p.Services["postgres"]
	for key, want := range map[string]string{
		"POSTGRES_PASSWORD":        dbPasswords["CLAIMFLOW_PG_PASSWORD"],
		"CLAIMFLOW_OWNER_PASSWORD": dbPasswords["CLAIMFLOW_PG_OWNER_PASSWORD"],
		"CLAIMFLOW_APP_PASSWORD":   dbPasswords["CLAIMFLOW_PG_APP_PASSWORD"],
		"TEMPORAL_DB_PASSWORD":     dbPasswords["CLAIMFLOW_PG_TEMPORAL_PASSWORD"],
	} {
		if got, _ := envValue(pg, key); got != want {
			t.Errorf("postgres: %s = %q, want the operator's %q", key, got, want)
		}
	}
	mounted := false
	for _, v := range pg.Volumes {
		if v.Type == types.VolumeTypeBind && strings.HasSuffix(v.Source, filepath.FromSlash("deploy/"+postgresInitScript)) &&
			strings.HasPrefix(v.Target, "/docker-entrypoint-initdb.d/") && strings.HasSuffix(v.Target, ".sh") {
			mounted = true
		}
	}
	if !mounted {
		t.Errorf("postgres does not run deploy/%s from /docker-entrypoint-initdb.d as a .sh script", postgresInitScript)
	}
	for svc, key := range map[string]string{"temporal": "POSTGRES_PWD", "temporal-schema": "SQL_PASSWORD"} {
		if got, _ := envValue(p.Services[svc], key); got != dbPasswords["CLAIMFLOW_PG_TEMPORAL_PASSWORD"] {
			t.Errorf("%s: %s = %q, want the operator's CLAIMFLOW_PG_TEMPORAL_PASSWORD", svc, key, got)
		}
	}
}

// TestPostgresInitHoldsNoPassword: the init script writes no password
// literally, creates the code's two roles, and reads each password it
// needs from the environment compose gives it.
func TestPostgresInitHoldsNoPassword(t *testing.T) {
	b, err := os.ReadFile(postgresInitScript)
	if err != nil {
		t.Fatal(err)
	}
	script := string(b)
	if m := regexp.MustCompile(`(?i)PASSWORD\s+'[^']*'`).FindString(script); m != "" {
		t.Errorf("%s writes a password literally: %s", postgresInitScript, m)
	}
	for _, role := range []string{config.DefaultOwnerRole, config.DefaultRuntimeRole} {
		if !regexp.MustCompile(`(?i)CREATE\s+ROLE\s+` + role + `\b[^;]*PASSWORD\s+:'`).MatchString(script) {
			t.Errorf("%s does not create role %s with a password from a psql variable", postgresInitScript, role)
		}
	}
	for _, v := range []string{"CLAIMFLOW_OWNER_PASSWORD", "CLAIMFLOW_APP_PASSWORD", "TEMPORAL_DB_PASSWORD"} {
		if !strings.Contains(script, "${"+v+":?") {
			t.Errorf("%s does not require %s", postgresInitScript, v)
		}
	}
	if matches, _ := filepath.Glob("postgres/*.sql"); len(matches) > 0 {
		t.Errorf("SQL files next to the init script: %v (the image would run them too)", matches)
	}
}

// psqlSubset runs the SQL that init.sh hands psql the way psql would, for
// machines without a PostgreSQL client: the --set variables from the
// environment, :'name' as a quoted literal, \connect, and statements ending
// in ";" at the end of a line.
func psqlSubset(ctx context.Context, t *testing.T, superURL string, env map[string]string) {
	t.Helper()
	b, err := os.ReadFile(postgresInitScript)
	if err != nil {
		t.Fatal(err)
	}
	script := string(b)
	vars := map[string]string{}
	for _, m := range regexp.MustCompile(`--set (\w+)="\$(\w+)"`).FindAllStringSubmatch(script, -1) {
		vars[m[1]] = env[m[2]]
	}
	_, body, ok := strings.Cut(script, "<<'SQL'\n")
	body, _, ok2 := strings.Cut(body, "\nSQL\n")
	if !ok || !ok2 || len(vars) < 3 {
		t.Fatalf("%s: no psql heredoc with its --set variables to run", postgresInitScript)
	}
	u, err := url.Parse(superURL)
	if err != nil {
		t.Fatal(err)
	}
	var conn *pgx.Conn
	connect := func(db string) {
		if conn != nil {
			conn.Close(ctx)
		}
		u.Path = "/" + db
		if conn, err = pgx.Connect(ctx, u.String()); err != nil {
			t.Fatalf("\\connect %s: %v", db, err)
		}
	}
	connect("postgres")
	defer func() { conn.Close(ctx) }()
	literal := regexp.MustCompile(`:'(\w+)'`)
	var stmt strings.Builder
	for _, line := range strings.Split(body, "\n") {
		line, _, _ = strings.Cut(line, "--")
		if db, ok := strings.CutPrefix(strings.TrimSpace(line), `\connect `); ok {
			connect(strings.TrimSpace(db))
			continue
		}
		stmt.WriteString(literal.ReplaceAllStringFunc(line, func(m string) string {
			return "'" + strings.ReplaceAll(vars[m[2:len(m)-1]], "'", "''") + "'"
		}) + "\n")
		if strings.HasSuffix(strings.TrimSpace(line), ";") {
			if _, err := conn.Exec(ctx, stmt.String()); err != nil {
				t.Fatalf("%s: %v", strings.TrimSpace(stmt.String()), err)
			}
			stmt.Reset()
		}
	}
}

// k8sEnvVar is an env entry with where its value comes from.
type k8sEnvVar struct {
	Name      string `yaml:"name"`
	Value     *string
	ValueFrom *struct {
		SecretKeyRef *struct {
			Name string `yaml:"name"`
			Key  string `yaml:"key"`
		} `yaml:"secretKeyRef"`
	} `yaml:"valueFrom"`
}

// TestK8sDatabaseSecrets: every database URL and password reaches a
// container through a secretKeyRef, never a literal; the owner's URL only
// reaches the migrate Job, from a secret the services do not read.
func TestK8sDatabaseSecrets(t *testing.T) {
	secretish := regexp.MustCompile(`(?i)(DATABASE_URL|PASSWORD|PASSWD|PWD)$`)
	credentials := regexp.MustCompile(`(?i)[a-z]+://[^/\s:@]+:[^@\s]+@`)
	ownerSecrets, serviceSecrets := map[string]bool{}, map[string]bool{}
	seen := 0
	files, err := filepath.Glob("k8s/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no k8s manifests: %v", err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "#") {
				continue // the comments' examples say PASSWORD
			}
			if m := credentials.FindString(line); m != "" {
				t.Errorf("%s: a URL with credentials: %s", f, m)
			}
		}
		dec := yaml.NewDecoder(strings.NewReader(string(b)))
		for {
			var doc struct {
				Kind string            `yaml:"kind"`
				Data map[string]string `yaml:"data"`
				Spec struct {
					Template struct {
						Spec struct {
							Containers []struct {
								Args []string
								Env  []k8sEnvVar
							} `yaml:"containers"`
							InitContainers []struct {
								Args []string
								Env  []k8sEnvVar
							} `yaml:"initContainers"`
						} `yaml:"spec"`
					} `yaml:"template"`
				} `yaml:"spec"`
			}
			if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			for key := range doc.Data {
				if secretish.MatchString(key) {
					t.Errorf("%s: %s %s holds %s: it belongs in a Secret, by secretKeyRef", f, doc.Kind, "data", key)
				}
			}
			containers := append(doc.Spec.Template.Spec.Containers, doc.Spec.Template.Spec.InitContainers...)
			for _, c := range containers {
				sub := ""
				if len(c.Args) > 0 {
					sub = c.Args[0]
				}
				for _, e := range c.Env {
					if !secretish.MatchString(e.Name) {
						continue
					}
					seen++
					where := fmt.Sprintf("%s (%s) env %s", f, sub, e.Name)
					if e.Value != nil || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
						t.Errorf("%s: not from a secretKeyRef", where)
						continue
					}
					ref := e.ValueFrom.SecretKeyRef
					if e.Name == "MIGRATE_DATABASE_URL" {
						if sub != "migrate" {
							t.Errorf("%s: only the migrate Job may hold the owner's URL", where)
						}
						ownerSecrets[ref.Name] = true
					} else {
						serviceSecrets[ref.Name] = true
					}
				}
			}
		}
	}
	if seen < 4 {
		t.Fatalf("found only %d database env entries in the k8s manifests", seen)
	}
	if len(ownerSecrets) == 0 {
		t.Error("no container gets MIGRATE_DATABASE_URL: the migrate Job must run as the owner")
	}
	for name := range ownerSecrets {
		if serviceSecrets[name] {
			t.Errorf("secret %s holds the owner's URL and is read by the services too", name)
		}
	}
}

// TestPostgresInitScript runs deploy/postgres/init.sh against a private
// cluster as the image would (with psql; where no psql is installed, its
// SQL through psqlSubset), then migrates as the owner it created and
// checks the runtime role it created: so the script, the migration's
// grants and the roles the code expects fit together.
func TestPostgresInitScript(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a private PostgreSQL cluster; skipped under -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp(os.Getenv("CLAIMFLOW_TEST_PG_ROOT"), "deploy-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	// Run as root, the cluster runs as the postgres system user.
	for d := dir; d != "/" && d != "."; d = filepath.Dir(d) {
		if d == filepath.Clean(os.TempDir()) {
			break
		}
		_ = os.Chmod(d, 0o755)
	}
	port, err := devstack.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	// Database "postgres": the script creates claimflow itself.
	pg, err := devstack.StartPostgres(ctx, devstack.PostgresOptions{DataDir: filepath.Join(dir, "pg"), Port: port, Database: "postgres"})
	if err != nil {
		t.Fatalf("start a private postgres: %v", err)
	}
	t.Cleanup(func() {
		if err := pg.Stop(context.WithoutCancel(ctx)); err != nil {
			t.Errorf("stop postgres: %v", err)
		}
	})
	super, err := url.Parse(pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"CLAIMFLOW_OWNER_PASSWORD": "owner pw 'quoted'", "CLAIMFLOW_APP_PASSWORD": "app-pw", "TEMPORAL_DB_PASSWORD": "temporal-pw"}
	if _, err := exec.LookPath("psql"); err == nil {
		cmd := exec.CommandContext(ctx, "sh", postgresInitScript)
		cmd.Env = append(os.Environ(),
			"PGHOST=127.0.0.1", fmt.Sprintf("PGPORT=%d", port), "POSTGRES_USER="+super.User.Username())
		for k, v := range env {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("sh %s: %v\n%s", postgresInitScript, err, out)
		}
	} else {
		t.Logf("no psql on PATH: running the script's SQL through psqlSubset")
		psqlSubset(ctx, t, pg.URL, env)
	}

	asRole := func(role string) string {
		return fmt.Sprintf("postgres://%s@127.0.0.1:%d/claimflow?sslmode=disable", role, port)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	owner, err := store.Open(ctx, asRole(config.DefaultOwnerRole), 2)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	var powers []bool
	if err := owner.QueryRow(ctx, `SELECT array_agg(rolsuper OR rolcreatedb OR rolcreaterole OR rolreplication OR rolbypassrls ORDER BY rolname)
		FROM pg_roles WHERE rolname = ANY($1)`, []string{config.DefaultOwnerRole, config.DefaultRuntimeRole, "temporal"}).Scan(&powers); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(powers, []bool{false, false, false}) {
		t.Errorf("roles' superuser/createdb/createrole/replication/bypassrls: %v, want none and three roles", powers)
	}
	if err := store.Migrate(ctx, owner, log); err != nil {
		t.Fatalf("migrate as %s: %v", config.DefaultOwnerRole, err)
	}
	if err := store.GrantRuntime(ctx, owner, config.DefaultRuntimeRole, log); err != nil {
		t.Fatalf("grant %s: %v", config.DefaultRuntimeRole, err)
	}
	app, err := store.Open(ctx, asRole(config.DefaultRuntimeRole), 2)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	if _, err := app.Exec(ctx, `INSERT INTO courses (id, title, capacity) VALUES ('init-sh', 'init.sh', 1)`); err != nil {
		t.Fatalf("the runtime role cannot insert a course: %v", err)
	}
	for _, stmt := range []string{"TRUNCATE courses", "DROP TABLE courses", "ALTER TABLE courses ADD COLUMN x int", "CREATE TABLE x (id int)", "CREATE TEMP TABLE x (id int)"} {
		_, err := app.Exec(ctx, stmt)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
			t.Errorf("%s as %s: err = %v, want insufficient_privilege", stmt, config.DefaultRuntimeRole, err)
		}
	}
}
