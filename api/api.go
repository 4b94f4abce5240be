// Package api is claimflow's HTTP interface: it starts and signals Temporal
// workflows for claims and answers status queries from Postgres.
package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/contrib/instrumentation/github.com/gin-gonic/gin/otelgin"
	"go.temporal.io/sdk/client"

	"github.com/claimflow/claimflow/internal/tracing"
	"github.com/claimflow/claimflow/workflows"
)

// Temporal is the part of the Temporal client the API uses.
type Temporal interface {
	NewWithStartWorkflowOperation(options client.StartWorkflowOptions, workflow any, args ...any) client.WithStartWorkflowOperation
	UpdateWithStartWorkflow(ctx context.Context, options client.UpdateWithStartWorkflowOptions) (client.WorkflowUpdateHandle, error)
	UpdateWorkflow(ctx context.Context, options client.UpdateWorkflowOptions) (client.WorkflowUpdateHandle, error)
	SignalWorkflow(ctx context.Context, workflowID, runID, signalName string, arg any) error
	ExecuteWorkflow(ctx context.Context, options client.StartWorkflowOptions, workflow any, args ...any) (client.WorkflowRun, error)
}

// Check reports whether one dependency is reachable, for /readyz.
type Check func(ctx context.Context) error

// Config wires the API to its dependencies.
type Config struct {
	Temporal Temporal
	DB       *pgxpool.Pool
	Log      *slog.Logger
	// UIURL and Namespace build links to runs in the Temporal Web UI.
	UIURL     string
	Namespace string
	// Checks are run by /readyz, by name, at most once a second.
	Checks map[string]Check
	// SeparateInternal serves /metrics only on Handler.Internal (the
	// service runs it on INTERNAL_HTTP_ADDR); otherwise the public handler
	// serves it too. Handler.Internal is the only /readyz that shows why a
	// check failed.
	SeparateInternal bool
	// DecisionTimeout is the least a request waits for its claim to be
	// decided; it waits longer when the workflow's own options let the
	// decision take longer (workflows.DecisionDeadline, see decisionWait).
	DecisionTimeout time.Duration
	// PayoutTimeout is the PAYOUT_TIMEOUT the workers run with: a use's
	// run sizes its payout attempts by it, and a use request waits as long
	// as workflows.DecisionDeadline derives from it.
	PayoutTimeout time.Duration
	// ConfirmTimeout bounds ?wait=confirmed.
	ConfirmTimeout time.Duration
	// RequestTimeout bounds a request's own database and Temporal calls
	// (default 5 s); a route that waits for a claim's decision gets that
	// wait on top (routeBound), so no documented wait is ever cut short.
	RequestTimeout time.Duration
	// Batching tunes how enrollment claims are collected into batches and
	// sent to the desks; zero fields take internal/config's defaults.
	Batching BatchOptions
	// Metrics receives the API's metrics and Gatherer serves /metrics;
	// nil means a private registry.
	Metrics  prometheus.Registerer
	Gatherer prometheus.Gatherer
	// Security is authentication, authorization and load limits of /v1
	// (auth.go, policy.go, ratelimit.go).
	Security Security
}

type server struct {
	cfg      Config
	db       requestDB // the handlers' queries, bounded by the request
	temporal Temporal
	log      *slog.Logger
	metrics  *metrics
	batcher  *claimBatcher
	settled  *settledHub // ?wait=confirmed waiters
}

// Handler is the API; Close stops its claim batcher after the HTTP server
// has drained.
type Handler struct {
	http.Handler
	// Internal serves /healthz, /readyz with each failed check's error,
	// and /metrics: the address of probes and scrapes, not of clients.
	Internal http.Handler
	close    func()
	longest  time.Duration
}

func (h *Handler) Close() {
	if h.close != nil {
		h.close()
	}
}

