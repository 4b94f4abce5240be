package config

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestLoadSecurityDefaults(t *testing.T) {
	for _, v := range []string{"AUTH_MODE", "JWT_SECRET", "JWKS_URL", "JWT_ROLE_CLAIM", "RATE_LIMIT_PER_SUBJECT", "RATE_LIMIT_BURST", "RATE_LIMIT_ADMIN",
		"READ_RATE_LIMIT_PER_SUBJECT", "READ_RATE_LIMIT_BURST", "MAX_CONFIRM_WAITERS", "MAX_INFLIGHT_CLAIMS", "REQUEST_TIMEOUT", "INTERNAL_HTTP_ADDR"} {
		t.Setenv(v, "")
	}
	cfg, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	s := cfg.Security
	if s.AuthMode != AuthHS256 || s.InsecureNoAuth || s.RatePerSubject != defaultRatePerSubject ||
		s.RateBurst != defaultRateBurst || s.AdminRate != 0 || s.MaxInflightClaims != DefaultMaxInflightClaims ||
		s.RoleClaim != DefaultRoleClaim || s.ReadRate != defaultReadRate || s.ReadBurst != defaultReadBurst ||
		s.MaxConfirmWaiters != DefaultConfirmWaiters {
		t.Fatalf("defaults = %+v", s)
	}
	if cfg.RequestTimeout.String() != DefaultRequestTimeout || cfg.InternalHTTPAddr != "" {
		t.Fatalf("REQUEST_TIMEOUT = %s, INTERNAL_HTTP_ADDR = %q", cfg.RequestTimeout, cfg.InternalHTTPAddr)
	}
	for name, value := range map[string]string{"AUTH_MODE": "none", "RATE_LIMIT_PER_SUBJECT": "-1", "RATE_LIMIT_BURST": "0",
		"RATE_LIMIT_ADMIN": "x", "MAX_INFLIGHT_CLAIMS": "0", "JWT_ROLE_CLAIM": "  ", "READ_RATE_LIMIT_PER_SUBJECT": "-2",
		"READ_RATE_LIMIT_BURST": "0", "MAX_CONFIRM_WAITERS": "-1", "REQUEST_TIMEOUT": "10ms"} {
		t.Run(name, func(t *testing.T) {
			t.Setenv(name, value)
			if _, err := Load(); err == nil || !strings.Contains(err.Error(), name) {
				t.Fatalf("%s=%s: err = %v", name, value, err)
			}
		})
	}
}

// TestNamesAreWhatLoadReads: Load asks for every listed variable and for
// no other, so Names (which the deployment tests check compose and k8s
// against) is the whole list.
func TestNamesAreWhatLoadReads(t *testing.T) {
	var asked []string
	if _, err := load(func(name string) (string, bool) {
		asked = append(asked, name)
		return "", false
	}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(asked)
	asked = slices.Compact(asked)
	names := Names()
	slices.Sort(names)
	if !slices.Equal(asked, names) {
		t.Fatalf("Load reads %v, Names lists %v", asked, names)
	}
	for _, name := range names {
		if !strings.Contains(Usage(), name) {
			t.Errorf("Usage does not describe %s", name)
		}
	}
}

func TestDefaultsParse(t *testing.T) {
	cfg, err := load(func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ClaimBatchMax != DefaultClaimBatchMax || cfg.ClaimDesks != DefaultClaimDesks ||
		cfg.ClaimBatchAttrBytes != DefaultClaimBatchAttrBytes || cfg.ConsumerBatch != DefaultConsumerBatch ||
		cfg.RecoveryAfter != DefaultRecoveryAfter || cfg.RecoveryEvery != DefaultRecoveryEvery {
		t.Fatalf("defaults = %+v", cfg)
	}
	if cfg.IsSet("DATABASE_URL") {
		t.Fatal("an unset variable counts as set")
	}
	cfg, err = load(func(name string) (string, bool) {
		return map[string]string{"DATABASE_URL": "postgres://x/y"}[name], name == "DATABASE_URL"
	})
	if err != nil || !cfg.IsSet("DATABASE_URL") || cfg.DatabaseURL != "postgres://x/y" {
		t.Fatalf("DATABASE_URL given: %+v %v", cfg, err)
	}
}

func TestRedactURL(t *testing.T) {
	for raw, want := range map[string]string{
		"postgres://app:s3cret@db:5432/claimflow?sslmode=disable": "postgres://app:xxxxx@db:5432/claimflow?sslmode=disable",
		"postgres://app@db/claimflow?password=s3cret":             "postgres://app@db/claimflow?password=xxxxx",
		"postgres://claimflow@127.0.0.1:55432/claimflow":          "postgres://claimflow@127.0.0.1:55432/claimflow",
		"host=db user=app password=s3cret":                        "(redacted)",
	} {
		if got := RedactURL(raw); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", raw, got, want)
		}
	}
}

func TestStackSecret(t *testing.T) {
	dir := t.TempDir()
	sec := Security{AuthMode: AuthHS256}
	if err := EnsureStackSecret(&sec, dir); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, SecretFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("secret file: %v %v", fi, err)
	}
	again := Security{AuthMode: AuthHS256}
	if err := EnsureStackSecret(&again, dir); err != nil || again.JWTSecret != sec.JWTSecret || len(sec.JWTSecret) < 32 {
		t.Fatalf("second start read %q (err %v), first wrote %q", again.JWTSecret, err, sec.JWTSecret)
	}
	fromEnv := Security{AuthMode: AuthHS256, JWTSecret: "from-the-environment-from-the-environment"}
	if err := EnsureStackSecret(&fromEnv, t.TempDir()); err != nil || fromEnv.JWTSecret != "from-the-environment-from-the-environment" {
		t.Fatal("JWT_SECRET did not win over the data dir")
	}
}

