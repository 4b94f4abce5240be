// Package temporalconn is how every claimflow process reaches Temporal: the
// address and namespace, TLS with a client certificate re-read when its
// files change (mTLS), and an API key (Temporal Cloud), all from
// internal/config. The API, worker, consumer, replay, audit and the bench
// dial through it, so they share one set of settings.
package temporalconn

import (
	"context"
	"fmt"

	"go.temporal.io/sdk/client"

	"github.com/claimflow/claimflow/internal/config"
)

// Dial connects o, with cfg's address, namespace and security filled in,
// to Temporal. The caller's o carries the rest: logger, metrics, dial
// options.
func Dial(ctx context.Context, cfg config.Config, o client.Options) (client.Client, error) {
	if err := Apply(cfg, &o); err != nil {
		return nil, err
	}
	c, err := client.DialContext(ctx, o)
	if err != nil {
		return nil, fmt.Errorf("connect to Temporal at %s (%s): %w", cfg.TemporalAddress, describe(cfg), err)
	}
	return c, nil
}

// Apply sets o's address, namespace, TLS and credentials from cfg.
func Apply(cfg config.Config, o *client.Options) error {
	o.HostPort, o.Namespace = cfg.TemporalAddress, cfg.Namespace
	tlsConfig, err := cfg.TemporalTLS.Config()
	if err != nil {
		return err
	}
	o.ConnectionOptions.TLS = tlsConfig
	if cfg.TemporalAPIKey != "" {
		o.Credentials = client.NewAPIKeyStaticCredentials(cfg.TemporalAPIKey)
	}
	return nil
}

// describe names the security in use, for the error a failed dial returns.
func describe(cfg config.Config) string {
	switch t := cfg.TemporalTLS; {
	case !t.Enabled:
		return "plaintext"
	case cfg.TemporalAPIKey != "":
		return "TLS with an API key"
	case t.Cert != "":
		return "mTLS with " + t.Cert
	default:
		return "TLS"
	}
}