// New returns the HTTP handler.
func New(cfg Config) *Handler {
	if cfg.DecisionTimeout == 0 {
		cfg.DecisionTimeout = 15 * time.Second
	}
	if cfg.ConfirmTimeout == 0 {
		cfg.ConfirmTimeout = 10 * time.Second
	}
	if cfg.RequestTimeout == 0 {
		cfg.RequestTimeout = 5 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Metrics == nil {
		reg := prometheus.NewRegistry()
		cfg.Metrics, cfg.Gatherer = reg, reg
	}
	s := &server{cfg: cfg, db: requestDB{pool: cfg.DB}, temporal: cfg.Temporal, log: cfg.Log}
	s.metrics = newMetrics(s)
	s.settled = newSettledHub(cfg.DB, cfg.Security.MaxConfirmWaiters, func(err error) {
		cfg.Log.Warn("enrollment_settled listener lost; reconnecting", "err", err)
	}, cfg.Metrics)
	s.batcher = newClaimBatcher(cfg.Temporal, cfg.Log.With("component", "batcher"), s.metrics, cfg.Batching,
		s.decisionWait(workflows.ClaimEnrollment))
	closeFn := func() { s.batcher.close(); s.settled.close() }
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	// The gin context is what handlers pass to Postgres and Temporal; with
	// the fallback its Done and Deadline are the request's, so the
	// deadline the bound middleware sets reaches every call.
	r.ContextWithFallback = true
	if tracing.On() {
		// The request's span comes first, so the metrics' exemplars and the
		// access log carry its trace.
		r.Use(otelgin.Middleware("claimflow-api"), answerTraceParent)
	}
	r.Use(gin.Recovery(), s.metrics.middleware, s.accessLog, s.bound)
	r.HandleMethodNotAllowed = true
	r.NoRoute(func(c *gin.Context) { writeError(c, http.StatusNotFound, "not_found", "no such route", "") })
	r.NoMethod(func(c *gin.Context) {
		writeError(c, http.StatusMethodNotAllowed, "method_not_allowed", "method not allowed on this route", "")
	})

	ready := &readiness{checks: cfg.Checks, now: time.Now, onFail: func(name string, err error) {
		cfg.Log.Warn("readiness check failed", "check", name, "err", err)
	}}
	healthz := func(c *gin.Context) { c.JSON(http.StatusOK, gin.H{"status": "ok"}) }
	r.GET("/healthz", healthz)
	r.GET("/readyz", ready.handler(false))
	if !cfg.SeparateInternal {
		r.GET("/metrics", metricsHandler(cfg.Gatherer))
	}
	r.GET("/openapi.json", serveOpenAPI)

	internal := gin.New()
	internal.Use(gin.Recovery())
	internal.GET("/healthz", healthz)
	internal.GET("/readyz", ready.handler(true))
	internal.GET("/metrics", metricsHandler(cfg.Gatherer))
	// Profiles (heap, CPU, goroutines) for operators, never on the public
	// address: they reveal internals and a CPU profile costs CPU.
	internal.Any("/debug/pprof/*profile", gin.WrapF(servePprof))

	v1 := r.Group("/v1", s.guard())
	v1.POST("/courses", s.createCourse)
	v1.GET("/courses/:id", s.getCourse)
	v1.PATCH("/courses/:id", s.patchCourse)
	v1.POST("/courses/:id/enrollments", s.enroll)
	v1.GET("/courses/:id/enrollments", s.listRoster)
	v1.GET("/students/:id/enrollments", s.listStudentEnrollments)
	v1.GET("/enrollments/:id", s.getEnrollment)
	v1.DELETE("/enrollments/:id", s.cancelEnrollment)
	v1.GET("/dead-letters", s.listDeadLetters)
	v1.GET("/dead-letters/:id", s.getDeadLetter)
	v1.POST("/dead-letters/:id/retry", s.retryDeadLetter)
	v1.POST("/dead-letters/:id/compensate", s.compensateDeadLetter)
	v1.POST("/dead-letters/retry", s.retryDeadLetters)
	v1.POST("/dead-letters/compensate", s.compensateDeadLetters)
	v1.POST("/vendors", s.createVendor)
	v1.GET("/vendors/:id", s.getVendor)
	v1.POST("/coupon-types", s.createCouponType)
	v1.GET("/coupon-types/:id", s.getCouponType)
	v1.POST("/coupon-types/:id/coupons", s.issueCoupon)
	v1.GET("/coupons/:id", s.getCoupon)
	v1.POST("/coupons/:id/use", s.useCoupon)
	v1.GET("/users/:id/coupons", s.listUserCoupons)
	v1.GET("/users/:id/notifications", s.listNotifications)
	v1.POST("/users/:id/notifications/read", s.readAllNotifications)
	v1.POST("/notifications/:id/read", s.readNotification)
	h := &Handler{Handler: r, Internal: internal, close: closeFn}
	for _, rt := range r.Routes() {
		h.longest = max(h.longest, s.routeBound(rt.Method, rt.Path))
	}
	return h
}

func (s *server) accessLog(c *gin.Context) {
	start := time.Now()
	c.Next()
	if c.Writer.Status() >= 500 {
		s.log.Error("request failed", "method", c.Request.Method, "path", c.FullPath(),
			"status", c.Writer.Status(), "took", time.Since(start), "errors", c.Errors.String())
	}
}

// requestDB is the pool as the handlers see it: a *gin.Context handed to
// it is replaced by its request's context, which carries the same deadline
// (bound). pgxpool keeps the context it was given for a connection it goes
// on opening after the caller gave up, and gin recycles its Context for
// the next request: that connection attempt would read another request's
// fields (a data race, and a cancellation tied to the wrong request).
type requestDB struct{ pool *pgxpool.Pool }

func requestContext(ctx context.Context) context.Context {
	if c, ok := ctx.(*gin.Context); ok && c.Request != nil {
		return c.Request.Context()
	}
	return ctx
}

func (d requestDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return d.pool.Exec(requestContext(ctx), sql, args...)
}

func (d requestDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return d.pool.Query(requestContext(ctx), sql, args...)
}

func (d requestDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return d.pool.QueryRow(requestContext(ctx), sql, args...)
}

// bound puts the route's deadline on the request's context (routeBound):
// a stalled database or Temporal answers 503 instead of holding the
// request without end.
func (s *server) bound(c *gin.Context) {
	ctx, cancel := context.WithTimeout(c.Request.Context(), s.routeBound(c.Request.Method, c.FullPath()))
	defer cancel()
	c.Request = c.Request.WithContext(ctx)
	c.Next()
}

// routeBound is RequestTimeout plus the longest wait the route documents:
// the decision of a claim (DecisionTimeout), a coupon use's payout policy
// (couponUseWait), and for an enrollment the ?wait=confirmed bound too.
func (s *server) routeBound(method, route string) time.Duration {
	switch method + " " + route {
	case "POST /v1/courses/:id/enrollments":
		return s.cfg.RequestTimeout + s.decisionWait(workflows.ClaimEnrollment) + s.cfg.ConfirmTimeout
	case "POST /v1/coupon-types/:id/coupons":
		return s.cfg.RequestTimeout + s.decisionWait(workflows.ClaimIssueCoupon)
	case "POST /v1/coupons/:id/use":
		return s.cfg.RequestTimeout + s.decisionWait(workflows.ClaimUseCoupon)
	}
	if strings.HasPrefix(route, "/v1/") && policyOf(method, route).claim {
		return s.cfg.RequestTimeout + s.cfg.DecisionTimeout
	}
	return s.cfg.RequestTimeout
}

// LongestRequest is the longest bound of any route: the HTTP server's
// write timeout must outlast it, or an answer is cut off mid-write.
func (h *Handler) LongestRequest() time.Duration { return h.longest }

// apiError is the body of every error: {"error":{"code","message","field"?}}.
type apiError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Field   string `json:"field,omitempty"`
}

