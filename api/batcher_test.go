package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/claimflow/claimflow/workflows"
)

func claim(course, student string) *pendingClaim {
	return &pendingClaim{in: workflows.EnrollmentInput{CourseID: course, StudentID: student}}
}

// A batch run lists its students and courses in search attributes whose
// values Temporal caps in size; the builder must close a batch before a
// value would pass the cap, whatever the claim count allows.
func TestBatchBuilderKeepsSearchAttributesWithinTheirLimit(t *testing.T) {
	tests := []struct {
		name      string
		opts      BatchOptions
		claims    []*pendingClaim
		wantAdded int
	}{
		{
			name:      "claim count bounds the batch",
			opts:      BatchOptions{MaxBatch: 3, MaxAttrBytes: 2000},
			claims:    []*pendingClaim{claim("c", "a"), claim("c", "b"), claim("c", "d"), claim("c", "e")},
			wantAdded: 3,
		},
		{
			name: "student list bytes bound the batch",
			// 64-byte IDs cost 67 bytes each: 29 fit in 2000.
			opts: BatchOptions{MaxBatch: 250, MaxAttrBytes: 2000},
			claims: func() []*pendingClaim {
				var out []*pendingClaim
				for i := range 40 {
					out = append(out, claim("c", fmt.Sprintf("%064d", i)))
				}
				return out
			}(),
			wantAdded: 29,
		},
		{
			name: "course list bytes bound the batch",
			opts: BatchOptions{MaxBatch: 250, MaxAttrBytes: 200},
			claims: func() []*pendingClaim {
				var out []*pendingClaim
				for i := range 10 {
					out = append(out, claim(strings.Repeat("x", 40)+fmt.Sprint(i), "s"))
				}
				return out
			}(),
			wantAdded: 4, // 4 × 44 = 176; a fifth would make 220
		},
		{
			name:      "a repeated student or course costs nothing more",
			opts:      BatchOptions{MaxBatch: 250, MaxAttrBytes: 10},
			claims:    []*pendingClaim{claim("c", "abc"), claim("c", "abc"), claim("c", "abc")},
			wantAdded: 3,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := newBatchBuilder(tc.opts)
			for _, p := range tc.claims {
				if len(b.claims) > 0 && !b.fits(p) {
					break
				}
				b.add(p)
			}
			if len(b.claims) != tc.wantAdded {
				t.Fatalf("batch holds %d claims, want %d", len(b.claims), tc.wantAdded)
			}
			if b.studentBytes > tc.opts.MaxAttrBytes || b.courseBytes > tc.opts.MaxAttrBytes {
				t.Fatalf("attribute bytes %d/%d exceed %d", b.studentBytes, b.courseBytes, tc.opts.MaxAttrBytes)
			}
		})
	}
}

// decidingTemporal decides every claim of a batch run (course_not_found, so
// the handler answers without a database).
type decidingTemporal struct{ undecidedTemporal }

func (f *decidingTemporal) UpdateWithStartWorkflow(ctx context.Context, o client.UpdateWithStartWorkflowOptions) (client.WorkflowUpdateHandle, error) {
	op, ok := o.StartWorkflowOperation.(*fakeStart)
	if !ok {
		return nil, errors.New("test: no start operation")
	}
	close(op.called)
	return decidedBatch{claims: len(op.claims)}, nil
}

type decidedBatch struct {
	client.WorkflowUpdateHandle
	claims int
}

func (u decidedBatch) RunID() string { return "run-1" }
func (u decidedBatch) Get(_ context.Context, v any) error {
	d, ok := v.(*[]workflows.Decision)
	if !ok {
		return errors.New("test: not a batch decision")
	}
	for range u.claims {
		*d = append(*d, workflows.Decision{Status: workflows.StatusRefused, Refusal: workflows.RefusalCourseNotFound})
	}
	return nil
}

// A batcher built without metrics (nil) decides as one built by New.
func TestBatcherWithoutMetrics(t *testing.T) {
	b := newClaimBatcher(&decidingTemporal{}, slog.New(slog.DiscardHandler), nil, BatchOptions{}, 5*time.Second)
	defer b.close()
	r, err := b.submit(context.Background(), workflows.EnrollmentInput{CourseID: "c", StudentID: "s"})
	if err != nil || r.decision.Refusal != workflows.RefusalCourseNotFound {
		t.Fatalf("submit = %+v, %v", r, err)
	}
}

