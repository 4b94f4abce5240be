package services

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"

	"github.com/claimflow/claimflow/api"
	"github.com/claimflow/claimflow/internal/config"
)

// APISecurity builds the API's security from the configuration; it fails
// when the chosen mode lacks what it needs, so a misconfigured API never
// serves unauthenticated.
func APISecurity(s config.Security, log *slog.Logger) (api.Security, error) {
	sec := api.Security{
		RatePerSubject:      s.RatePerSubject,
		RateBurst:           s.RateBurst,
		AdminRatePerSubject: s.AdminRate,
		ReadRatePerSubject:  s.ReadRate,
		ReadBurst:           s.ReadBurst,
		MaxConfirmWaiters:   s.MaxConfirmWaiters,
		MaxInflightClaims:   s.MaxInflightClaims,

		MaxInflightClaimsPerSubject: s.MaxInflightPerSubject,
	}
	if err := CheckAuth(s); err != nil {
		return sec, err
	}
	opts := api.JWTOptions{Issuer: s.Issuer, Audience: s.Audience, MaxTTL: s.MaxTTL, RoleMap: s.RoleMap}
	var err error
	switch {
	case s.InsecureNoAuth:
		sec.InsecureNoAuth = true // the API logs a loud warning
	case s.AuthMode == config.AuthJWKS:
		opts.RoleClaim = s.RoleClaim
		sec.Auth, err = api.NewJWKS(s.JWKSURL, api.JWKSOptions{JWTOptions: opts, Log: log.With("component", "jwks")})
		if err != nil {
			return sec, fmt.Errorf("JWKS_URL: %w", err)
		}
		log.Info("API authenticates RS256 tokens", "jwks_url", config.RedactURL(s.JWKSURL), "issuer", s.Issuer,
			"audience", s.Audience, "role_claim", s.RoleClaim)
	default:
		sec.Auth, err = api.NewHS256([]byte(s.JWTSecret), opts)
		if err != nil {
			return sec, fmt.Errorf("JWT_SECRET: %w", err)
		}
		log.Info("API authenticates HS256 tokens", "issuer", s.Issuer, "audience", s.Audience)
	}
	return sec, nil
}

// CheckAuth refuses an authentication setting that lacks what its mode
// needs. It reads nothing but s, so `claimflow api` runs it before it
// dials anything: the first line of a misconfigured API names the setting.
func CheckAuth(s config.Security) error {
	switch {
	case s.InsecureNoAuth:
		return nil
	case s.AuthMode == config.AuthOff:
		return errors.New("AUTH_MODE=off needs the explicit --insecure-no-auth flag")
	case s.AuthMode == config.AuthJWKS:
		if s.JWKSURL == "" {
			return errors.New("AUTH_MODE=jwks needs JWKS_URL")
		}
		// A shared identity provider issues tokens for many applications:
		// without both checks, an admin of any of them is an admin here.
		var missing []string
		if s.Issuer == "" {
			missing = append(missing, "JWT_ISSUER")
		}
		if s.Audience == "" {
			missing = append(missing, "JWT_AUDIENCE")
		}
		if len(missing) > 0 {
			return fmt.Errorf("AUTH_MODE=jwks needs %s: tokens of the identity provider issued for other applications would be accepted",
				strings.Join(missing, " and "))
		}
	default:
		if s.JWTSecret == "" {
			return errors.New("AUTH_MODE=hs256 needs JWT_SECRET (at least 32 bytes); or set AUTH_MODE=jwks with JWKS_URL")
		}
	}
	return nil
}

// PrintAuthHint tells the person running `claimflow dev` how to get a token.
func (s *Stack) PrintAuthHint(w io.Writer) {
	sec := s.Config.Security
	switch {
	case sec.InsecureNoAuth:
		fmt.Fprintln(w, "WARNING: authentication is OFF (--insecure-no-auth); every request acts as an admin")
	case sec.AuthMode == config.AuthHS256:
		fmt.Fprintf(w, "auth: every /v1 request needs a bearer token (HS256, secret in %s or JWT_SECRET); mint one:\n"+
			"  TOKEN=$(go run ./cmd/claimflow token --data-dir %s --sub admin-1 --role admin)   # an operator\n"+
			"  go run ./cmd/claimflow token --data-dir %s --sub s-1                            # student s-1\n",
			filepath.Join(s.Options.DataDir, config.SecretFile), s.Options.DataDir, s.Options.DataDir)
	default:
		fmt.Fprintf(w, "auth: RS256 tokens from %s\n", config.RedactURL(sec.JWKSURL))
	}
}
