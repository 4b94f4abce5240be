package api

import (
	"context"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
	// (default 10 min). A token naming an unknown kid triggers an early
	// fetch, at most once per MinRefresh (default 30 s), so a key rotation
	// is picked up at once but random kids cannot hammer the endpoint.
	TTL        time.Duration
	MinRefresh time.Duration
}

// jwks verifies RS256 tokens with the RSA keys of a JWKS document.
type jwks struct {
	url  string
	opts JWKSOptions

	mu        sync.RWMutex
	keys      map[string]*rsa.PublicKey
	fetchedAt time.Time // last successful fetch
	triedAt   time.Time // last attempt, successful or not
	lastErr   error

	fetchMu sync.Mutex // one fetch at a time
}

var errUnknownKey = errors.New("no key with this kid in the key set")

// minRSABits rejects keys too short to trust.
const minRSABits = 2048

// maxJWKSBytes bounds the key set document.
const maxJWKSBytes = 1 << 20

// NewJWKS verifies RS256 tokens against the key set published at url
// (production: the identity provider's jwks_uri). Keys are fetched lazily
// and cached.
func NewJWKS(url string, o JWKSOptions) (Authenticator, error) {
	if !strings.HasPrefix(url, "https://") && !strings.HasPrefix(url, "http://") {
		return nil, fmt.Errorf("JWKS URL must be http(s), got %q", url)
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
	if o.Now == nil {
		o.Now = time.Now
	}
	j := &jwks{url: url, opts: o}
	return newVerifier(jwt.SigningMethodRS256.Alg(), o.JWTOptions, func(ctx context.Context) jwt.Keyfunc {
		return func(t *jwt.Token) (any, error) {
			kid, _ := t.Header["kid"].(string)
			return j.key(ctx, kid)
		}
	}), nil
}

// key returns the key for kid, fetching the set when it is stale or lacks kid.
func (j *jwks) key(ctx context.Context, kid string) (*rsa.PublicKey, error) {
	now := j.opts.Now()
	j.mu.RLock()
	k, found := pick(j.keys, kid)
	fresh := !j.fetchedAt.IsZero() && now.Sub(j.fetchedAt) < j.opts.TTL
	j.mu.RUnlock()
	if found && fresh {
		return k, nil
	}
	if err := j.refresh(ctx, now); err != nil {
		if found { // the endpoint is down: a known key stays good
			return k, nil
		}
		return nil, err
	}
	j.mu.RLock()
	defer j.mu.RUnlock()
	if k, ok := pick(j.keys, kid); ok {
		return k, nil
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

// refresh fetches the key set unless another attempt was made within
// MinRefresh (then the outcome of that attempt stands).
func (j *jwks) refresh(ctx context.Context, now time.Time) error {
	j.fetchMu.Lock()
	defer j.fetchMu.Unlock()
	j.mu.RLock()
	recent := !j.triedAt.IsZero() && now.Sub(j.triedAt) < j.opts.MinRefresh
	lastErr := j.lastErr
	j.mu.RUnlock()
	if recent {
		return lastErr
	}
	keys, err := j.fetch(ctx)
	j.mu.Lock()
	defer j.mu.Unlock()
	j.triedAt = now
	j.lastErr = err
	if err != nil {
		return err
	}
	j.keys, j.fetchedAt = keys, now
	return nil
}

func (j *jwks) fetch(ctx context.Context) (map[string]*rsa.PublicKey, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
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