// TestDatabaseRoles: which URL migrates and which role it grants to, for
// the dev defaults, an operator's two roles, and one role for everything.
func TestDatabaseRoles(t *testing.T) {
	for _, tc := range []struct {
		name             string
		env              map[string]string
		migrate, runtime string
		err              string
	}{
		{name: "dev defaults", env: nil,
			migrate: "postgres://claimflow_owner@127.0.0.1:55432/claimflow?sslmode=disable", runtime: DefaultRuntimeRole},
		{name: "two roles", env: map[string]string{
			"DATABASE_URL":         "postgres://app:pw@db/claimflow",
			"MIGRATE_DATABASE_URL": "postgres://owner:pw@db/claimflow"},
			migrate: "postgres://owner:pw@db/claimflow", runtime: "app"},
		{name: "one role: DATABASE_URL migrates too", env: map[string]string{
			"DATABASE_URL": "postgres://single:pw@db/claimflow"},
			migrate: "postgres://single:pw@db/claimflow", runtime: "single"},
		{name: "role named", env: map[string]string{
			"DATABASE_URL": "host=db user=app", "DATABASE_RUNTIME_ROLE": "svc_rt"},
			migrate: "host=db user=app", runtime: "svc_rt"},
		{name: "key=value URL, no role", env: map[string]string{"DATABASE_URL": "host=db user=app"},
			migrate: "host=db user=app", runtime: ""},
		{name: "role not an identifier", env: map[string]string{"DATABASE_RUNTIME_ROLE": `app"; DROP`},
			err: "DATABASE_RUNTIME_ROLE"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := load(func(name string) (string, bool) { v, ok := tc.env[name]; return v, ok })
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want one naming %s", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.MigrateDatabaseURL != tc.migrate || cfg.RuntimeRole != tc.runtime {
				t.Fatalf("migrate %q as %q, want %q as %q", cfg.MigrateDatabaseURL, cfg.RuntimeRole, tc.migrate, tc.runtime)
			}
		})
	}
}

