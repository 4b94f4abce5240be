package main

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/claimflow/claimflow/workflows"
)

// TestBoundedWork runs issue 13's "bounded work per request" on the real
// stack, against a second API process configured for it: a stalled table
// answers 503 within REQUEST_TIMEOUT instead of holding the request;
// ?wait=confirmed is woken by the enrollment_settled notification, and
// beyond MAX_CONFIRM_WAITERS answers 202 at once; /metrics is served on
// INTERNAL_HTTP_ADDR and not on the public address.
func TestBoundedWork(t *testing.T) {
	if testing.Short() {
		t.Skip("real stack")
	}
	s := testStack(t, dataDir(t))
	admin := newAPIClient(t, s)

	cfg := s.Config
	cfg.HTTPAddr = "127.0.0.1:0"
	cfg.InternalHTTPAddr = "127.0.0.1:0"
	cfg.RequestTimeout = time.Second
	cfg.Security.MaxConfirmWaiters = 1
	svc, err := startAPI(cfg, s.Log, s.Pool, s.Client, newTelemetry())
	if err != nil {
		t.Fatalf("start the bounded API: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := svc.Stop(ctx); err != nil {
			t.Errorf("stop the bounded API: %v", err)
		}
	})
	c := *admin
	c.t, c.base = t, "http://"+svc.Addr
	internal := c
	internal.base = "http://" + svc.InternalAddr

	admin.must("POST", "/v1/courses", map[string]any{"id": "bnd101", "title": "Bounds", "capacity": 10}, http.StatusCreated)

	t.Run("internal address", func(t *testing.T) {
		if status, _, err := c.do("GET", "/metrics", nil); err != nil || status != http.StatusNotFound {
			t.Fatalf("public /metrics = %d %v, want 404 with INTERNAL_HTTP_ADDR set", status, err)
		}
		metricsText(t, &internal)
		for _, cl := range []*apiClient{&c, &internal} {
			if status, body, err := cl.do("GET", "/readyz", nil); err != nil || status != http.StatusOK {
				t.Fatalf("%s/readyz = %d %v %v", cl.base, status, body, err)
			}
		}
	})

	t.Run("stalled table answers 503 within the bound", func(t *testing.T) {
		ctx := context.Background()
		tx, err := s.Pool.BeginTx(ctx, pgx.TxOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if _, err := tx.Exec(ctx, "LOCK TABLE courses IN ACCESS EXCLUSIVE MODE"); err != nil {
			t.Fatal(err)
		}
		began := time.Now()
		status, body, err := c.do("GET", "/v1/courses/bnd101", nil)
		took := time.Since(began)
		if err != nil || status != http.StatusServiceUnavailable || errorCode(body) != "unavailable" {
			t.Fatalf("GET a locked course = %d %v %v, want 503 unavailable", status, body, err)
		}
		if took < cfg.RequestTimeout || took > cfg.RequestTimeout+3*time.Second {
			t.Fatalf("answered after %s, want about REQUEST_TIMEOUT (%s)", took, cfg.RequestTimeout)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		c.must("GET", "/v1/courses/bnd101", nil, http.StatusOK)
	})

	t.Run("wait=confirmed is woken and bounded", func(t *testing.T) {
		removeFault := failProduces(t, s, workflows.EnrollmentTopic)
		var (
			wg      sync.WaitGroup
			waited  map[string]any
			status  int
			doErr   error
			elapsed time.Duration
		)
		wg.Go(func() {
			began := time.Now()
			status, waited, doErr = c.do("POST", "/v1/courses/bnd101/enrollments?wait=confirmed", map[string]any{"student_id": "wait-1"})
			elapsed = time.Since(began)
		})
		waitFor(t, 20*time.Second, "the first request to wait", func() bool {
			return metricValue(metricsText(t, &internal), "claimflow_confirm_waiters") == 1
		})
		// The only waiter's slot is taken: the second answers at once.
		began := time.Now()
		second := c.must("POST", "/v1/courses/bnd101/enrollments?wait=confirmed", map[string]any{"student_id": "wait-2"}, http.StatusAccepted)
		if second["status"] != "reserved" || time.Since(began) > 3*time.Second {
			t.Fatalf("beyond MAX_CONFIRM_WAITERS: %v after %s, want 202 reserved at once", second, time.Since(began))
		}
		time.Sleep(500 * time.Millisecond)
		removeFault()
		wg.Wait()
		if doErr != nil || status != http.StatusCreated || waited["status"] != "confirmed" {
			t.Fatalf("the waiting request = %d %v %v (after %s), want 201 confirmed", status, waited, doErr, elapsed)
		}
		t.Logf("the waiter was answered confirmed after %s", elapsed)
		if n := metricValue(metricsText(t, &internal), "claimflow_confirm_waiters"); n != 0 {
			t.Fatalf("%v waiters left after the answer", n)
		}
	})
}
