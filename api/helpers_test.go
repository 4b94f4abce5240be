package api

// Test doubles for the API's dependencies: a Temporal that refuses every
// claim (course/coupon type/coupon not found) or blocks on demand, and a
// Postgres pool whose every connection attempt fails with errNoDatabase, so
// the handlers run for real up to their first query.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"go.temporal.io/api/serviceerror"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/golang-jwt/jwt/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.temporal.io/sdk/client"

	"github.com/claimflow/claimflow/workflows"
)

var errNoDatabase = errors.New("test: no database behind this pool")

// testSecret signs the tests' HS256 tokens.
const testSecret = "test-secret-test-secret-test-secret!"

// fakeTemporal answers every decision with a "not found" refusal, after
// waiting on block when it is set.
type fakeTemporal struct {
	noDeskRunning
	block   chan struct{}
	entered chan struct{} // receives once per call that reached Temporal, when set
	// couponRefusal, when set, is the refusal of every coupon decision
	// (default coupon_type_not_found).
	couponRefusal workflows.Refusal
	mu            sync.Mutex
	calls         int
	signals       int
}

// noDeskRunning is embedded by the fakes whose desks never run: its
// UpdateWorkflow is not found, so each batch goes by Update-With-Start.
type noDeskRunning struct{}

func (noDeskRunning) UpdateWorkflow(context.Context, client.UpdateWorkflowOptions) (client.WorkflowUpdateHandle, error) {
	return nil, serviceerror.NewNotFound("test: no desk running")
}

func (f *fakeTemporal) NewWithStartWorkflowOperation(client.StartWorkflowOptions, any, ...any) client.WithStartWorkflowOperation {
	return nil
}

func (f *fakeTemporal) ExecuteWorkflow(context.Context, client.StartWorkflowOptions, any, ...any) (client.WorkflowRun, error) {
	return nil, errors.New("fake Temporal: no runs")
}

func (f *fakeTemporal) UpdateWithStartWorkflow(ctx context.Context, o client.UpdateWithStartWorkflowOptions) (client.WorkflowUpdateHandle, error) {
	f.mu.Lock()
	f.calls++
	f.mu.Unlock()
	if f.entered != nil {
		f.entered <- struct{}{}
	}
	if f.block != nil {
		select {
		case <-f.block:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	u := fakeUpdate{workflowID: o.UpdateOptions.WorkflowID, couponRefusal: f.couponRefusal}
	if len(o.UpdateOptions.Args) > 0 {
		if b, ok := o.UpdateOptions.Args[0].(workflows.DeskBatch); ok {
			u.claims = len(b.Claims)
		}
	}
	return u, nil
}

func (f *fakeTemporal) SignalWorkflow(context.Context, string, string, string, any) error {
	f.mu.Lock()
	f.signals++
	f.mu.Unlock()
	return nil
}

func (f *fakeTemporal) Calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

// fakeUpdate answers a desk's batch of claims (claims > 0) or one claim
// with a "not found" refusal.
type fakeUpdate struct {
	workflowID    string
	claims        int
	couponRefusal workflows.Refusal
}

func (u fakeUpdate) WorkflowID() string { return u.workflowID }
func (u fakeUpdate) RunID() string      { return "run-1" }
func (u fakeUpdate) UpdateID() string   { return "update-1" }
func (u fakeUpdate) Get(_ context.Context, v any) error {
	switch d := v.(type) {
	case *[]workflows.Decision:
		for range u.claims {
			*d = append(*d, workflows.Decision{Status: workflows.StatusRefused, Refusal: workflows.RefusalCourseNotFound, Message: "no such course"})
		}
	case *workflows.Decision:
		*d = workflows.Decision{Status: workflows.StatusRefused, Refusal: workflows.RefusalCourseNotFound, Message: "no such course"}
	case *workflows.CouponDecision:
		*d = workflows.CouponDecision{Status: workflows.CouponRefused, Refusal: workflows.RefusalCouponTypeNotFound, Message: "no such coupon type"}
		if u.couponRefusal != "" {
			d.Refusal, d.Message = u.couponRefusal, "refused by the fake"
		}
	default:
		return errors.New("fake Temporal: unexpected decision type")
	}
	return nil
}

// unreachablePool is a pool whose every query fails with errNoDatabase.
func unreachablePool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig("postgres://test@127.0.0.1:1/test?sslmode=disable&connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.DialFunc = func(context.Context, string, string) (net.Conn, error) { return nil, errNoDatabase }
	cfg.ConnConfig.Fallbacks = nil
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// logCapture records what the API logged, to tell a 500 caused by the
// missing database (the input passed validation) from any other.
type logCapture struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logCapture) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logCapture) take() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.buf.String()
	l.buf.Reset()
	return s
}

