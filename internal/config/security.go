package config

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Auth modes (AUTH_MODE).
const (
	AuthHS256 = "hs256" // JWT_SECRET; the local stack's default
	AuthJWKS  = "jwks"  // RS256 against JWKS_URL; production
	AuthOff   = "off"   // only together with --insecure-no-auth
)

const (
	// DefaultJWTMaxTTL is the longest token lifetime (exp - iat) the API
	// accepts and `claimflow token` mints: a leaked token is good for a
	// day at most.
	DefaultJWTMaxTTL = 24 * time.Hour
	// DefaultMaxInflightPerSubject bounds one non-admin subject's claims
	// waiting on Temporal: far above what one person sends, far below
	// DefaultMaxInflightClaims.
	DefaultMaxInflightPerSubject = 64
)

// SecretFile is where `claimflow dev` keeps the HS256 secret it generated,
// inside its data directory.
const SecretFile = "jwt-secret"

// Security is how the API authenticates and limits.
type Security struct {
	AuthMode  string
	JWTSecret string
	JWKSURL   string
	Issuer    string
	Audience  string
	// RoleClaim names the claim an RS256 token carries its role in.
	RoleClaim string
	// InsecureNoAuth is set by the --insecure-no-auth flag only.
	InsecureNoAuth bool
	// RatePerSubject and RateBurst limit a non-admin subject's writes;
	// AdminRate limits an admin's (0: not limited).
	RatePerSubject float64
	RateBurst      int
	AdminRate      float64
	// ReadRate and ReadBurst limit a non-admin subject's reads (0: not
	// limited).
	ReadRate  float64
	ReadBurst int
	// MaxConfirmWaiters bounds the ?wait=confirmed requests held at once.
	MaxConfirmWaiters int
	// MaxInflightClaims bounds requests waiting on Temporal at once.
	MaxInflightClaims int
	// MaxInflightPerSubject bounds those of one non-admin subject (0:
	// unbounded).
	MaxInflightPerSubject int
	// MaxTTL is the longest token lifetime (exp - iat) the API accepts
	// and `claimflow token` mints.
	MaxTTL time.Duration
	// RoleMap renames token roles to the API's (JWT_ROLE_MAP).
	RoleMap map[string]string
}

// loadSecurity reads the security variables; whether the mode has what it
// needs is checked only by the commands that serve the API.
func loadSecurity(e env, s *Security) error {
	s.AuthMode = strings.ToLower(e.get("AUTH_MODE"))
	switch s.AuthMode {
	case AuthHS256, AuthJWKS, AuthOff:
	default:
		return fmt.Errorf("AUTH_MODE must be hs256, jwks or off, got %q", s.AuthMode)
	}
	s.JWTSecret = e.get("JWT_SECRET")
	s.JWKSURL = e.get("JWKS_URL")
	s.Issuer = e.get("JWT_ISSUER")
	s.Audience = e.get("JWT_AUDIENCE")
	s.RoleClaim = strings.TrimSpace(e.get("JWT_ROLE_CLAIM"))
	if s.RoleClaim == "" {
		return fmt.Errorf("JWT_ROLE_CLAIM must name a claim, got %q", e.raw("JWT_ROLE_CLAIM"))
	}
	var err error
	if s.RatePerSubject, err = strconv.ParseFloat(e.get("RATE_LIMIT_PER_SUBJECT"), 64); err != nil || s.RatePerSubject < 0 {
		return fmt.Errorf("RATE_LIMIT_PER_SUBJECT must be requests per second (0: unlimited), got %q", e.raw("RATE_LIMIT_PER_SUBJECT"))
	}
	if s.RateBurst, err = strconv.Atoi(e.get("RATE_LIMIT_BURST")); err != nil || s.RateBurst < 1 {
		return fmt.Errorf("RATE_LIMIT_BURST must be a positive integer, got %q", e.raw("RATE_LIMIT_BURST"))
	}
	if s.AdminRate, err = strconv.ParseFloat(e.get("RATE_LIMIT_ADMIN"), 64); err != nil || s.AdminRate < 0 {
		return fmt.Errorf("RATE_LIMIT_ADMIN must be requests per second (0: admins unlimited), got %q", e.raw("RATE_LIMIT_ADMIN"))
	}
	if s.ReadRate, err = strconv.ParseFloat(e.get("READ_RATE_LIMIT_PER_SUBJECT"), 64); err != nil || s.ReadRate < 0 {
		return fmt.Errorf("READ_RATE_LIMIT_PER_SUBJECT must be requests per second (0: unlimited), got %q", e.raw("READ_RATE_LIMIT_PER_SUBJECT"))
	}
	if s.ReadBurst, err = e.positive("READ_RATE_LIMIT_BURST"); err != nil {
		return err
	}
	if s.MaxConfirmWaiters, err = e.positive("MAX_CONFIRM_WAITERS"); err != nil {
		return err
	}
	if s.MaxInflightClaims, err = e.positive("MAX_INFLIGHT_CLAIMS"); err != nil {
		return err
	}
	if s.MaxInflightPerSubject, err = strconv.Atoi(e.get("MAX_INFLIGHT_CLAIMS_PER_SUBJECT")); err != nil || s.MaxInflightPerSubject < 0 {
		return fmt.Errorf("MAX_INFLIGHT_CLAIMS_PER_SUBJECT must be a whole number (0: unlimited), got %q", e.raw("MAX_INFLIGHT_CLAIMS_PER_SUBJECT"))
	}
	if s.MaxTTL, err = time.ParseDuration(e.get("JWT_MAX_TTL")); err != nil || s.MaxTTL < time.Minute {
		return fmt.Errorf("JWT_MAX_TTL must be a duration of at least 1m, got %q", e.raw("JWT_MAX_TTL"))
	}
	if s.RoleMap, err = parseRoleMap(e.get("JWT_ROLE_MAP")); err != nil {
		return fmt.Errorf("JWT_ROLE_MAP: %w", err)
	}
	return nil
}

