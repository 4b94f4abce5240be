package api

import (
	"context"
	"encoding/json"
	"errors"
	"github.com/claimflow/claimflow/workflows"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// stalledPool is a pool whose connection attempts never finish on their
// own: only the caller's context ends them, as with a database that
// accepted the TCP connection and then stopped answering.
func stalledPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig("postgres://test@127.0.0.1:1/test?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.ConnectTimeout = 0
	cfg.ConnConfig.DialFunc = func(ctx context.Context, _, _ string) (net.Conn, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	cfg.ConnConfig.Fallbacks = nil
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func TestStalledDatabaseAnswers503WithinTheBound(t *testing.T) {
	auth, err := NewHS256([]byte(testSecret), JWTOptions{})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	const bound = 300 * time.Millisecond
	h := New(Config{Temporal: &fakeTemporal{}, DB: stalledPool(t), Log: slog.New(slog.DiscardHandler),
		Security: Security{Auth: auth}, Metrics: reg, Gatherer: reg, RequestTimeout: bound})
	t.Cleanup(h.Close)
	a := &testAPI{Handler: h}
	admin := token(t, "admin-1", RoleAdmin, time.Hour)
	for _, path := range []string{"/v1/courses/c1", "/v1/enrollments/e1", "/v1/vendors/v1", "/v1/coupons/k1", "/v1/dead-letters"} {
		t.Run(path, func(t *testing.T) {
			began := time.Now()
			done := make(chan int, 1)
			go func() { done <- a.call(http.MethodGet, path, admin, nil).Code }()
			select {
			case code := <-done:
				took := time.Since(began)
				if code != http.StatusServiceUnavailable {
					t.Fatalf("GET %s on a stalled database = %d, want 503", path, code)
				}
				if took < bound || took > bound+2*time.Second {
					t.Fatalf("GET %s answered after %s, want about %s", path, took, bound)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("GET %s on a stalled database did not answer in 10s: the request has no deadline", path)
			}
		})
	}
}

func TestRouteBoundsCoverTheirWaits(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := New(Config{Temporal: &fakeTemporal{}, Log: slog.New(slog.DiscardHandler), Metrics: reg, Gatherer: reg,
		DecisionTimeout: 15 * time.Second, ConfirmTimeout: 10 * time.Second, PayoutTimeout: 5 * time.Second, RequestTimeout: 2 * time.Second})
	t.Cleanup(h.Close)
	s := &server{cfg: Config{DecisionTimeout: 15 * time.Second, ConfirmTimeout: 10 * time.Second,
		PayoutTimeout: 5 * time.Second, RequestTimeout: 2 * time.Second}}
	useWait := s.decisionWait(workflows.ClaimUseCoupon)
	if useWait <= s.cfg.DecisionTimeout {
		t.Fatalf("a coupon use waits %s, not longer than DecisionTimeout: the test below would not tell the routes apart", useWait)
	}
	enrollWait := s.decisionWait(workflows.ClaimEnrollment)
	issueWait := s.decisionWait(workflows.ClaimIssueCoupon)
	for _, tc := range []struct {
		method, route string
		want          time.Duration
	}{
		{"GET", "/v1/courses/:id", 2 * time.Second},
		{"GET", "/readyz", 2 * time.Second},
		{"POST", "/v1/courses", 2 * time.Second},
		{"POST", "/v1/courses/:id/enrollments", 2*time.Second + enrollWait + 10*time.Second},
		{"DELETE", "/v1/enrollments/:id", 2*time.Second + 15*time.Second},
		{"POST", "/v1/coupon-types/:id/coupons", 2*time.Second + issueWait},
		{"POST", "/v1/dead-letters/:id/retry", 2*time.Second + 15*time.Second},
		{"POST", "/v1/coupons/:id/use", 2*time.Second + useWait},
	} {
		if got := s.routeBound(tc.method, tc.route); got != tc.want {
			t.Errorf("%s %s: bound %s, want %s", tc.method, tc.route, got, tc.want)
		}
	}
	if got, want := h.LongestRequest(), 2*time.Second+useWait; got != want {
		t.Errorf("LongestRequest = %s, want the coupon use's %s", got, want)
	}
}

func TestReadRateLimitPerSubject(t *testing.T) {
	a := newTestAPI(t, Security{ReadRatePerSubject: 0.001, ReadBurst: 3})
	s1, s2 := token(t, "s-1", "", time.Hour), token(t, "s-2", "", time.Hour)
	admin := token(t, "admin-1", RoleAdmin, time.Hour)
	read := func(tok string) *httptest.ResponseRecorder { return a.call(http.MethodGet, "/v1/courses/c1", tok, nil) }
	for i := range 3 {
		if rec := read(s1); rec.Code == http.StatusTooManyRequests {
			t.Fatalf("read %d within the burst = 429", i+1)
		}
	}
	rec := read(s1)
	if rec.Code != http.StatusTooManyRequests || errorOf(t, rec).Code != "rate_limited" {
		t.Fatalf("fourth read = %d %s, want 429 rate_limited", rec.Code, rec.Body.String())
	}
	if ra := rec.Header().Get("Retry-After"); ra == "" || ra == "0" {
		t.Fatalf("Retry-After = %q", ra)
	}
	// Another subject has its own bucket; writes are not read budget;
	// admins' reads are not limited.
	if rec := read(s2); rec.Code == http.StatusTooManyRequests {
		t.Fatal("s-2's first read was limited by s-1's bucket")
	}
	reachedTemporal(t, a.call(http.MethodPost, "/v1/courses/c1/enrollments", s1, map[string]any{"student_id": "s-1"}))
	for range 20 {
		if rec := read(admin); rec.Code == http.StatusTooManyRequests {
			t.Fatal("an admin's read was rate-limited")
		}
	}
}

func TestReadyzCachesAndHidesDetail(t *testing.T) {
	var calls atomic.Int32
	const secret = "dial tcp 10.0.0.7:5432: password authentication failed for user claimflow_app"
	failing := func(context.Context) error { calls.Add(1); return errors.New(secret) }
	ok := func(context.Context) error { return nil }
	var logs logCapture
	reg := prometheus.NewRegistry()
	h := New(Config{Temporal: &fakeTemporal{}, DB: unreachablePool(t), Log: slog.New(slog.NewTextHandler(&logs, nil)), Metrics: reg, Gatherer: reg,
		Checks: map[string]Check{"postgres": failing, "temporal": ok}, SeparateInternal: true})
	t.Cleanup(h.Close)
	get := func(handler http.Handler, path string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec
	}
	type readyBody struct{ Checks map[string]string }
	decode := func(rec *httptest.ResponseRecorder) readyBody {
		var b readyBody
		if err := json.Unmarshal(rec.Body.Bytes(), &b); err != nil {
			t.Fatalf("%s: %v", rec.Body.String(), err)
		}
		return b
	}

	pub := get(h, "/readyz")
	if pub.Code != http.StatusServiceUnavailable {
		t.Fatalf("public /readyz = %d, want 503", pub.Code)
	}
	if b := decode(pub); b.Checks["postgres"] != "failed" || b.Checks["temporal"] != "ok" || strings.Contains(pub.Body.String(), "10.0.0.7") {
		t.Fatalf("public /readyz = %s, want which check failed and no detail", pub.Body.String())
	}
	internal := get(h.Internal, "/readyz")
	if b := decode(internal); internal.Code != http.StatusServiceUnavailable || b.Checks["postgres"] != secret {
		t.Fatalf("internal /readyz = %d %s, want the check's error", internal.Code, internal.Body.String())
	}
	if !strings.Contains(logs.take(), "10.0.0.7") {
		t.Fatal("the failed check's error is not in the log")
	}
	for range 20 {
		get(h, "/readyz")
		get(h.Internal, "/readyz")
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("22 probes within a second ran the checks %d times, want 1", n)
	}
	time.Sleep(readyTTL + 50*time.Millisecond)
	get(h, "/readyz")
	if n := calls.Load(); n != 2 {
		t.Fatalf("after %s the checks ran %d times in all, want 2", readyTTL, n)
	}

	// With a separate internal address, /metrics is served there only.
	if rec := get(h, "/metrics"); rec.Code != http.StatusNotFound {
		t.Fatalf("public /metrics with SeparateInternal = %d, want 404", rec.Code)
	}
	for _, path := range []string{"/metrics", "/healthz", "/debug/pprof/", "/debug/pprof/heap"} {
		if rec := get(h.Internal, path); rec.Code != http.StatusOK {
			t.Fatalf("internal %s = %d", path, rec.Code)
		}
	}
	// Profiles never on the public address.
	if rec := get(h, "/debug/pprof/heap"); rec.Code != http.StatusNotFound {
		t.Fatalf("public /debug/pprof/heap = %d, want 404", rec.Code)
	}
}

func TestSettledHubBoundsAndWakes(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := newSettledHub(unreachablePool(t), 2, func(error) {}, reg)
	woken := func(ch chan struct{}) bool {
		select {
		case <-ch:
			return true
		case <-time.After(20 * time.Millisecond):
			return false
		}
	}
	a, ok := h.add("e-a")
	if !ok {
		t.Fatal("first waiter refused")
	}
	b, ok := h.add("e-b")
	if !ok {
		t.Fatal("second waiter refused")
	}
	if _, ok := h.add("e-c"); ok {
		t.Fatal("a third waiter was taken beyond MaxConfirmWaiters = 2")
	}
	h.settled("e-a")
	if !woken(a) || woken(b) {
		t.Fatal("e-a's notification did not wake e-a alone")
	}
	h.remove("e-a", a)
	c, ok := h.add("e-c")
	if !ok {
		t.Fatal("a freed slot was not reused")
	}
	h.wakeAll() // the listener reconnected: everyone re-reads
	if !woken(b) || !woken(c) {
		t.Fatal("a reconnect did not wake every waiter")
	}
	h.remove("e-b", b)
	h.remove("e-c", c)
	h.remove("e-c", c) // twice: no effect
	h.mu.Lock()
	n := h.count
	h.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d waiters counted after all left", n)
	}
	h.close()
	if _, ok := h.add("e-d"); ok {
		t.Fatal("a closed hub took a waiter")
	}
}
