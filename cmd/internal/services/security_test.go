package services

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/claimflow/claimflow/internal/config"
)

func TestAPISecurityNeverDefaultsToOff(t *testing.T) {
	const idp = "https://idp.example"
	log := slog.New(slog.DiscardHandler)
	for _, tc := range []struct {
		name string
		s    config.Security
		want string
	}{
		{"hs256 without secret", config.Security{AuthMode: config.AuthHS256}, "needs JWT_SECRET"},
		{"short secret", config.Security{AuthMode: config.AuthHS256, JWTSecret: "short"}, "at least 32 bytes"},
		{"jwks without URL", config.Security{AuthMode: config.AuthJWKS}, "needs JWKS_URL"},
		{"jwks with a file URL", config.Security{AuthMode: config.AuthJWKS, JWKSURL: "file:///keys", Issuer: idp, Audience: "claimflow"}, "https"},
		{"jwks over http", config.Security{AuthMode: config.AuthJWKS, JWKSURL: "http://idp.example/jwks", Issuer: idp, Audience: "claimflow"}, "https"},
		{"jwks without issuer", config.Security{AuthMode: config.AuthJWKS, JWKSURL: idp + "/jwks", Audience: "claimflow"}, "needs JWT_ISSUER:"},
		{"jwks without audience", config.Security{AuthMode: config.AuthJWKS, JWKSURL: idp + "/jwks", Issuer: idp}, "needs JWT_AUDIENCE:"},
		{"jwks without either", config.Security{AuthMode: config.AuthJWKS, JWKSURL: idp + "/jwks"}, "needs JWT_ISSUER and JWT_AUDIENCE"},
		{"off without the flag", config.Security{AuthMode: config.AuthOff}, "--insecure-no-auth"},
		{"a role map onto an unknown role", config.Security{AuthMode: config.AuthHS256, JWTSecret: strings.Repeat("s", 32),
			RoleMap: map[string]string{"registrar": "root"}}, "JWT_ROLE_MAP"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := APISecurity(tc.s, log); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
	sec, err := APISecurity(config.Security{AuthMode: config.AuthOff, InsecureNoAuth: true}, log)
	if err != nil || !sec.InsecureNoAuth {
		t.Fatalf("the flag did not switch auth off: %+v %v", sec, err)
	}
	sec, err = APISecurity(config.Security{AuthMode: config.AuthJWKS, JWKSURL: idp + "/jwks", Issuer: idp, Audience: "claimflow",
		RoleClaim: "claimflow_role", MaxInflightClaims: 7, ReadRate: 3, ReadBurst: 4, MaxConfirmWaiters: 5, MaxInflightPerSubject: 6}, log)
	if err != nil || sec.Auth == nil || sec.MaxInflightClaims != 7 || sec.ReadRatePerSubject != 3 || sec.ReadBurst != 4 || sec.MaxConfirmWaiters != 5 ||
		sec.MaxInflightClaimsPerSubject != 6 {
		t.Fatalf("jwks: %+v %v", sec, err)
	}
}

func TestSecretsStayOutOfLogs(t *testing.T) {
	const secret = "0123456789abcdef0123456789abcdef-do-not-log"
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if _, err := APISecurity(config.Security{AuthMode: config.AuthHS256, JWTSecret: secret}, log); err != nil {
		t.Fatal(err)
	}
	if _, err := APISecurity(config.Security{AuthMode: config.AuthJWKS, JWKSURL: "https://user:pw-do-not-log@idp.example/jwks",
		Issuer: "https://idp.example", Audience: "claimflow"}, log); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(buf.String(), "do-not-log") {
		t.Fatalf("a secret reached the log: %s", buf.String())
	}
	s := &Stack{API: &APIService{Addr: "127.0.0.1:1"}, Config: config.Config{DatabaseURL: "postgres://app:s3cret@db/claimflow"}}
	if line := s.ReadyLine(); strings.Contains(line, "s3cret") {
		t.Fatalf("ready line shows the password: %s", line)
	}
}
