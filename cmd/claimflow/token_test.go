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

// TestTokenLifetimeIsBoundedWhenMinting: `claimflow token` refuses a --ttl
// beyond JWT_MAX_TTL (24h unless set) with an error naming both, and what
// it mints within the bound the API accepts under the same bound.
func TestTokenLifetimeIsBoundedWhenMinting(t *testing.T) {
	dir := t.TempDir()
	sec := appconfig.Security{AuthMode: appconfig.AuthHS256}
	if err := appconfig.EnsureStackSecret(&sec, dir); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		maxTTL  time.Duration // JWT_MAX_TTL; 0: unset in the Config (the default)
		ttl     string
		wantErr string // "": minted and accepted
	}{
		{"the default --ttl", 0, "", ""},
		{"a day, the default bound", 0, "24h", ""},
		{"ten years of admin", 0, "87600h", "--ttl 87600h0m0s exceeds JWT_MAX_TTL (24h0m0s)"},
		{"a second beyond the default", 0, "24h0m1s", "exceeds JWT_MAX_TTL"},
		{"two days under JWT_MAX_TTL=72h", 72 * time.Hour, "48h", ""},
		{"four days under JWT_MAX_TTL=72h", 72 * time.Hour, "96h", "--ttl 96h0m0s exceeds JWT_MAX_TTL (72h0m0s)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := appconfig.Config{Security: appconfig.Security{AuthMode: appconfig.AuthHS256, MaxTTL: tc.maxTTL}}
			args := []string{"--sub", "ops", "--role", "admin", "--data-dir", dir}
			if tc.ttl != "" {
				args = append(args, "--ttl", tc.ttl)
			}
			var out bytes.Buffer
			err := runToken(context.Background(), cfg, nil, args, &out)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("token %v: err = %v, want %q", args, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("token %v: %v", args, err)
			}
			auth, err := api.NewHS256([]byte(sec.JWTSecret), api.JWTOptions{MaxTTL: tc.maxTTL})
			if err != nil {
				t.Fatal(err)
			}
			if p, err := auth.Authenticate(context.Background(), strings.TrimSpace(out.String())); err != nil || !p.Admin() {
				t.Fatalf("the API refuses the minted token: %+v %v", p, err)
			}
		})
	}
}
