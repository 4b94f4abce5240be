package api

import (
	"context"
	"errors"
	"fmt"
	"go.temporal.io/api/serviceerror"
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

// A batch's students and courses are listed in search attributes (the
// desk's, or its batch run's) whose values Temporal caps in size; the
// builder must close a batch before a value would pass the cap, whatever
// the claim count allows.
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
			b := batchBuilder{opts: tc.opts}
			b.add(tc.claims[0])
			for _, p := range tc.claims[1:] {
				if b.take(p) != nil {
					break
				}
			}
			if len(b.claims) != tc.wantAdded {
				t.Fatalf("batch holds %d claims, want %d", len(b.claims), tc.wantAdded)
			}
			var in []workflows.EnrollmentInput
			for _, p := range b.claims {
				in = append(in, p.in)
			}
			list := workflows.ClaimListOf(in)
			if list.Bytes() > tc.opts.MaxAttrBytes {
				t.Fatalf("attribute bytes %d exceed %d", list.Bytes(), tc.opts.MaxAttrBytes)
			}
		})
	}
}

// decidingTemporal decides every claim of a desk's batch (course_not_found,
// so the handler answers without a database).
type decidingTemporal struct{ undecidedTemporal }

func (f *decidingTemporal) UpdateWithStartWorkflow(ctx context.Context, o client.UpdateWithStartWorkflowOptions) (client.WorkflowUpdateHandle, error) {
	return decidedBatch{claims: len(o.UpdateOptions.Args[0].(workflows.DeskBatch).Claims)}, nil
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
		Security: Security{Auth: auth}, Metrics: reg, Gatherer: reg, DecisionTimeout: 5 * time.Second})
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

// deskTemporal stands for the desks: it takes each batch, holds it until
// release, then decides every claim (course_not_found); it records each
// batch's update, whether it came with a start, and how many were under way
// at once. A desk runs once a batch started it: an update to a desk with no
// run is not found. turnAway answers that many calls DeskFull first, from
// the update's outcome.
type deskTemporal struct {
	undecidedTemporal
	release  chan struct{}
	entered  chan string // receives the desk's workflow ID of each batch
	turnAway int

	mu           sync.Mutex
	updates      []client.UpdateWorkflowOptions
	withStart    []bool // of each update: sent by Update-With-Start
	started      map[string]bool
	running, max int
}

func (f *deskTemporal) UpdateWorkflow(ctx context.Context, o client.UpdateWorkflowOptions) (client.WorkflowUpdateHandle, error) {
	f.mu.Lock()
	running := f.started[o.WorkflowID]
	f.mu.Unlock()
	if !running {
		return nil, serviceerror.NewNotFound("test: desk " + o.WorkflowID + " has no run")
	}
	return f.take(ctx, o, false)
}

func (f *deskTemporal) UpdateWithStartWorkflow(ctx context.Context, o client.UpdateWithStartWorkflowOptions) (client.WorkflowUpdateHandle, error) {
	f.mu.Lock()
	if f.started == nil {
		f.started = map[string]bool{}
	}
	f.started[o.UpdateOptions.WorkflowID] = true
	f.mu.Unlock()
	return f.take(ctx, o.UpdateOptions, true)
}

func (f *deskTemporal) take(ctx context.Context, o client.UpdateWorkflowOptions, withStart bool) (client.WorkflowUpdateHandle, error) {
	in, ok := o.Args[0].(workflows.DeskBatch)
	if !ok {
		return nil, errors.New("test: the desk's update carries no batch")
	}
	f.mu.Lock()
	f.updates = append(f.updates, o)
	f.withStart = append(f.withStart, withStart)
	full := f.turnAway > 0
	f.turnAway--
	f.running++
	f.max = max(f.max, f.running)
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.running--
		f.mu.Unlock()
	}()
	f.entered <- o.WorkflowID
	if full {
		return turnedAway{}, nil
	}
	select {
	case <-f.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return decidedBatch{claims: len(in.Claims)}, nil
}

// turnedAway is a desk's answer to a batch it cannot list.
type turnedAway struct{ client.WorkflowUpdateHandle }

func (turnedAway) RunID() string { return "desk-run-1" }
func (turnedAway) Get(context.Context, any) error {
	return temporal.NewApplicationError("desk full", workflows.DeskFullErrorType)
}

