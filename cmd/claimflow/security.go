package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/claimflow/claimflow/api"
)

// Auth modes (AUTH_MODE).
const (
	authHS256 = "hs256" // JWT_SECRET; the local stack's default
	authJWKS  = "jwks"  // RS256 against JWKS_URL; production
	authOff   = "off"   // only together with --insecure-no-auth
)

// Defaults of the load limits.
const (
	defaultRatePerSubject = 50
	defaultRateBurst      = 100
	// Above what group commit holds at once (CLAIM_BATCH_INFLIGHT ×
	// CLAIM_BATCH_MAX plus the next batch forming), so the bound sheds a
	// true overload rather than a healthy burst.
	defaultMaxInflightClaims = 8192
)

// secretFile is where `claimflow dev` keeps the HS256 secret it generated.
const secretFile = "jwt-secret"

// securityConfig is how the API authenticates and limits (see README,
// "Authentication and limits").
type securityConfig struct {
	AuthMode  string
	JWTSecret string
	JWKSURL   string
	Issuer    string
	Audience  string
	// InsecureNoAuth is set by the --insecure-no-auth flag only.
	InsecureNoAuth bool
	// RatePerSubject and RateBurst limit a non-admin subject's writes;
	// AdminRate limits an admin's (0: not limited).
	RatePerSubject float64
	RateBurst      int
	AdminRate      float64
	// MaxInflightClaims bounds requests waiting on Temporal at once.
	MaxInflightClaims int
}

// loadSecurity reads the security variables; whether the mode has what it
// needs is checked only by the commands that serve the API.
func loadSecurity(c *config) error {
	s := &c.Security
	s.AuthMode = strings.ToLower(env("AUTH_MODE", authHS256))
	switch s.AuthMode {
	case authHS256, authJWKS, authOff:
	default:
		return fmt.Errorf("AUTH_MODE must be hs256, jwks or off, got %q", s.AuthMode)
	}
	s.JWTSecret = os.Getenv("JWT_SECRET")
	s.JWKSURL = os.Getenv("JWKS_URL")
	s.Issuer = os.Getenv("JWT_ISSUER")
	s.Audience = os.Getenv("JWT_AUDIENCE")
	var err error
	if s.RatePerSubject, err = strconv.ParseFloat(env("RATE_LIMIT_PER_SUBJECT", strconv.Itoa(defaultRatePerSubject)), 64); err != nil || s.RatePerSubject < 0 {
		return fmt.Errorf("RATE_LIMIT_PER_SUBJECT must be requests per second (0: unlimited), got %q", os.Getenv("RATE_LIMIT_PER_SUBJECT"))
	}
	if s.RateBurst, err = strconv.Atoi(env("RATE_LIMIT_BURST", strconv.Itoa(defaultRateBurst))); err != nil || s.RateBurst < 1 {
		return fmt.Errorf("RATE_LIMIT_BURST must be a positive integer, got %q", os.Getenv("RATE_LIMIT_BURST"))
	}
	if s.AdminRate, err = strconv.ParseFloat(env("RATE_LIMIT_ADMIN", "0"), 64); err != nil || s.AdminRate < 0 {
		return fmt.Errorf("RATE_LIMIT_ADMIN must be requests per second (0: admins unlimited), got %q", os.Getenv("RATE_LIMIT_ADMIN"))
	}
	if s.MaxInflightClaims, err = strconv.Atoi(env("MAX_INFLIGHT_CLAIMS", strconv.Itoa(defaultMaxInflightClaims))); err != nil || s.MaxInflightClaims < 1 {
		return fmt.Errorf("MAX_INFLIGHT_CLAIMS must be a positive integer, got %q", os.Getenv("MAX_INFLIGHT_CLAIMS"))
	}
	return nil
}