// TestOneVariable: TEMPORAL_GRPC_COMPRESSION, KAFKA_LINGER, JWT_MAX_TTL,
// JWT_ROLE_MAP and MAX_INFLIGHT_CLAIMS_PER_SUBJECT, their defaults and the
// one-line errors that name the variable.
func TestOneVariable(t *testing.T) {
	for _, tc := range []struct {
		name, value string
		wantErr     string // "": loads
		check       func(Config) bool
	}{
		{"TEMPORAL_GRPC_COMPRESSION", "", "", func(c Config) bool { return c.TemporalCompression == "gzip" }},
		{"TEMPORAL_GRPC_COMPRESSION", "gzip", "", func(c Config) bool { return c.TemporalCompression == "gzip" }},
		{"TEMPORAL_GRPC_COMPRESSION", "none", "", func(c Config) bool { return c.TemporalCompression == "none" }},
		{"TEMPORAL_GRPC_COMPRESSION", "zstd", "TEMPORAL_GRPC_COMPRESSION must be gzip or none", nil},
		{"KAFKA_LINGER", "", "", func(c Config) bool { return c.KafkaLinger == time.Millisecond }},
		{"KAFKA_LINGER", "0", "", func(c Config) bool { return c.KafkaLinger == 0 }},
		{"KAFKA_LINGER", "5ms", "", func(c Config) bool { return c.KafkaLinger == 5*time.Millisecond }},
		{"KAFKA_LINGER", "-1ms", "KAFKA_LINGER must be a duration from 0 to 1s", nil},
		{"KAFKA_LINGER", "2s", "KAFKA_LINGER must be a duration from 0 to 1s", nil},
		{"KAFKA_LINGER", "soon", `KAFKA_LINGER must be a duration from 0 to 1s, got "soon"`, nil},
		{"JWT_MAX_TTL", "", "", func(c Config) bool { return c.Security.MaxTTL == 24*time.Hour }},
		{"JWT_MAX_TTL", "8h", "", func(c Config) bool { return c.Security.MaxTTL == 8*time.Hour }},
		{"JWT_MAX_TTL", "0", "JWT_MAX_TTL", nil},
		{"JWT_MAX_TTL", "-1h", "JWT_MAX_TTL", nil},
		{"JWT_MAX_TTL", "forever", "JWT_MAX_TTL", nil},
		{"MAX_INFLIGHT_CLAIMS_PER_SUBJECT", "", "", func(c Config) bool { return c.Security.MaxInflightPerSubject == 64 }},
		{"MAX_INFLIGHT_CLAIMS_PER_SUBJECT", "0", "", func(c Config) bool { return c.Security.MaxInflightPerSubject == 0 }},
		{"MAX_INFLIGHT_CLAIMS_PER_SUBJECT", "5", "", func(c Config) bool { return c.Security.MaxInflightPerSubject == 5 }},
		{"MAX_INFLIGHT_CLAIMS_PER_SUBJECT", "-1", "MAX_INFLIGHT_CLAIMS_PER_SUBJECT", nil},
		{"MAX_INFLIGHT_CLAIMS_PER_SUBJECT", "many", "MAX_INFLIGHT_CLAIMS_PER_SUBJECT", nil},
		{"JWT_ROLE_MAP", "", "", func(c Config) bool { return len(c.Security.RoleMap) == 0 }},
		{"JWT_ROLE_MAP", "registrar=admin,Admin=admin", "", func(c Config) bool {
			return len(c.Security.RoleMap) == 2 && c.Security.RoleMap["registrar"] == "admin" && c.Security.RoleMap["Admin"] == "admin"
		}},
		{"JWT_ROLE_MAP", " user = student , shop=vendor ,", "", func(c Config) bool {
			return len(c.Security.RoleMap) == 2 && c.Security.RoleMap["user"] == "student" && c.Security.RoleMap["shop"] == "vendor"
		}},
		{"JWT_ROLE_MAP", "registrar=root", `JWT_ROLE_MAP: "registrar=root" maps "registrar" to "root"`, nil},
		{"JWT_ROLE_MAP", "registrar=Admin", "JWT_ROLE_MAP", nil},
		{"JWT_ROLE_MAP", "registrar", "JWT_ROLE_MAP", nil},
		{"JWT_ROLE_MAP", "=admin", "JWT_ROLE_MAP", nil},
		{"JWT_ROLE_MAP", "a=admin,a=vendor", "JWT_ROLE_MAP", nil},
		{"JWT_ROLE_MAP", "vendor=admin", "JWT_ROLE_MAP", nil},
	} {
		t.Run(tc.name+"="+tc.value, func(t *testing.T) {
			cfg, err := load(func(name string) (string, bool) {
				if name == tc.name {
					return tc.value, true
				}
				return "", false
			})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || strings.Contains(err.Error(), "\n") {
					t.Fatalf("err = %v, want one line with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !tc.check(cfg) {
				t.Fatalf("%+v %v", cfg, err)
			}
		})
	}
}