// A batch a desk turns away because its search attributes cannot list it
// goes to the same desk again, as the same update, until the desk's next
// run takes it; each time is counted.
func TestBatcherSendsABatchTheDeskTurnedAwayToItsNextRun(t *testing.T) {
	f := &deskTemporal{release: make(chan struct{}), entered: make(chan string, 64), turnAway: 2}
	close(f.release)
	reg := prometheus.NewRegistry()
	m := newMetrics(&server{cfg: Config{Metrics: reg}})
	b := newClaimBatcher(f, slog.New(slog.DiscardHandler), m, BatchOptions{MaxBatch: 10, Desks: 1, DeskBatches: 7}, 5*time.Second)
	defer b.close()
	r, err := b.submit(context.Background(), workflows.EnrollmentInput{CourseID: "c", StudentID: "s"})
	if err != nil || r.decision.Refusal != workflows.RefusalCourseNotFound {
		t.Fatalf("submit = %+v, %v", r, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.updates) != 3 {
		t.Fatalf("%d updates, want 3: turned away twice, then decided", len(f.updates))
	}
	for i, u := range f.updates {
		if u.WorkflowID != workflows.EnrollmentDeskWorkflowID(0) || u.UpdateID != f.updates[0].UpdateID {
			t.Errorf("update to %s as %s, want desk 0 as %s each time", u.WorkflowID, u.UpdateID, f.updates[0].UpdateID)
		}
		if f.withStart[i] != (i == 0) {
			t.Errorf("update %d sent with a start: %v; want only the first, which found no desk running", i, f.withStart[i])
		}
	}
	var full, sizes dto.Metric
	if err := m.deskFull.Write(&full); err != nil || full.GetCounter().GetValue() != 2 {
		t.Errorf("claimflow_claim_desk_full_total = %v (%v), want 2", full.GetCounter().GetValue(), err)
	}
	if err := m.batchClaims.Write(&sizes); err != nil || sizes.GetHistogram().GetSampleCount() != 1 {
		t.Errorf("claimflow_claim_batch_claims counted %d batches (%v), want 1", sizes.GetHistogram().GetSampleCount(), err)
	}
}

// Each desk holds one batch of this batcher at a time: a claim that finds
// a desk free goes out at once, alone; the claims that arrive while every
// desk is busy wait and go together, to the first desk freed.
func TestBatcherKeepsOneBatchOnEachDesk(t *testing.T) {
	f := &deskTemporal{release: make(chan struct{}), entered: make(chan string, 64)}
	b := newClaimBatcher(f, slog.New(slog.DiscardHandler), nil, BatchOptions{MaxBatch: 10, Desks: 2, DeskBatches: 7}, 5*time.Second)
	defer b.close()
	var wg sync.WaitGroup
	submit := func(i int) {
		wg.Go(func() {
			r, err := b.submit(context.Background(), workflows.EnrollmentInput{CourseID: "c", StudentID: fmt.Sprintf("s%d", i)})
			if err != nil || r.decision.Refusal != workflows.RefusalCourseNotFound {
				t.Errorf("claim %d: %+v, %v", i, r, err)
			}
		})
	}
	for i := range 2 { // quiet: each goes out alone, to a desk of its own
		submit(i)
		select {
		case <-f.entered:
		case <-time.After(5 * time.Second):
			t.Fatalf("claim %d waited although a desk was free", i)
		}
	}
	for i := range 3 { // both desks busy: these wait
		submit(2 + i)
	}
	select {
	case d := <-f.entered:
		t.Fatalf("a third batch went to %s while both desks held one", d)
	case <-time.After(200 * time.Millisecond):
	}
	close(f.release)
	wg.Wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	var sizes []int
	desks := map[string]bool{}
	for _, u := range f.updates {
		in := u.Args[0].(workflows.DeskBatch)
		sizes = append(sizes, len(in.Claims))
		desks[u.WorkflowID] = true
		if u.UpdateName != workflows.UpdateDeskBatch || u.UpdateID != in.BatchID || in.BatchID == "" || in.CollectedAt.IsZero() {
			t.Errorf("update %+v carries %+v", u, in)
		}
	}
	// Each desk is started by its first batch; the third batch goes to the
	// run of the desk freed first, as an update alone.
	if fmt.Sprint(f.withStart) != "[true true false]" {
		t.Errorf("updates sent with a start: %v, want [true true false]", f.withStart)
	}
	if fmt.Sprint(sizes) != "[1 1 3]" || f.max != 2 || len(desks) != 2 {
		t.Errorf("batches of %v claims on %d desks, %d at once; want [1 1 3] on 2, 2 at once", sizes, len(desks), f.max)
	}
}