// apiSecurity builds the API's security from the configuration; it fails
// when the chosen mode lacks what it needs, so a misconfigured API never
// serves unauthenticated.
func (s securityConfig) apiSecurity(log *slog.Logger) (api.Security, error) {
	sec := api.Security{
		RatePerSubject:      s.RatePerSubject,
		RateBurst:           s.RateBurst,
		AdminRatePerSubject: s.AdminRate,
		MaxInflightClaims:   s.MaxInflightClaims,
	}
	opts := api.JWTOptions{Issuer: s.Issuer, Audience: s.Audience}
	var err error
	switch {
	case s.InsecureNoAuth:
		sec.InsecureNoAuth = true // the API logs a loud warning
		return sec, nil
	case s.AuthMode == authOff:
		return sec, errors.New("AUTH_MODE=off needs the explicit --insecure-no-auth flag")
	case s.AuthMode == authJWKS:
		if s.JWKSURL == "" {
			return sec, errors.New("AUTH_MODE=jwks needs JWKS_URL")
		}
		sec.Auth, err = api.NewJWKS(s.JWKSURL, api.JWKSOptions{JWTOptions: opts})
		if err != nil {
			return sec, fmt.Errorf("JWKS_URL: %w", err)
		}
		log.Info("API authenticates RS256 tokens", "jwks_url", redactURL(s.JWKSURL), "issuer", s.Issuer, "audience", s.Audience)
	default:
		if s.JWTSecret == "" {
			return sec, errors.New("AUTH_MODE=hs256 needs JWT_SECRET (at least 32 bytes); or set AUTH_MODE=jwks with JWKS_URL")
		}
		sec.Auth, err = api.NewHS256([]byte(s.JWTSecret), opts)
		if err != nil {
			return sec, fmt.Errorf("JWT_SECRET: %w", err)
		}
		log.Info("API authenticates HS256 tokens", "issuer", s.Issuer, "audience", s.Audience)
	}
	return sec, nil
}

// ensureStackSecret gives the local stack an HS256 secret: JWT_SECRET if
// set, else the one in <dataDir>/jwt-secret, generated on first run.
func ensureStackSecret(s *securityConfig, dataDir string) error {
	if s.InsecureNoAuth || s.AuthMode != authHS256 || s.JWTSecret != "" {
		return nil
	}
	secret, err := readSecretFile(dataDir)
	if errors.Is(err, fs.ErrNotExist) {
		buf := make([]byte, 32)
		if _, err := rand.Read(buf); err != nil {
			return err
		}
		secret = hex.EncodeToString(buf)
		if err := os.WriteFile(filepath.Join(dataDir, secretFile), []byte(secret+"\n"), 0o600); err != nil {
			return fmt.Errorf("write the JWT secret: %w", err)
		}
	} else if err != nil {
		return err
	}
	s.JWTSecret = secret
	return nil
}

func readSecretFile(dataDir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, secretFile))
	if err != nil {
		return "", err
	}
	secret := strings.TrimSpace(string(b))
	if secret == "" {
		return "", fmt.Errorf("%s is empty", filepath.Join(dataDir, secretFile))
	}
	return secret, nil
}

// printAuthHint tells the person running `claimflow dev` how to get a token.
func printAuthHint(w io.Writer, s *stack) {
	sec := s.Config.Security
	switch {
	case sec.InsecureNoAuth:
		fmt.Fprintln(w, "WARNING: authentication is OFF (--insecure-no-auth); every request acts as an admin")
	case sec.AuthMode == authHS256:
		fmt.Fprintf(w, "auth: every /v1 request needs a bearer token (HS256, secret in %s or JWT_SECRET); mint one:\n"+
			"  TOKEN=$(go run ./cmd/claimflow token --data-dir %s --sub admin-1 --role admin)   # an operator\n"+
			"  go run ./cmd/claimflow token --data-dir %s --sub s-1                            # student s-1\n",
			filepath.Join(s.opts.DataDir, secretFile), s.opts.DataDir, s.opts.DataDir)
	default:
		fmt.Fprintf(w, "auth: RS256 tokens from %s\n", redactURL(sec.JWKSURL))
	}
}

// redactURL hides a password in a URL (postgres://user:pw@host/db or
// ?password=pw) so it can be printed or logged.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" {
		if strings.Contains(raw, "@") || strings.Contains(strings.ToLower(raw), "password") {
			return "(redacted)"
		}
		return raw
	}
	if q := u.Query(); q.Has("password") {
		q.Set("password", "xxxxx")
		u.RawQuery = q.Encode()
	}
	return u.Redacted()
}