// Every claim's wait, every batch's size and call, and every answer the
// handler wrote are observed, so the load tool's stage table adds up.
func TestBatcherObservesWaitsCallsAndAnswers(t *testing.T) {
	auth, err := NewHS256([]byte(testSecret), JWTOptions{})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	h := New(Config{Temporal: &decidingTemporal{}, DB: unreachablePool(t), Log: slog.New(slog.DiscardHandler),
		Security: Security{Auth: auth}, Metrics: reg, Gatherer: reg, DecisionTimeout: 5 * time.Second,
		Batching: &BatchOptions{}})
	defer h.Close()
	const claims = 12
	var wg sync.WaitGroup
	for i := range claims {
		wg.Go(func() {
			if rec := enrollWithin(t, h, fmt.Sprintf("s%d", i), 0); rec.Code != http.StatusNotFound {
				t.Errorf("claim %d = %d %s, want 404 course_not_found", i, rec.Code, rec.Body.String())
			}
		})
	}
	wg.Wait()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*dto.Histogram{}
	for _, f := range families {
		if f.GetType() == dto.MetricType_HISTOGRAM && len(f.Metric) == 1 {
			got[f.GetName()] = f.Metric[0].GetHistogram()
		}
	}
	calls := got["claimflow_claim_batch_call_seconds"].GetSampleCount()
	for name, want := range map[string]uint64{
		"claimflow_claim_batch_wait_seconds": claims,
		"claimflow_claim_answer_seconds":     claims,
		"claimflow_claim_batch_claims":       calls, // one per batch
	} {
		if n := got[name].GetSampleCount(); n != want {
			t.Errorf("%s counted %d, want %d", name, n, want)
		}
	}
	if calls < 1 || calls > claims {
		t.Errorf("%d batch calls for %d claims", calls, claims)
	}
	if sum := got["claimflow_claim_batch_claims"].GetSampleSum(); sum != claims {
		t.Errorf("batches held %v claims in all, want %d", sum, claims)
	}
}

// gatedTemporal decides each batch run (course_not_found) only when the
// test releases it, and records each run's claim count and how many runs
// were under way at once.
type gatedTemporal struct {
	undecidedTemporal
	release chan struct{}
	entered chan int // receives each run's claim count as it starts

	mu           sync.Mutex
	running, max int
	sizes        []int
}

func (f *gatedTemporal) UpdateWithStartWorkflow(ctx context.Context, o client.UpdateWithStartWorkflowOptions) (client.WorkflowUpdateHandle, error) {
	op, ok := o.StartWorkflowOperation.(*fakeStart)
	if !ok {
		return nil, errors.New("test: no start operation")
	}
	f.mu.Lock()
	f.running++
	f.max = max(f.max, f.running)
	f.sizes = append(f.sizes, len(op.claims))
	f.mu.Unlock()
	close(op.called)
	f.entered <- len(op.claims)
	select {
	case <-f.release:
	case <-ctx.Done():
	}
	f.mu.Lock()
	f.running--
	f.mu.Unlock()
	return decidedBatch{claims: len(op.claims)}, ctx.Err()
}