// TokenRoles are the roles the API gives rights to (api.RoleAdmin,
// api.RoleVendor, api.RoleStudent): the only targets of JWT_ROLE_MAP,
// and names it may not remap.
var TokenRoles = []string{"admin", "vendor", "student"}

// parseRoleMap reads JWT_ROLE_MAP: comma-separated from=to pairs, to one
// of TokenRoles; role names are matched exactly (Admin is not admin).
func parseRoleMap(s string) (map[string]string, error) {
	m := map[string]string{}
	for _, pair := range SplitList(s) {
		from, to, ok := strings.Cut(pair, "=")
		from, to = strings.TrimSpace(from), strings.TrimSpace(to)
		switch {
		case !ok || from == "":
			return nil, fmt.Errorf("%q is not role=target", pair)
		case !slices.Contains(TokenRoles, to):
			return nil, fmt.Errorf("%q maps %q to %q, not one of %s", pair, from, to, strings.Join(TokenRoles, ", "))
		case slices.Contains(TokenRoles, from):
			return nil, fmt.Errorf("%q remaps the built-in role %q", pair, from)
		}
		if _, dup := m[from]; dup {
			return nil, fmt.Errorf("%q is mapped twice", from)
		}
		m[from] = to
	}
	return m, nil
}

// EnsureStackSecret gives the local stack an HS256 secret: JWT_SECRET if
// set, else the one in <dataDir>/jwt-secret, generated on first run.
func EnsureStackSecret(s *Security, dataDir string) error {
	if s.InsecureNoAuth || s.AuthMode != AuthHS256 || s.JWTSecret != "" {
		return nil
	}
	secret, err := ReadSecretFile(dataDir)
	if errors.Is(err, fs.ErrNotExist) {
		buf := make([]byte, 32)
		if _, err := rand.Read(buf); err != nil {
			return err
		}
		secret = hex.EncodeToString(buf)
		if err := os.WriteFile(filepath.Join(dataDir, SecretFile), []byte(secret+"\n"), 0o600); err != nil {
			return fmt.Errorf("write the JWT secret: %w", err)
		}
	} else if err != nil {
		return err
	}
	s.JWTSecret = secret
	return nil
}

// ReadSecretFile reads the secret `claimflow dev` wrote into dataDir; the
// error wraps fs.ErrNotExist when there is none.
func ReadSecretFile(dataDir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, SecretFile))
	if err != nil {
		return "", err
	}
	secret := strings.TrimSpace(string(b))
	if secret == "" {
		return "", fmt.Errorf("%s is empty", filepath.Join(dataDir, SecretFile))
	}
	return secret, nil
}

// RedactURL hides a password in a URL (postgres://user:pw@host/db or
// ?password=pw) so it can be printed or logged.
func RedactURL(raw string) string {
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
