package main

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/claimflow/claimflow/api"
)

func TestLoadSecurityDefaults(t *testing.T) {
	for _, v := range []string{"AUTH_MODE", "JWT_SECRET", "JWKS_URL", "RATE_LIMIT_PER_SUBJECT", "RATE_LIMIT_BURST", "RATE_LIMIT_ADMIN", "MAX_INFLIGHT_CLAIMS"} {
		t.Setenv(v, "")
	}
	cfg, err := loadConfig()
	if err != nil {
		t.Fatal(err)
	}
	s := cfg.Security
	if s.AuthMode != authHS256 || s.InsecureNoAuth || s.RatePerSubject != defaultRatePerSubject ||
		s.RateBurst != defaultRateBurst || s.AdminRate != 0 || s.MaxInflightClaims != defaultMaxInflightClaims {
		t.Fatalf("defaults = %+v", s)
	}
	for name, value := range map[string]string{"AUTH_MODE": "none", "RATE_LIMIT_PER_SUBJECT": "-1", "RATE_LIMIT_BURST": "0",
		"RATE_LIMIT_ADMIN": "x", "MAX_INFLIGHT_CLAIMS": "0"} {
		t.Run(name, func(t *testing.T) {
			t.Setenv(name, value)
			if _, err := loadConfig(); err == nil || !strings.Contains(err.Error(), name) {
				t.Fatalf("%s=%s: err = %v", name, value, err)
			}
		})
	}
}

func TestAPISecurityNeverDefaultsToOff(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	for _, tc := range []struct {
		name string
		s    securityConfig
		want string
	}{
		{"hs256 without secret", securityConfig{AuthMode: authHS256}, "needs JWT_SECRET"},
		{"short secret", securityConfig{AuthMode: authHS256, JWTSecret: "short"}, "at least 32 bytes"},
		{"jwks without URL", securityConfig{AuthMode: authJWKS}, "needs JWKS_URL"},
		{"jwks with a file URL", securityConfig{AuthMode: authJWKS, JWKSURL: "file:///keys"}, "http(s)"},
		{"off without the flag", securityConfig{AuthMode: authOff}, "--insecure-no-auth"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := tc.s.apiSecurity(log); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
	sec, err := securityConfig{AuthMode: authOff, InsecureNoAuth: true}.apiSecurity(log)
	if err != nil || !sec.InsecureNoAuth {
		t.Fatalf("the flag did not switch auth off: %+v %v", sec, err)
	}
	sec, err = securityConfig{AuthMode: authJWKS, JWKSURL: "https://idp.example/jwks", MaxInflightClaims: 7}.apiSecurity(log)
	if err != nil || sec.Auth == nil || sec.MaxInflightClaims != 7 {
		t.Fatalf("jwks: %+v %v", sec, err)
	}
}

func TestSecretsStayOutOfLogs(t *testing.T) {
	const secret = "0123456789abcdef0123456789abcdef-do-not-log"
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if _, err := (securityConfig{AuthMode: authHS256, JWTSecret: secret}).apiSecurity(log); err != nil {
		t.Fatal(err)
	}
	if _, err := (securityConfig{AuthMode: authJWKS, JWKSURL: "https://user:pw-do-not-log@idp.example/jwks"}).apiSecurity(log); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(buf.String(), "do-not-log") {
		t.Fatalf("a secret reached the log: %s", buf.String())
	}
	for raw, want := range map[string]string{
		"postgres://app:s3cret@db:5432/claimflow?sslmode=disable": "postgres://app:xxxxx@db:5432/claimflow?sslmode=disable",
		"postgres://app@db/claimflow?password=s3cret":             "postgres://app@db/claimflow?password=xxxxx",
		"postgres://claimflow@127.0.0.1:55432/claimflow":          "postgres://claimflow@127.0.0.1:55432/claimflow",
		"host=db user=app password=s3cret":                        "(redacted)",
	} {
		if got := redactURL(raw); got != want {
			t.Errorf("redactURL(%q) = %q, want %q", raw, got, want)
		}
	}
	s := &stack{API: &apiService{Addr: "127.0.0.1:1"}, Config: config{DatabaseURL: "postgres://app:s3cret@db/claimflow"}}
	if line := s.readyLine(); strings.Contains(line, "s3cret") {
		t.Fatalf("ready line shows the password: %s", line)
	}
}

func TestStackSecretAndTokenCommand(t *testing.T) {
	dir := t.TempDir()
	sec := securityConfig{AuthMode: authHS256}
	if err := ensureStackSecret(&sec, dir); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, secretFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("secret file: %v %v", fi, err)
	}
	again := securityConfig{AuthMode: authHS256}
	if err := ensureStackSecret(&again, dir); err != nil || again.JWTSecret != sec.JWTSecret || len(sec.JWTSecret) < 32 {
		t.Fatalf("second start read %q (err %v), first wrote %q", again.JWTSecret, err, sec.JWTSecret)
	}
	fromEnv := securityConfig{AuthMode: authHS256, JWTSecret: "from-the-environment-from-the-environment"}
	if err := ensureStackSecret(&fromEnv, t.TempDir()); err != nil || fromEnv.JWTSecret != "from-the-environment-from-the-environment" {
		t.Fatal("JWT_SECRET did not win over the data dir")
	}

	auth, err := api.NewHS256([]byte(sec.JWTSecret), api.JWTOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mint := func(args ...string) (api.Principal, error) {
		var out bytes.Buffer
		cfg := config{Security: securityConfig{AuthMode: authHS256}}
		if err := runToken(context.Background(), cfg, nil, append(args, "--data-dir", dir), &out); err != nil {
			return api.Principal{}, err
		}
		return auth.Authenticate(context.Background(), strings.TrimSpace(out.String()))
	}
	if p, err := mint("--sub", "s-1"); err != nil || p != (api.Principal{Subject: "s-1"}) {
		t.Fatalf("student token: %+v %v", p, err)
	}
	if p, err := mint("--sub", "ops", "--role", "admin", "--ttl", "5m"); err != nil || !p.Admin() || p.Subject != "ops" {
		t.Fatalf("admin token: %+v %v", p, err)
	}
	for _, args := range [][]string{{}, {"--sub", "a b"}, {"--sub", "s-1", "--role", "root"}, {"--sub", "s-1", "--ttl", "-1h"}} {
		if _, err := mint(args...); err == nil {
			t.Errorf("token %v succeeded", args)
		}
	}
	var out bytes.Buffer
	err = runToken(context.Background(), config{Security: securityConfig{AuthMode: authHS256}}, nil,
		[]string{"--sub", "s-1", "--data-dir", t.TempDir()}, &out)
	if err == nil || !strings.Contains(err.Error(), "claimflow dev") {
		t.Fatalf("token without any secret: %v", err)
	}
	err = runToken(context.Background(), config{Security: securityConfig{AuthMode: authJWKS}}, nil, []string{"--sub", "s-1"}, &out)
	if err == nil || !strings.Contains(err.Error(), "identity provider") {
		t.Fatalf("token in jwks mode: %v", err)
	}
	// mintToken, for tools: an expired token is refused by the API.
	tok, err := mintToken(sec.JWTSecret, "bench", api.RoleAdmin, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if p, err := auth.Authenticate(context.Background(), tok); err != nil || !p.Admin() {
		t.Fatalf("mintToken: %+v %v", p, err)
	}
}