// Beside a batch run under way, a second starts at once when few claims
// are expected during a run (a quiet API answers without waiting on
// another claim's run), and only for a full batch when many are (the
// claims wait and go together, so a busy Temporal gets fewer runs).
func TestBatcherStartsASecondRunOnlyWhenItPays(t *testing.T) {
	for _, tc := range []struct {
		name string
		// trip and gap prime the batcher's averages: round trip, and time
		// between claims.
		trip, gap time.Duration
		maxBatch  int
		// after the first claim's run started, these arrive.
		more int
		// wantRuns: the claim counts of the runs, in start order, and how
		// many were under way at once.
		wantSizes []int
		wantMax   int
	}{
		{name: "no round trip known yet: a second run at once", trip: 0, gap: time.Millisecond, maxBatch: 10,
			more: 1, wantSizes: []int{1, 1}, wantMax: 2},
		{name: "quiet: fewer than joinersWorthWaiting claims per round trip", trip: 40 * time.Millisecond, gap: 50 * time.Millisecond,
			maxBatch: 10, more: 1, wantSizes: []int{1, 1}, wantMax: 2},
		{name: "busy: the claims wait for the run and go together", trip: 100 * time.Millisecond, gap: time.Millisecond,
			maxBatch: 10, more: 3, wantSizes: []int{1, 3}, wantMax: 1},
		{name: "busy, and a full batch: it goes beside the run", trip: 100 * time.Millisecond, gap: time.Millisecond,
			maxBatch: 2, more: 2, wantSizes: []int{1, 2}, wantMax: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &gatedTemporal{release: make(chan struct{}), entered: make(chan int, 8)}
			b := newClaimBatcher(f, slog.New(slog.DiscardHandler), nil, BatchOptions{MaxBatch: tc.maxBatch, InFlight: 2}, 5*time.Second)
			defer b.close()
			b.trip.Store(int64(tc.trip))
			b.gap = tc.gap // set before the loop reads it: no claim arrived yet
			var wg sync.WaitGroup
			submit := func(i int) {
				wg.Go(func() {
					r, err := b.submit(context.Background(), workflows.EnrollmentInput{CourseID: "c", StudentID: fmt.Sprintf("s%d", i)})
					if err != nil || r.decision.Refusal != workflows.RefusalCourseNotFound {
						t.Errorf("claim %d: %+v, %v", i, r, err)
					}
				})
			}
			submit(0)
			<-f.entered
			for i := range tc.more {
				submit(i + 1)
			}
			// Give the loop time to start a second run if it is going to.
			select {
			case <-f.entered:
			case <-time.After(200 * time.Millisecond):
			}
			close(f.release)
			wg.Wait()
			f.mu.Lock()
			defer f.mu.Unlock()
			if fmt.Sprint(f.sizes) != fmt.Sprint(tc.wantSizes) || f.max != tc.wantMax {
				t.Errorf("runs of %v claims, %d at once; want %v, %d at once", f.sizes, f.max, tc.wantSizes, tc.wantMax)
			}
		})
	}
}

// deskTemporal takes each batch, sent to a desk or starting a run of its
// own, and holds it until release; it records where each batch went, and
// the update's shape.
type deskTemporal struct {
	undecidedTemporal
	release chan struct{}
	entered chan string // receives the desk's workflow ID of each batch
	full    bool        // desks reject every batch as too large to list

	mu      sync.Mutex
	updates []client.UpdateWorkflowOptions
}

