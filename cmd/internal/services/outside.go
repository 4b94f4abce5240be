package services

import (
	"cmp"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/claimflow/claimflow/internal/config"
)

// Setting is one environment variable a service outside the stack's
// process needs to join it. When FromFile, Value is the path of a file
// that holds the value (the generated JWT secret), which is not printed.
type Setting struct {
	Name, Value string
	FromFile    bool
}

// OutsideEnv is what `claimflow api`, `claimflow worker` and `claimflow
// consumer` run as their own processes need so that they run as the
// stack's own services would: its addresses, and every setting the stack
// gives its services in place of the environment's default (the batch
// size its Temporal server allows, gzip off on loopback, no linger on an in-process broker, its simulators).
// The JWT secret is named by its file, and left out when the environment
// gave it; an empty value is left out (its default is what the stack runs
// without it). MIGRATE_DATABASE_URL, which the services do not use, is
// apart: s.Config.MigrateDatabaseURL.
func (s *Stack) OutsideEnv() []Setting {
	c := s.Config
	env := []Setting{
		{Name: "DATABASE_URL", Value: c.DatabaseURL},
		{Name: "KAFKA_BROKERS", Value: strings.Join(c.KafkaBrokers, ",")},
		{Name: "TEMPORAL_ADDRESS", Value: c.TemporalAddress},
		{Name: "TEMPORAL_UI_URL", Value: cmp.Or(c.TemporalUIURL, config.NoUI)},
		{Name: "TEMPORAL_GRPC_COMPRESSION", Value: c.TemporalCompression},
		{Name: "KAFKA_LINGER", Value: c.KafkaLinger.String()},
		{Name: "CLAIM_BATCH_ATTR_BYTES", Value: strconv.Itoa(c.ClaimBatchAttrBytes)},
		{Name: "VENDOR_PAYOUT_URL", Value: c.PayoutURL},
		{Name: "NOTIFY_WEBHOOK_URL", Value: c.NotifyWebhookURL},
	}
	env = slices.DeleteFunc(env, func(e Setting) bool { return e.Value == "" })
	if !c.IsSet("JWT_SECRET") && c.Security.JWTSecret != "" {
		env = append(env, Setting{Name: "JWT_SECRET", Value: filepath.Join(s.Options.DataDir, config.SecretFile), FromFile: true})
	}
	if !c.IsSet("EVENT_SIGNING_KEY") && c.EventSigningKey != "" {
		env = append(env, Setting{Name: "EVENT_SIGNING_KEY", Value: filepath.Join(s.Options.DataDir, config.EventKeyFile), FromFile: true})
	}
	return env
}

// ShellLine is env as one line a POSIX shell takes as variable
// assignments (prefix a command with it, or `export` it). URLs are shown
// redacted (a password becomes xxxxx), as everywhere the stack prints them.
func ShellLine(env []Setting) string {
	parts := make([]string, 0, len(env))
	for _, e := range env {
		switch {
		case e.FromFile:
			parts = append(parts, fmt.Sprintf("%s=$(cat %s)", e.Name, shellQuote(e.Value)))
		case strings.HasSuffix(e.Name, "_URL"):
			parts = append(parts, e.Name+"="+shellQuote(config.RedactURL(e.Value)))
		default:
			parts = append(parts, e.Name+"="+shellQuote(e.Value))
		}
	}
	return strings.Join(parts, " ")
}

// shellQuote quotes s for a POSIX shell unless it needs none.
func shellQuote(s string) string {
	if strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:,@%+=") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