func writeError(c *gin.Context, status int, code, message, field string) {
	c.AbortWithStatusJSON(status, gin.H{"error": apiError{Code: code, Message: message, Field: field}})
}

// internalError hides the cause from the client but logs it with the route.
// A failure after the request's deadline passed is the deadline's doing (a
// stalled dependency), so it answers 503 like any other dependency that did
// not answer in time.
func (s *server) internalError(c *gin.Context, err error) {
	if c.Request.Context().Err() != nil {
		s.unavailable(c, err)
		return
	}
	_ = c.Error(err)
	writeError(c, http.StatusInternalServerError, "internal", "internal error; the server log has the cause", "")
}

// unavailable answers 503 for dependencies that are down or slow, so clients
// retry later instead of treating it as a bug.
func (s *server) unavailable(c *gin.Context, err error) {
	_ = c.Error(err)
	c.Header("Retry-After", "1")
	writeError(c, http.StatusServiceUnavailable, "unavailable", "a dependency did not answer in time; retry later", "")
}

const maxBodyBytes = 64 << 10

// decodeJSON reads a JSON object strictly: unknown fields and trailing data
// are errors naming what was wrong. It writes the 4xx itself.
func decodeJSON(c *gin.Context, dst any) bool {
	if ct := c.ContentType(); ct != "application/json" && ct != "" {
		writeError(c, http.StatusUnsupportedMediaType, "unsupported_media_type", "send application/json", "")
		return false
	}
	dec := json.NewDecoder(http.MaxBytesReader(c.Writer, c.Request.Body, maxBodyBytes))
	dec.DisallowUnknownFields()
	err := dec.Decode(dst)
	if err == nil {
		// Only whitespace may follow; dec.More alone lets a stray "]" or "}" through.
		if _, next := dec.Token(); !errors.Is(next, io.EOF) {
			var tooBig *http.MaxBytesError
			if err = next; !errors.As(next, &tooBig) {
				err = errors.New("unexpected data after the JSON object")
			}
		}
	}
	if err == nil {
		return true
	}
	var (
		typeErr *json.UnmarshalTypeError
		tooBig  *http.MaxBytesError
		syntax  *json.SyntaxError
	)
	switch {
	case errors.As(err, &tooBig):
		writeError(c, http.StatusRequestEntityTooLarge, "body_too_large", fmt.Sprintf("body exceeds %d bytes", maxBodyBytes), "")
	case errors.As(err, &typeErr) && typeErr.Field == "":
		writeError(c, http.StatusBadRequest, "invalid_json", "the body must be a JSON object", "")
	case errors.As(err, &typeErr):
		writeError(c, http.StatusBadRequest, "invalid_field", fmt.Sprintf("%s must be %s", typeErr.Field, typeErr.Type), typeErr.Field)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		field := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		writeError(c, http.StatusBadRequest, "unknown_field", fmt.Sprintf("unknown field %q", field), field)
	case errors.Is(err, io.EOF):
		writeError(c, http.StatusBadRequest, "invalid_json", "request body is empty; send a JSON object", "")
	case errors.As(err, &syntax):
		writeError(c, http.StatusBadRequest, "invalid_json", fmt.Sprintf("malformed JSON at byte %d", syntax.Offset), "")
	default:
		writeError(c, http.StatusBadRequest, "invalid_json", err.Error(), "")
	}
	return false
}

