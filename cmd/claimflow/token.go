package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"path/filepath"
	"regexp"
	"time"

	"github.com/claimflow/claimflow/api"
	appconfig "github.com/claimflow/claimflow/internal/config"
)

// subjectPattern is the API's ID format: a subject that does not match it
// could never enroll or claim as itself.
var subjectPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// runToken is `claimflow token`: it prints a token for the local stack.
func runToken(_ context.Context, cfg appconfig.Config, _ *slog.Logger, args []string, stdout io.Writer) error {
	flags := flag.NewFlagSet("token", flag.ContinueOnError)
	sub := flags.String("sub", "", "the token's subject: the student or user ID it acts as (required)")
	role := flags.String("role", "", "admin for an operator (create courses, vendors, coupon types; dead letters; act for anyone); vendor for a vendor reading its own record (--sub = the vendor's ID); empty for a student")
	ttl := flags.Duration("ttl", time.Hour, "lifetime of the token, at most JWT_MAX_TTL (default 24h)")
	dataDir := flags.String("data-dir", ".claimflow", "the 'claimflow dev' data dir whose jwt-secret signs the token when JWT_SECRET is unset")
	flags.Usage = func() {
		fmt.Fprintln(flags.Output(), "usage: claimflow token --sub ID [--role admin|vendor] [--ttl 1h] [--data-dir .claimflow]\n\n"+
			"Prints an HS256 token for the local stack, signed with JWT_SECRET or <data-dir>/jwt-secret\n"+
			"(written by 'claimflow dev' on its first run). JWT_ISSUER and JWT_AUDIENCE, when set, go into it;\n"+
			"the API refuses a token that lives longer than its JWT_MAX_TTL, and so does this command.")
		flags.PrintDefaults()
	}
	if err := flags.Parse(args); err != nil {
		return err
	}
	if flags.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %v", flags.Args())
	}
	if !subjectPattern.MatchString(*sub) {
		return errors.New("--sub is required: 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit")
	}
	maxTTL := cfg.Security.MaxTTL
	if maxTTL <= 0 {
		maxTTL = appconfig.DefaultJWTMaxTTL
	}
	if *ttl > maxTTL {
		return fmt.Errorf("--ttl %s exceeds JWT_MAX_TTL (%s), the longest lifetime the API accepts: mint a shorter token, or raise JWT_MAX_TTL for the API and here", *ttl, maxTTL)
	}
	if *role != "" && *role != api.RoleAdmin && *role != api.RoleVendor {
		return fmt.Errorf("--role must be %s, %s or empty (a student), got %q", api.RoleAdmin, api.RoleVendor, *role)
	}
	if cfg.Security.AuthMode == appconfig.AuthJWKS {
		return errors.New("AUTH_MODE=jwks: tokens come from your identity provider, not from claimflow")
	}
	secret := cfg.Security.JWTSecret
	if secret == "" {
		var err error
		secret, err = appconfig.ReadSecretFile(*dataDir)
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("no JWT_SECRET and no %s: run 'claimflow dev' once (it writes one) or set JWT_SECRET",
				filepath.Join(*dataDir, appconfig.SecretFile))
		}
		if err != nil {
			return err
		}
	}
	token, err := api.SignHS256(secret, *sub, *role, *ttl, cfg.Security.Issuer, cfg.Security.Audience)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(stdout, token)
	return err
}
