package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.temporal.io/sdk/client"

	"github.com/claimflow/claimflow/workflows"
)

// undecidedTemporal stands for a Temporal whose desks do not decide within
// the wait. It records the claims of every batch sent to a desk.
type undecidedTemporal struct {
	noDeskRunning
	// refuse: the call fails at once (Temporal did not take the batch).
	refuse error
	// block: the call waits until its context ends (then fails) or release
	// is closed (then the update is accepted); otherwise it is accepted at
	// once. An accepted update never decides.
	block   bool
	release chan struct{}
	entered chan struct{} // receives once per call, when set

	mu     sync.Mutex
	claims [][]workflows.EnrollmentInput
}

func (f *undecidedTemporal) NewWithStartWorkflowOperation(client.StartWorkflowOptions, any, ...any) client.WithStartWorkflowOperation {
	return nil
}

func (f *undecidedTemporal) ExecuteWorkflow(context.Context, client.StartWorkflowOptions, any, ...any) (client.WorkflowRun, error) {
	return nil, errors.New("undecidedTemporal: no runs")
}

func (f *undecidedTemporal) UpdateWithStartWorkflow(ctx context.Context, o client.UpdateWithStartWorkflowOptions) (client.WorkflowUpdateHandle, error) {
	in, ok := o.UpdateOptions.Args[0].(workflows.DeskBatch)
	if !ok {
		return nil, errors.New("test: no batch in the update")
	}
	f.mu.Lock()
	f.claims = append(f.claims, in.Claims)
	f.mu.Unlock()
	if f.entered != nil {
		f.entered <- struct{}{}
	}
	if f.refuse != nil {
		return nil, f.refuse
	}
	if f.block {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-f.release:
		}
	}
	return undecidedUpdate{workflowID: o.UpdateOptions.WorkflowID}, nil
}

func (f *undecidedTemporal) SignalWorkflow(context.Context, string, string, string, any) error {
	return errors.New("test: no signals")
}

// students lists, per batch sent to a desk, the students of its claims.
func (f *undecidedTemporal) students() [][]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out [][]string
	for _, run := range f.claims {
		var s []string
		for _, c := range run {
			s = append(s, c.StudentID)
		}
		out = append(out, s)
	}
	return out
}

// enrollmentIDs lists the enrollment IDs of every claim that reached a desk.
func (f *undecidedTemporal) enrollmentIDs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, run := range f.claims {
		for _, c := range run {
			out = append(out, c.EnrollmentID)
		}
	}
	return out
}

func newUndecidedAPI(t *testing.T, tmp *undecidedTemporal, batching BatchOptions) http.Handler {
	t.Helper()
	auth, err := NewHS256([]byte(testSecret), JWTOptions{})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	h := New(Config{Temporal: tmp, DB: unreachablePool(t), Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Security: Security{Auth: auth}, Metrics: reg, Gatherer: reg, DecisionTimeout: 5 * time.Second,
		Batching: batching})
	t.Cleanup(h.Close)
	return h
}

// enrollWithin posts an enrollment of student in cs101 whose request gives
// up after within (0: the API's own bound).
func enrollWithin(t *testing.T, h http.Handler, student string, within time.Duration) *httptest.ResponseRecorder {
	t.Helper()
	ctx := context.Background()
	if within > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, within)
		defer cancel()
	}
	body, _ := json.Marshal(map[string]string{"student_id": student})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://api.test/v1/courses/cs101/enrollments", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token(t, student, "", time.Hour))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// checkPending holds a 202 to its promise: the claim a desk holds, named by