// IDs appear in workflow IDs, Kafka keys and URLs; this alphabet keeps them
// unambiguous in all three (":" separates workflow ID parts).
var idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

func validID(c *gin.Context, field, value string) bool {
	if value == "" {
		writeError(c, http.StatusBadRequest, "missing_field", field+" is required", field)
		return false
	}
	if !idPattern.MatchString(value) {
		writeError(c, http.StatusBadRequest, "invalid_field",
			field+" must be 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit", field)
		return false
	}
	return true
}

// runURL links to a run in the Temporal Web UI.
func (s *server) runURL(workflowID, runID string) string {
	if s.cfg.UIURL == "" {
		return ""
	}
	return fmt.Sprintf("%s/namespaces/%s/workflows/%s/%s/history", strings.TrimRight(s.cfg.UIURL, "/"),
		url.PathEscape(s.cfg.Namespace), url.PathEscape(workflowID), url.PathEscape(runID))
}

// loadByID answers the common part of a GET of one resource: a valid ID,
// 404 with notFound when there is no such row, 500 on any other error.
func loadByID[T any](s *server, c *gin.Context, notFound, what string, load func(context.Context, string) (T, error)) (T, bool) {
	var zero T
	id := c.Param("id")
	if !validID(c, "id", id) {
		return zero, false
	}
	got, err := load(c, id)
	if errors.Is(err, pgx.ErrNoRows) {
		writeError(c, http.StatusNotFound, notFound, "no "+what+" with this id", "id")
		return zero, false
	}
	if err != nil {
		s.internalError(c, err)
		return zero, false
	}
	return got, true
}

// answerTraceParent names the request's trace in a traceparent response
// header: where an operator starts to follow a claim.
func answerTraceParent(c *gin.Context) {
	if tp := tracing.TraceParent(c.Request.Context()); tp != "" {
		c.Header("traceparent", tp)
	}
}
