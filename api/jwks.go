package api

import (
	"context"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// JWKSOptions tune the key set cache of NewJWKS.
type JWKSOptions struct {
	JWTOptions
	// Client fetches the key set (default: a client with a 5 s timeout).
	Client *http.Client
	// TTL is how long a fetched key set is used before it is fetched again
	// (default 10 min); the stale set keeps serving while the new one is
	// fetched in the background, and for as long as fetching fails. A token
	// naming an unknown kid triggers an early fetch, at most once per
	// MinRefresh (default 30 s), so a key rotation is picked up at once but
	// random kids cannot hammer the endpoint.
	TTL        time.Duration
	MinRefresh time.Duration
	// RetryEmpty is how soon a failed fetch is tried again while no key
	// set was ever fetched (default 1 s): a fresh replica whose first fetch
	// failed recovers at once, not after MinRefresh.
	RetryEmpty time.Duration
	// FetchTimeout bounds one fetch (default 10 s). Fetches run on a
	// context of their own, never on the triggering request's, so a client
	// that hangs up cannot fail a fetch for everyone.
	FetchTimeout time.Duration
	// AllowHTTP accepts an http:// URL. Only tests set it: in production
	// the key set must come over TLS (an attacker on the path could swap
	// the keys), and there is no environment variable for it.
	AllowHTTP bool
	// Log receives failed fetches (default: slog.Default()).
	Log *slog.Logger
}

// jwks verifies RS256 tokens with the RSA keys of a JWKS document.
type jwks struct {
	url  string
	opts JWKSOptions

	mu        sync.Mutex
	keys      map[string]*rsa.PublicKey // the last good set; nil before the first
	fetchedAt time.Time                 // when keys was fetched
	triedAt   time.Time                 // last attempt, successful or not
	lastErr   error                     // outcome of the last attempt
	inflight  chan struct{}             // closed when the running fetch ends; nil when none runs
}

var errUnknownKey = errors.New("no key with this kid in the key set")

// minRSABits rejects keys too short to trust.
const minRSABits = 2048

// maxJWKSBytes bounds the key set document.
const maxJWKSBytes = 1 << 20

// NewJWKS verifies RS256 tokens against the key set published at url
// (production: the identity provider's jwks_uri). The first fetch starts at
// once in the background; later ones when the set is stale or a token names
// a kid the set lacks.
func NewJWKS(url string, o JWKSOptions) (Authenticator, error) {
	switch {
	case strings.HasPrefix(url, "https://"):
	case strings.HasPrefix(url, "http://") && o.AllowHTTP:
	case strings.HasPrefix(url, "http://"):
		return nil, fmt.Errorf("JWKS URL must be https (the key set decides who is admin), got %q", url)
	default:
		return nil, fmt.Errorf("JWKS URL must be https, got %q", url)
	}
	if err := checkRoleMap(o.RoleMap); err != nil {
		return nil, err
	}
	if o.Client == nil {
		o.Client = &http.Client{Timeout: 5 * time.Second}
	}
	if o.TTL == 0 {
		o.TTL = 10 * time.Minute
	}
	if o.MinRefresh == 0 {
		o.MinRefresh = 30 * time.Second
	}
	if o.RetryEmpty == 0 {
		o.RetryEmpty = time.Second
	}
	if o.FetchTimeout == 0 {
		o.FetchTimeout = 10 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	j := &jwks{url: url, opts: o}
	j.startFetch(o.Now())
	v := newVerifier(jwt.SigningMethodRS256.Alg(), o.JWTOptions, func(ctx context.Context) jwt.Keyfunc {
		return func(t *jwt.Token) (any, error) {
			kid, _ := t.Header["kid"].(string)
			return j.key(ctx, kid)
		}
	})
	v.jwks = j
	return v, nil
}

// key returns the key for kid. A known key is answered from the last good
// set at once (a stale set is refreshed in the background). An unknown kid
// starts a fetch, if none ran within MinRefresh, and waits for it as long
// as ctx allows; only the wait is bounded by the request, not the fetch.
func (j *jwks) key(ctx context.Context, kid string) (*rsa.PublicKey, error) {
	now := j.opts.Now()
	j.mu.Lock()
	k, found := pick(j.keys, kid)
	stale := now.Sub(j.fetchedAt) >= j.opts.TTL
	j.mu.Unlock()
	if found {
		if stale {
			j.startFetch(now)
		}
		return k, nil
	}
	if done := j.startFetch(now); done != nil {
		select {
		case <-done:
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: waiting for the key set: %v", ErrKeysUnavailable, ctx.Err())
		}
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if k, ok := pick(j.keys, kid); ok {
		return k, nil
	}
	if j.lastErr != nil {
		// The kid may be a rotated key we cannot fetch: the token may be
		// fine, so 503 rather than 401.
		return nil, j.lastErr
	}
	if j.keys == nil {
		return nil, fmt.Errorf("%w: the key set is being fetched", ErrKeysUnavailable)
	}
	return nil, errUnknownKey
}

// pick finds kid; a token without kid may use a set of exactly one key.
func pick(keys map[string]*rsa.PublicKey, kid string) (*rsa.PublicKey, bool) {
	if kid == "" && len(keys) == 1 {
		for _, k := range keys {
			return k, true
		}
	}
	k, ok := keys[kid]
	return k, ok
}

// startFetch starts a background fetch unless one is running (then it
// returns that one's channel) or one was attempted within MinRefresh
// (RetryEmpty while there is no key set yet): then it returns nil and the
// last attempt's outcome stands. The returned channel closes when the
// fetch ends.
func (j *jwks) startFetch(now time.Time) <-chan struct{} {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.inflight != nil {
		return j.inflight
	}
	gap := j.opts.MinRefresh
	if j.keys == nil {
		gap = min(gap, j.opts.RetryEmpty)
	}
	if !j.triedAt.IsZero() && now.Sub(j.triedAt) < gap {
		return nil
	}
	j.triedAt = now
	done := make(chan struct{})
	j.inflight = done
	go func() {
		// Detached from any request: a caller that goes away neither
		// cancels the fetch nor leaves a failure behind for the others.
		ctx, cancel := context.WithTimeout(context.Background(), j.opts.FetchTimeout)
		defer cancel()
		keys, err := j.fetch(ctx)
		j.mu.Lock()
		j.lastErr = err
		if err == nil {
			j.keys, j.fetchedAt = keys, j.opts.Now()
		}
		j.inflight = nil
		j.mu.Unlock()
		close(done)
		if err != nil {
			j.opts.Log.Warn("JWKS fetch failed; the last good key set keeps serving", "err", err)
		}
	}()
	return done
}

func (j *jwks) fetch(ctx context.Context) (map[string]*rsa.PublicKey, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, j.url, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrKeysUnavailable, err)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := j.opts.Client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: fetch JWKS: %v", ErrKeysUnavailable, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%w: fetch JWKS: status %d", ErrKeysUnavailable, resp.StatusCode)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxJWKSBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%w: read JWKS: %v", ErrKeysUnavailable, err)
	}
	if len(body) > maxJWKSBytes {
		return nil, fmt.Errorf("%w: JWKS exceeds %d bytes", ErrKeysUnavailable, maxJWKSBytes)
	}
	keys, err := parseJWKS(body)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrKeysUnavailable, err)
	}
	return keys, nil
}

