package api

import (
	"context"
	"crypto/rsa"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// gatedJWKS is a key set endpoint that can fail, and can hold each fetch
// until the test lets it go.
type gatedJWKS struct {
	*httptest.Server
	mu      sync.Mutex
	doc     []byte
	status  int
	gate    chan struct{} // when set, each fetch waits for a receive
	fetches atomic.Int32
}

func newGatedJWKS(t *testing.T, keys map[string]*rsa.PublicKey) *gatedJWKS {
	s := &gatedJWKS{status: http.StatusOK, doc: jwksDoc(keys)}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.fetches.Add(1)
		s.mu.Lock()
		gate := s.gate
		s.mu.Unlock()
		if gate != nil {
			select {
			case <-gate:
			case <-r.Context().Done():
				return
			}
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		w.WriteHeader(s.status)
		_, _ = w.Write(s.doc)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *gatedJWKS) set(status int, keys map[string]*rsa.PublicKey, gate chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.status, s.gate = status, gate
	if keys != nil {
		s.doc = jwksDoc(keys)
	}
}

// testClock is a clock the test moves.
type testClock struct{ unix atomic.Int64 }

func newTestClock() *testClock {
	c := &testClock{}
	c.unix.Store(time.Now().Unix())
	return c
}

func (c *testClock) now() time.Time      { return time.Unix(c.unix.Load(), 0) }
func (c *testClock) add(d time.Duration) { c.unix.Add(int64(d / time.Second)) }
func (c *testClock) claims(sub, role string) jwt.MapClaims {
	return jwt.MapClaims{"sub": sub, "role": role, "iss": "https://idp.test", "aud": "claimflow",
		"iat": c.now().Unix(), "exp": c.now().Add(time.Hour).Unix()}
}

func newTestJWKS(t *testing.T, url string, clock *testClock, o JWKSOptions) Authenticator {
	t.Helper()
	o.JWTOptions.Now = clock.now
	o.JWTOptions.Issuer, o.JWTOptions.Audience = "https://idp.test", "claimflow"
	o.AllowHTTP = true
	o.Log = slog.New(slog.DiscardHandler)
	auth, err := NewJWKS(url, o)
	if err != nil {
		t.Fatal(err)
	}
	return auth
}

// waitFetches waits until the endpoint has seen n fetches.
func waitFetches(t *testing.T, s *gatedJWKS, n int32) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for s.fetches.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d fetches, want %d", s.fetches.Load(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// settle waits until no fetch is running, so the next call sees its outcome.
func settle(auth Authenticator) {
	j := auth.(*verifier).jwks
	j.mu.Lock()
	done := j.inflight
	j.mu.Unlock()
	if done != nil {
		<-done
	}
}

func TestJWKSRefreshFailureKeepsServing(t *testing.T) {
	keys := testRSAKeys(t)
	srv := newGatedJWKS(t, map[string]*rsa.PublicKey{"k1": &keys[0].PublicKey})
	clock := newTestClock()
	auth := newTestJWKS(t, srv.URL, clock, JWKSOptions{TTL: time.Minute, MinRefresh: 10 * time.Second})
	tok := signRS256(t, keys[0], "k1", clock.claims("s-1", ""))
	if _, err := auth.Authenticate(context.Background(), tok); err != nil {
		t.Fatal(err)
	}
	srv.set(http.StatusInternalServerError, nil, nil)
	for i := range 5 {
		clock.add(2 * time.Minute) // the set is stale: each call starts a background refresh, which fails
		tok := signRS256(t, keys[0], "k1", clock.claims("s-1", ""))
		if p, err := auth.Authenticate(context.Background(), tok); err != nil || p.Subject != "s-1" {
			t.Fatalf("call %d while the endpoint fails: %+v %v", i, p, err)
		}
		waitFetches(t, srv, int32(2+i))
		settle(auth)
	}
	// The endpoint hangs: a known key still answers at once.
	gate := make(chan struct{})
	srv.set(http.StatusOK, nil, gate)
	clock.add(2 * time.Minute)
	began := time.Now()
	if _, err := auth.Authenticate(context.Background(), signRS256(t, keys[0], "k1", clock.claims("s-1", ""))); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(began); took > time.Second {
		t.Fatalf("a known key waited %s for a hanging refresh", took)
	}
	close(gate)
}

func TestJWKSFetchIsNotTheRequests(t *testing.T) {
	keys := testRSAKeys(t)
	gate := make(chan struct{})
	srv := newGatedJWKS(t, map[string]*rsa.PublicKey{"k1": &keys[0].PublicKey})
	srv.set(http.StatusOK, nil, gate)
	clock := newTestClock()
	auth := newTestJWKS(t, srv.URL, clock, JWKSOptions{})
	waitFetches(t, srv, 1) // the first fetch starts at construction
	tok := signRS256(t, keys[0], "k1", clock.claims("s-1", ""))

	// A client that hangs up while the key set is fetched gets its answer
	// (503: keys unavailable), but the fetch goes on.
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, 1)
	go func() { _, err := auth.Authenticate(ctx, tok); errs <- err }()
	time.Sleep(20 * time.Millisecond)
	cancel()
	if err := <-errs; !errors.Is(err, ErrKeysUnavailable) {
		t.Fatalf("cancelled request: err = %v, want ErrKeysUnavailable", err)
	}
	close(gate)
	// The next request finds the fetched keys: no failure was left behind,
	// and no second fetch was needed.
	if p, err := auth.Authenticate(context.Background(), tok); err != nil || p.Subject != "s-1" {
		t.Fatalf("after the fetch: %+v %v", p, err)
	}
	if n := srv.fetches.Load(); n != 1 {
		t.Fatalf("%d fetches, want 1", n)
	}
}

func TestJWKSFirstFetchFailureIsRetriedSoon(t *testing.T) {
	keys := testRSAKeys(t)
	srv := newGatedJWKS(t, map[string]*rsa.PublicKey{"k1": &keys[0].PublicKey})
	srv.set(http.StatusBadGateway, nil, nil)
	clock := newTestClock()
	auth := newTestJWKS(t, srv.URL, clock, JWKSOptions{MinRefresh: time.Minute, RetryEmpty: time.Second})
	tok := signRS256(t, keys[0], "k1", clock.claims("s-1", ""))
	if _, err := auth.Authenticate(context.Background(), tok); !errors.Is(err, ErrKeysUnavailable) {
		t.Fatalf("endpoint down, no key set yet: err = %v, want ErrKeysUnavailable", err)
	}
	srv.set(http.StatusOK, nil, nil)
	clock.add(2 * time.Second) // RetryEmpty, far less than MinRefresh
	if _, err := auth.Authenticate(context.Background(), tok); err != nil {
		t.Fatalf("the endpoint is back, but the failure stuck: %v", err)
	}
}

func TestJWKSUnknownKidRefreshIsRateLimited(t *testing.T) {
	keys := testRSAKeys(t)
	srv := newGatedJWKS(t, map[string]*rsa.PublicKey{"k1": &keys[0].PublicKey})
	clock := newTestClock()
	auth := newTestJWKS(t, srv.URL, clock, JWKSOptions{TTL: time.Hour, MinRefresh: 30 * time.Second})
	if _, err := auth.Authenticate(context.Background(), signRS256(t, keys[0], "k1", clock.claims("s-1", ""))); err != nil {
		t.Fatal(err)
	}
	// The provider rotates to k2; the first token naming it triggers a
	// fetch at once (MinRefresh after the last one).
	srv.set(http.StatusOK, map[string]*rsa.PublicKey{"k1": &keys[0].PublicKey, "k2": &keys[1].PublicKey}, nil)
	clock.add(31 * time.Second)
	if _, err := auth.Authenticate(context.Background(), signRS256(t, keys[1], "k2", clock.claims("s-1", ""))); err != nil {
		t.Fatalf("rotated key: %v", err)
	}
	if n := srv.fetches.Load(); n != 2 {
		t.Fatalf("%d fetches after the rotation, want 2", n)
	}
	// Random kids within MinRefresh: 401 unknown key, no fetch.
	for i := range 20 {
		kid := "random-" + string(rune('a'+i))
		_, err := auth.Authenticate(context.Background(), signRS256(t, keys[1], kid, clock.claims("s-1", "")))
		if !errors.Is(err, errUnknownKey) {
			t.Fatalf("kid %s: err = %v, want errUnknownKey", kid, err)
		}
	}
	if n := srv.fetches.Load(); n != 2 {
		t.Fatalf("%d fetches after 20 unknown kids within MinRefresh, want 2", n)
	}
	clock.add(31 * time.Second)
	if _, err := auth.Authenticate(context.Background(), signRS256(t, keys[1], "k9", clock.claims("s-1", ""))); !errors.Is(err, errUnknownKey) {
		t.Fatalf("k9: %v", err)
	}
	if n := srv.fetches.Load(); n != 3 {
		t.Fatalf("%d fetches after MinRefresh passed, want 3", n)
	}
}

func TestJWKSNeedsHTTPS(t *testing.T) {
	for _, url := range []string{"http://idp.example/jwks", "file:///etc/passwd", "idp.example/jwks"} {
		if _, err := NewJWKS(url, JWKSOptions{}); err == nil || !strings.Contains(err.Error(), "https") {
			t.Errorf("NewJWKS(%q): err = %v, want a refusal naming https", url, err)
		}
	}
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write(jwksDoc(map[string]*rsa.PublicKey{"k1": &testRSAKeys(t)[0].PublicKey}))
	}))
	defer srv.Close()
	clock := newTestClock()
	auth, err := NewJWKS(srv.URL, JWKSOptions{Client: srv.Client(), JWTOptions: JWTOptions{Now: clock.now}, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := auth.Authenticate(context.Background(), signRS256(t, testRSAKeys(t)[0], "k1", clock.claims("s-1", ""))); err != nil {
		t.Fatalf("https key set: %v", err)
	}
}

func TestRoleClaimIsConfigurable(t *testing.T) {
	keys := testRSAKeys(t)
	srv := newGatedJWKS(t, map[string]*rsa.PublicKey{"k1": &keys[0].PublicKey})
	clock := newTestClock()
	for _, tc := range []struct {
		claim  string
		claims jwt.MapClaims
		want   string // "!" : the token is refused
	}{
		{"", jwt.MapClaims{"role": "admin"}, RoleAdmin},
		{"claimflow_role", jwt.MapClaims{"claimflow_role": "admin"}, RoleAdmin},
		{"claimflow_role", jwt.MapClaims{"role": "admin"}, ""},                      // the other app's role claim means nothing here
		{"claimflow_role", jwt.MapClaims{"claimflow_role": []string{"admin"}}, "!"}, // not a string
	} {
		auth := newTestJWKS(t, srv.URL, clock, JWKSOptions{JWTOptions: JWTOptions{RoleClaim: tc.claim}})
		claims := clock.claims("u-1", "")
		delete(claims, "role")
		for k, v := range tc.claims {
			claims[k] = v
		}
		p, err := auth.Authenticate(context.Background(), signRS256(t, keys[0], "k1", claims))
		if tc.want == "!" {
			if err == nil {
				t.Errorf("role claim %q, token %v: accepted as %+v", tc.claim, tc.claims, p)
			}
			continue
		}
		if err != nil || p.Role != tc.want {
			t.Errorf("role claim %q, token %v: %+v %v, want role %q", tc.claim, tc.claims, p, err, tc.want)
		}
	}
}