// the enrollment ID the desk was given, with its status URL.
func checkPending(t *testing.T, rec *httptest.ResponseRecorder, tmp *undecidedTemporal, wantRun string) {
	t.Helper()
	if rec.Code != http.StatusAccepted {
		t.Fatalf("= %d %s, want 202", rec.Code, rec.Body.String())
	}
	var body map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatal(err)
	}
	id, _ := body["id"].(string)
	if !slices.Contains(tmp.enrollmentIDs(), id) {
		t.Fatalf("202 names enrollment %q; the desks hold %v", id, tmp.enrollmentIDs())
	}
	statusURL := "/v1/enrollments/" + id
	if body["status"] != "pending" || body["status_url"] != statusURL || rec.Header().Get("Location") != statusURL ||
		body["course_id"] != "cs101" || body["run_id"] != wantRun || body["workflow_id"] == "" {
		t.Errorf("202 with Location %q and %v, want the enrollment's status URL %s and run %q",
			rec.Header().Get("Location"), body, statusURL, wantRun)
	}
}

func checkUnavailable(t *testing.T, rec *httptest.ResponseRecorder) {
	t.Helper()
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("= %d (Retry-After %q) %s, want 503 with Retry-After", rec.Code, rec.Header().Get("Retry-After"), rec.Body.String())
	}
	if e := errorOf(t, rec); e.Code != "unavailable" {
		t.Errorf("error %+v, want unavailable", e)
	}
}

// An enrollment whose desk holds the claim but did not decide within the
// wait answers 202 with the enrollment's status URL; one Temporal did not
// take, or did not report taking within the wait, answers 503.
func TestUndecidedEnrollmentAnswers202WithItsStatusURL(t *testing.T) {
	refused := errors.New("test: frontend unavailable")
	tests := []struct {
		name     string
		temporal *undecidedTemporal
		// within: how long the request waits (0: the derived wait, which
		// the fake's answer makes moot).
		within  time.Duration
		wantRun string // "" wants 503
	}{
		{name: "the desk accepted the batch, no decision",
			temporal: &undecidedTemporal{}, wantRun: "run-use"},
		{name: "Temporal refused the batch",
			temporal: &undecidedTemporal{refuse: refused}},
		{name: "the desk's acceptance never reported",
			temporal: &undecidedTemporal{block: true}, within: 300 * time.Millisecond},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.temporal.release = make(chan struct{})
			h := newUndecidedAPI(t, tc.temporal, BatchOptions{})
			t.Cleanup(func() { close(tc.temporal.release) })
			rec := enrollWithin(t, h, "s-1", tc.within)
			if tc.wantRun == "" {
				checkUnavailable(t, rec)
				return
			}
			checkPending(t, rec, tc.temporal, tc.wantRun)
		})
	}
}

// A claim whose request gave up while it waited for a free desk is answered
// 503 and never reaches a desk: a 503 must not hide a claim that goes on.
func TestWithdrawnBatchClaimNeverReachesARun(t *testing.T) {
	tmp := &undecidedTemporal{block: true, release: make(chan struct{}), entered: make(chan struct{}, 8)}
	h := newUndecidedAPI(t, tmp, BatchOptions{Desks: 1})
	first := make(chan *httptest.ResponseRecorder, 1)
	go func() { first <- enrollWithin(t, h, "s-1", 300*time.Millisecond) }()
	select {
	case <-tmp.entered: // s-1's batch holds the only desk
	case <-time.After(10 * time.Second):
		t.Fatal("the first batch never reached Temporal")
	}
	checkUnavailable(t, enrollWithin(t, h, "s-2", 300*time.Millisecond))
	// Taken into a batch whose acceptance was never reported: 503 too.
	checkUnavailable(t, <-first)
	close(tmp.release)
	// FIFO: s-2's batch, if it went out, went out before or with s-3's.
	checkPending(t, enrollWithin(t, h, "s-3", 0), tmp, "run-use")
	for _, run := range tmp.students() {
		if slices.Contains(run, "s-2") {
			t.Fatalf("the desks were sent %v: the withdrawn claim of s-2 reached a desk", tmp.students())
		}
	}
	if got := tmp.students(); len(got) != 2 {
		t.Fatalf("the desks were sent %v, want s-1's and s-3's", got)
	}
}