func (f *deskTemporal) UpdateWithStartWorkflow(ctx context.Context, o client.UpdateWithStartWorkflowOptions) (client.WorkflowUpdateHandle, error) {
	op, ok := o.StartWorkflowOperation.(*fakeStart)
	if !ok {
		return nil, errors.New("test: no start operation")
	}
	close(op.called)
	f.mu.Lock()
	f.updates = append(f.updates, o.UpdateOptions)
	f.mu.Unlock()
	f.entered <- o.UpdateOptions.WorkflowID
	claims := len(op.claims) // a batch run's, in its start
	if len(o.UpdateOptions.Args) > 0 {
		in, ok := o.UpdateOptions.Args[0].(workflows.EnrollmentBatchInput)
		if !ok {
			return nil, errors.New("test: the desk's update carries no batch")
		}
		claims = len(in.Claims)
	}
	if f.full && strings.HasPrefix(o.UpdateOptions.WorkflowID, "enrollment-desk:") {
		return rejectedBatch{}, nil
	}
	select {
	case <-f.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return decidedBatch{claims: claims}, nil
}

// rejectedBatch is a desk's update rejected as too large to list.
type rejectedBatch struct{ client.WorkflowUpdateHandle }

func (rejectedBatch) RunID() string { return "desk-run-1" }
func (rejectedBatch) Get(context.Context, any) error {
	return temporal.NewApplicationError("desk full", workflows.DeskFullErrorType)
}

// A batch a desk rejects because its search attributes cannot list it is
// decided in a run of its own, and counted.
func TestBatcherSendsABatchTheDeskCannotListToARunOfItsOwn(t *testing.T) {
	f := &deskTemporal{release: make(chan struct{}), entered: make(chan string, 64), full: true}
	close(f.release)
	reg := prometheus.NewRegistry()
	m := newMetrics(&server{Config: Config{Metrics: reg}})
	b := newClaimBatcher(f, slog.New(slog.DiscardHandler), m, BatchOptions{MaxBatch: 10, InFlight: 3, Desks: 1, DeskBatches: 7}, 5*time.Second)
	defer b.close()
	r, err := b.submit(context.Background(), workflows.EnrollmentInput{CourseID: "c", StudentID: "s"})
	if err != nil || r.decision.Refusal != workflows.RefusalCourseNotFound {
		t.Fatalf("submit = %+v, %v", r, err)
	}
	if !strings.HasPrefix(r.workflowID, "enrollment-batch:") {
		t.Errorf("decided by %s, want a batch run", r.workflowID)
	}
	var went []string
	for range 2 {
		went = append(went, <-f.entered)
	}
	if !strings.HasPrefix(went[0], "enrollment-desk:") || !strings.HasPrefix(went[1], "enrollment-batch:") {
		t.Errorf("the batch went to %v, want the desk, then a run of its own", went)
	}
	var full, sizes dto.Metric
	if err := m.deskFull.Write(&full); err != nil || full.GetCounter().GetValue() != 1 {
		t.Errorf("claimflow_claim_desk_full_total = %v (%v), want 1", full.GetCounter().GetValue(), err)
	}
	if err := m.batchClaims.Write(&sizes); err != nil || sizes.GetHistogram().GetSampleCount() != 1 {
		t.Errorf("claimflow_claim_batch_claims counted %d batches (%v), want 1: the rejected batch once",
			sizes.GetHistogram().GetSampleCount(), err)
	}
}

// With a desk, a batch goes to the desk when it holds none of this
// batcher's, and otherwise starts a run of its own beside it, as without
// desks; once the desk is free again, the next batch goes there.
func TestBatcherSendsABatchToAFreeDeskElseARunOfItsOwn(t *testing.T) {
	f := &deskTemporal{release: make(chan struct{}), entered: make(chan string, 64)}
	b := newClaimBatcher(f, slog.New(slog.DiscardHandler), nil, BatchOptions{MaxBatch: 10, InFlight: 3, Desks: 1, DeskBatches: 7}, 5*time.Second)
	defer b.close()
	var wg sync.WaitGroup
	enroll := func(i int) {
		wg.Go(func() {
			r, err := b.submit(context.Background(), workflows.EnrollmentInput{CourseID: "c", StudentID: fmt.Sprintf("s%d", i)})
			if err != nil || r.decision.Refusal != workflows.RefusalCourseNotFound {
				t.Errorf("claim %d: %+v, %v", i, r, err)
			}
		})
		select {
		case <-f.entered:
		case <-time.After(5 * time.Second):
			t.Fatalf("claim %d waited for the batches under way", i)
		}
	}
	for i := range 3 { // quiet: each claim goes out alone, beside the ones held
		enroll(i)
	}
	close(f.release)
	wg.Wait()
	enroll(3)
	wg.Wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	var went []string
	for _, u := range f.updates {
		if strings.HasPrefix(u.WorkflowID, "enrollment-batch:") {
			went = append(went, "run")
			continue
		}
		went = append(went, u.WorkflowID)
		in := u.Args[0].(workflows.EnrollmentBatchInput)
		if u.UpdateName != workflows.UpdateDeskBatch || u.UpdateID != in.BatchID || in.BatchID == "" ||
			in.CollectedAt.IsZero() || !in.ConfirmBeforeAnswer || len(in.Claims) != 1 {
			t.Errorf("update %+v carries %+v", u, in)
		}
	}
	desk := workflows.EnrollmentDeskWorkflowID(0)
	if want := []string{desk, "run", "run", desk}; fmt.Sprint(went) != fmt.Sprint(want) {
		t.Errorf("batches went to %v, want %v (the desk when free, else a run of its own)", went, want)
	}
}
