package api

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
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
	s := &server{Config: Config{DecisionTimeout: 15 * time.Second, ConfirmTimeout: 10 * time.Second,
		PayoutTimeout: 5 * time.Second, RequestTimeout: 2 * time.Second}}
	useWait, err := s.couponUseWait()
	if err != nil {
		t.Fatal(err)
	}
	s.useWait = useWait
	if useWait <= s.DecisionTimeout {
		t.Fatalf("a coupon use waits %s, not longer than DecisionTimeout: the test below would not tell the routes apart", useWait)
	}
	for _, tc := range []struct {
		method, route string
		want          time.Duration
	}{
		{"GET", "/v1/courses/:id", 2 * time.Second},
		{"GET", "/readyz", 2 * time.Second},
		{"POST", "/v1/courses", 2 * time.Second},
		{"POST", "/v1/courses/:id/enrollments", 2*time.Second + 15*time.Second + 10*time.Second},
		{"DELETE", "/v1/enrollments/:id", 2*time.Second + 15*time.Second},
		{"POST", "/v1/coupon-types/:id/coupons", 2*time.Second + 15*time.Second},
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
