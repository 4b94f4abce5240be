package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/claimflow/claimflow/api"
	appconfig "github.com/claimflow/claimflow/internal/config"
)

// TestTokenCommand: `claimflow token` signs with the stack secret, and
// refuses what the API would refuse.
func TestTokenCommand(t *testing.T) {
	dir := t.TempDir()
	sec := appconfig.Security{AuthMode: appconfig.AuthHS256}
	if err := appconfig.EnsureStackSecret(&sec, dir); err != nil {
		t.Fatal(err)
	}

	auth, err := api.NewHS256([]byte(sec.JWTSecret), api.JWTOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mint := func(args ...string) (api.Principal, error) {
		var out bytes.Buffer
		cfg := appconfig.Config{Security: appconfig.Security{AuthMode: appconfig.AuthHS256}}
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
	err = runToken(context.Background(), appconfig.Config{Security: appconfig.Security{AuthMode: appconfig.AuthHS256}}, nil,
		[]string{"--sub", "s-1", "--data-dir", t.TempDir()}, &out)
	if err == nil || !strings.Contains(err.Error(), "claimflow dev") {
		t.Fatalf("token without any secret: %v", err)
	}
	err = runToken(context.Background(), appconfig.Config{Security: appconfig.Security{AuthMode: appconfig.AuthJWKS}}, nil, []string{"--sub", "s-1"}, &out)
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