type testAPI struct {
	http.Handler
	temporal *fakeTemporal
	logs     *logCapture
}

// newTestAPI serves the API over the test doubles; a zero sec gets HS256
// with testSecret.
func newTestAPI(t testing.TB, sec Security) *testAPI {
	t.Helper()
	if sec.Auth == nil && !sec.InsecureNoAuth {
		auth, err := NewHS256([]byte(testSecret), JWTOptions{})
		if err != nil {
			t.Fatal(err)
		}
		sec.Auth = auth
	}
	logs := &logCapture{}
	tmp := &fakeTemporal{}
	reg := prometheus.NewRegistry()
	h := New(Config{
		Temporal:        tmp,
		DB:              unreachablePool(t),
		Log:             slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Security:        sec,
		Metrics:         reg,
		Gatherer:        reg,
		DecisionTimeout: 5 * time.Second,
	})
	t.Cleanup(h.Close)
	return &testAPI{Handler: h, temporal: tmp, logs: logs}
}

// engine is the gin router under the API.
func (a *testAPI) engine(t testing.TB) *gin.Engine {
	t.Helper()
	e, ok := a.Handler.(*Handler).Handler.(*gin.Engine)
	if !ok {
		t.Fatalf("the API's handler is %T, not a *gin.Engine", a.Handler.(*Handler).Handler)
	}
	return e
}

func token(t testing.TB, sub, role string, ttl time.Duration) string {
	t.Helper()
	now := time.Now() // one reading: exp - iat is ttl to the second (JWT_MAX_TTL)
	return signHS256(t, testSecret, jwt.MapClaims{"sub": sub, "role": role, "iat": now.Unix(), "exp": now.Add(ttl).Unix()})
}

func signHS256(t testing.TB, secret string, claims jwt.MapClaims) string {
	t.Helper()
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString([]byte(secret))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// request is one call to the API; the path and query are used as they are
// (no URL parsing), so fuzzers can put anything in them.
type request struct {
	method, path, query string
	contentType         string
	body                []byte
	authorization       string
}

func (a *testAPI) serve(r request) *httptest.ResponseRecorder {
	req, err := http.NewRequest(r.method, "http://api.test/", bytes.NewReader(r.body))
	if err != nil {
		panic(err) // the method is always one of ours
	}
	req.URL.Path, req.URL.RawQuery = r.path, r.query
	if r.contentType != "" {
		req.Header.Set("Content-Type", r.contentType)
	}
	if r.authorization != "" {
		req.Header.Set("Authorization", r.authorization)
	}
	rec := httptest.NewRecorder()
	a.ServeHTTP(rec, req)
	return rec
}

// call sends JSON with a bearer token.
func (a *testAPI) call(method, path, bearer string, body any) *httptest.ResponseRecorder {
	var raw []byte
	if body != nil {
		var err error
		if raw, err = json.Marshal(body); err != nil {
			panic(err)
		}
	}
	r := request{method: method, path: path, body: raw, contentType: "application/json"}
	if i := strings.IndexByte(path, '?'); i >= 0 {
		r.path, r.query = path[:i], path[i+1:]
	}
	if bearer != "" {
		r.authorization = "Bearer " + bearer
	}
	return a.serve(r)
}

// errorOf decodes the error envelope, failing when the body is not one.
func errorOf(t testing.TB, rec *httptest.ResponseRecorder) apiError {
	t.Helper()
	var body struct {
		Error *apiError `json:"error"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || body.Error == nil {
		t.Fatalf("answer %d is not an error envelope: %q", rec.Code, rec.Body.String())
	}
	if body.Error.Code == "" || body.Error.Message == "" {
		t.Fatalf("answer %d has an error without code or message: %q", rec.Code, rec.Body.String())
	}
	return *body.Error
}

// checkAnswer is the property every fuzzer asserts: no panic, no 5xx other
// than the test database being absent after the input passed validation,
// and every error in the standard envelope.
func (a *testAPI) checkAnswer(t *testing.T, r request, rec *httptest.ResponseRecorder) {
	t.Helper()
	logs := a.logs.take()
	if rec.Code >= 500 {
		if rec.Code != http.StatusInternalServerError || !strings.Contains(logs, errNoDatabase.Error()) {
			t.Fatalf("%s %q?%q (content-type %q, body %q) = %d %s\nlog: %s",
				r.method, r.path, r.query, r.contentType, r.body, rec.Code, rec.Body.String(), logs)
		}
	}
	if rec.Code >= 400 {
		e := errorOf(t, rec)
		if rec.Code == http.StatusUnauthorized && rec.Header().Get("WWW-Authenticate") == "" {
			t.Fatalf("401 (%s) without WWW-Authenticate", e.Code)
		}
	}
}