// jwk is the part of a JSON Web Key (RFC 7517) an RS256 verifier needs.
type jwk struct {
	Kty string `json:"kty"`
	Kid string `json:"kid"`
	Use string `json:"use"`
	Alg string `json:"alg"`
	N   string `json:"n"`
	E   string `json:"e"`
}

// parseJWKS returns the RSA signing keys of a JWKS document by kid. Keys of
// other types or uses are skipped; a malformed RSA key is an error.
func parseJWKS(doc []byte) (map[string]*rsa.PublicKey, error) {
	var set struct {
		Keys []jwk `json:"keys"`
	}
	if err := json.Unmarshal(doc, &set); err != nil {
		return nil, fmt.Errorf("parse JWKS: %w", err)
	}
	keys := map[string]*rsa.PublicKey{}
	for i, k := range set.Keys {
		if k.Kty != "RSA" || (k.Use != "" && k.Use != "sig") || (k.Alg != "" && k.Alg != jwt.SigningMethodRS256.Alg()) {
			continue
		}
		pub, err := rsaKey(k.N, k.E)
		if err != nil {
			return nil, fmt.Errorf("JWKS key %d (kid %q): %w", i, k.Kid, err)
		}
		keys[k.Kid] = pub
	}
	if len(keys) == 0 {
		return nil, errors.New("JWKS holds no RSA signing key")
	}
	return keys, nil
}

func rsaKey(n64, e64 string) (*rsa.PublicKey, error) {
	nb, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(n64, "="))
	if err != nil {
		return nil, fmt.Errorf("modulus n: %w", err)
	}
	eb, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(e64, "="))
	if err != nil {
		return nil, fmt.Errorf("exponent e: %w", err)
	}
	n := new(big.Int).SetBytes(nb)
	if n.BitLen() < minRSABits {
		return nil, fmt.Errorf("modulus has %d bits, want at least %d", n.BitLen(), minRSABits)
	}
	e := new(big.Int).SetBytes(eb)
	if !e.IsInt64() || e.Int64() < 3 || e.Int64() > 1<<31-1 || e.Bit(0) == 0 {
		return nil, errors.New("exponent e must be an odd integer from 3 to 2^31-1")
	}
	return &rsa.PublicKey{N: n, E: int(e.Int64())}, nil
}
