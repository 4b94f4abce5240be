package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/claimflow/claimflow/internal/config"
	"github.com/claimflow/claimflow/workflows"
)

// errOverloaded means the claim queue is full: the caller answers 429 at
// once instead of letting requests pile up behind Temporal.
var errOverloaded = errors.New("claim queue full")

// BatchOptions tune group commit of enrollment claims.
type BatchOptions struct {
	// MaxBatch bounds the claims one batch run decides.
	MaxBatch int
	// InFlight bounds the batches under way at once, in runs of their own
	// and on desks (see Desks). While all are busy,
	// arriving claims wait and join the next batch: batches grow with load.
	// Beside a run under way another starts only for a full batch, or when
	// fewer than joinersWorthWaiting claims are expected during a run.
	InFlight int
	// QueueLimit bounds the claims waiting for a batch; beyond it, 429.
	QueueLimit int
	// MaxAttrBytes bounds the encoded size of the batch run's StudentId and
	// CourseId search attribute values, which Temporal limits per value
	// (frontend.searchAttributesSizeOfValueLimit, 2 KiB by default).
	MaxAttrBytes int
	// Desks, when positive, sends a batch as an update to one of Desks
	// runs that stay (workflows.EnrollmentDesk) that has no batch of this
	// batcher under way, instead of starting a run for it; a batch that
	// finds every desk busy starts a run of its own, as without desks.
	Desks int
	// DeskBatches is how many batches a desk run decides before it
	// continues as new.
	DeskBatches int
}

// claimBatcher collects enrollment claims and decides them a batch at a
// time. A claim that finds a free slot goes out at once, alone, so a
// quiet system answers as fast as without batching.
type claimBatcher struct {
	temporal Temporal
	log      *slog.Logger
	// metrics observes the claims' waits and the batch calls; nil (a
	// batcher built by hand) records nothing.
	metrics *metrics
	opts    BatchOptions
	timeout time.Duration
	queue   chan *pendingClaim
	slots   chan struct{}
	done    chan struct{}
	// finished receives when a run ended, so that a batch held back for
	// it (see worthWaiting) goes at once.
	finished chan struct{}
	// trip is the moving average of a batch run's round trip, in
	// nanoseconds; gap that of the time between two claims (kept by loop).
	trip    atomic.Int64
	gap     time.Duration
	arrived time.Time
	// deskBusy says which desks hold a batch of this batcher (Desks > 0).
	// One at a time: the batches that wait for a desk's workflow task join
	// the next batch here instead, and a batch that finds every desk busy
	// starts a run of its own beside them (docs/performance.md, "Desks
	// against batch runs"). API replicas share the desks, each with its
	// one batch; the server admits 10 updates in flight on a run
	// (history.maxInFlightUpdates).
	deskBusy []atomic.Bool
}

// joinersWorthWaiting is how many claims must be expected to join a batch
// during the run under way before the batch waits for it rather than
// starting a run of its own next to it. Every run costs the Temporal server
// about as much as an empty workflow, whatever it carries; a run for one or
// two claims beside a busy one buys their answer a shorter wait with
// Temporal time every other claim then waits for.
const joinersWorthWaiting = 4

type pendingClaim struct {
	in        workflows.EnrollmentInput
	submitted time.Time
	reply     chan claimResult
	// state moves once, from claimQueued: to claimTaken by the flush that
	// puts the claim in a batch run, or to claimWithdrawn by its request,
	// whose wait ended first; a withdrawn claim never reaches a run.
	state atomic.Int32
	// run receives the batch run once it started: from then on the run
	// holds the claim and decides it on its own.
	run chan batchRun
}

const (
	claimQueued int32 = iota
	claimTaken
	claimWithdrawn
)

// batchRun names the run that holds a claim.
type batchRun struct{ workflowID, runID string }

type claimResult struct {
	decision   workflows.Decision
	workflowID string
	runID      string
	err        error
}

// startGrace bounds how long a request whose wait ended keeps waiting to
// learn whether its batch run started, once the claim is in a flush.
const startGrace = time.Second

func newClaimBatcher(t Temporal, log *slog.Logger, m *metrics, o BatchOptions, timeout time.Duration) *claimBatcher {
	// Zero options take the environment's defaults (internal/config), so
	// the API built by hand in a test batches as production does.
	if o.MaxBatch <= 0 {
		o.MaxBatch = config.DefaultClaimBatchMax
	}
	if o.InFlight <= 0 {
		o.InFlight = config.DefaultClaimBatchInFlight
	}
	if o.QueueLimit <= 0 {
		o.QueueLimit = 4 * o.MaxBatch * o.InFlight
	}
	if o.Desks > 0 && o.DeskBatches <= 0 {
		o.DeskBatches = config.DefaultClaimDeskBatches
	}
	if o.MaxAttrBytes <= 0 {
		o.MaxAttrBytes = config.DefaultClaimBatchAttrBytes
	}
	b := &claimBatcher{
		temporal: t, log: log, metrics: m, opts: o, timeout: timeout,
		queue:    make(chan *pendingClaim, o.QueueLimit),
		slots:    make(chan struct{}, o.InFlight),
		done:     make(chan struct{}),
		finished: make(chan struct{}, 1),
		gap:      time.Second, // until claims arrive: quiet
		deskBusy: make([]atomic.Bool, max(o.Desks, 0)),
	}
	go b.loop()
	return b
}

// close stops collecting; claims already queued are answered with an error.
func (b *claimBatcher) close() { close(b.done) }

// submit queues a claim and waits for its decision. When ctx ends first it
// returns errUndecided, with the batch run, if that run started (it holds
// the claim and decides it on its own), and ctx's error otherwise: then the
// claim was withdrawn before any run took it, or, taken into a batch whose
// run did not report its start within startGrace, it may still be decided
// (a retry of the request then learns already_enrolled with the ID).
func (b *claimBatcher) submit(ctx context.Context, in workflows.EnrollmentInput) (claimResult, error) {
	p := &pendingClaim{in: in, submitted: time.Now(), reply: make(chan claimResult, 1), run: make(chan batchRun, 1)}
	select {
	case b.queue <- p:
	default:
		return claimResult{}, errOverloaded
	}
	select {
	case r := <-p.reply:
		return r, r.err
	case <-ctx.Done():
	}
	if p.state.CompareAndSwap(claimQueued, claimWithdrawn) {
		return claimResult{}, ctx.Err()
	}
	grace := time.NewTimer(startGrace)
	defer grace.Stop()
	select {
	case r := <-p.reply: // a decision that came with the end of the wait wins
		return r, r.err
	default:
	}
	select {
	case r := <-p.reply:
		return r, r.err
	case run := <-p.run:
		return claimResult{workflowID: run.workflowID, runID: run.runID}, fmt.Errorf("%w: %w", errUndecided, ctx.Err())
	case <-grace.C:
		return claimResult{}, ctx.Err()
	}
}

func (b *claimBatcher) loop() {
	var carry *pendingClaim // did not fit the previous batch
	for {
		batch := newBatchBuilder(b.opts)
		if carry != nil {
			batch.add(carry)
			carry = nil
		} else {
			select {
			case p := <-b.queue:
				b.noteArrival(p)
				batch.add(p)
			case <-b.done:
				b.failQueued()
				return
			}
		}
	waitForSlot:
		for {
			queue, slots := b.queue, b.slots
			if carry != nil || batch.full() {
				queue = nil // full: only a free slot moves us on
			} else if len(b.slots) > 0 && b.worthWaiting() {
				// A run is under way and enough claims will join this
				// batch before it ends: wait for it (or for a full batch).
				slots = nil
			}
			select {
			case slots <- struct{}{}:
				break waitForSlot
			case <-b.finished:
			case p := <-queue:
				b.noteArrival(p)
				if batch.fits(p) {
					batch.add(p)
				} else {
					carry = p
				}
			case <-b.done:
				for _, p := range append(batch.claims, carry) {
					if p != nil {
						p.reply <- claimResult{err: errors.New("API shutting down")}
					}
				}
				b.failQueued()
				return
			}
		}
	drain:
		for carry == nil && !batch.full() {
			select {
			case p := <-b.queue:
				b.noteArrival(p)
				if batch.fits(p) {
					batch.add(p)
				} else {
					carry = p
				}
			default:
				break drain
			}
		}
		go b.flush(batch.claims)
	}
}

// noteArrival updates the moving average of the time between claims.
func (b *claimBatcher) noteArrival(p *pendingClaim) {
	if !b.arrived.IsZero() {
		gap := max(p.submitted.Sub(b.arrived), 0)
		b.gap += (gap - b.gap) / 16
	}
	b.arrived = p.submitted
}

// noteTrip updates the moving average of a batch run's round trip.
func (b *claimBatcher) noteTrip(d time.Duration) {
	for {
		old := b.trip.Load()
		if b.trip.CompareAndSwap(old, old+(int64(d)-old)/8) {
			return
		}
	}
}

// worthWaiting says whether, by the recent round trips and arrivals, at
// least joinersWorthWaiting claims are expected during one run.
func (b *claimBatcher) worthWaiting() bool {
	return time.Duration(b.trip.Load()) >= joinersWorthWaiting*max(b.gap, time.Microsecond)
}

// batchBuilder keeps a batch within its claim count and within the size
// Temporal allows for the StudentId and CourseId values of its run.
type batchBuilder struct {
	opts                      BatchOptions
	claims                    []*pendingClaim
	students, courses         map[string]bool
	studentBytes, courseBytes int
}

func newBatchBuilder(o BatchOptions) *batchBuilder {
	return &batchBuilder{opts: o, students: map[string]bool{}, courses: map[string]bool{}}
}

func (b *batchBuilder) full() bool { return len(b.claims) >= b.opts.MaxBatch }

func (b *batchBuilder) fits(p *pendingClaim) bool {
	if b.full() {
		return false
	}
	sb, cb := b.studentBytes, b.courseBytes
	if !b.students[p.in.StudentID] {
		sb += workflows.AttrEntryBytes(p.in.StudentID)
	}
	if !b.courses[p.in.CourseID] {
		cb += workflows.AttrEntryBytes(p.in.CourseID)
	}
	return sb <= b.opts.MaxAttrBytes && cb <= b.opts.MaxAttrBytes
}

func (b *batchBuilder) add(p *pendingClaim) {
	b.claims = append(b.claims, p)
	if !b.students[p.in.StudentID] {
		b.students[p.in.StudentID] = true
		b.studentBytes += workflows.AttrEntryBytes(p.in.StudentID)
	}
	if !b.courses[p.in.CourseID] {
		b.courses[p.in.CourseID] = true
		b.courseBytes += workflows.AttrEntryBytes(p.in.CourseID)
	}
}

func (b *claimBatcher) failQueued() {
	for {
		select {
		case p := <-b.queue:
			p.reply <- claimResult{err: errors.New("API shutting down")}
		default:
			return
		}
	}
}

// flush decides one batch: on a desk that has none of this batcher's under
// way, or else through an Update-With-Start of a run of its own. Claims
// whose request already gave up are left out, so they never reach a run.
func (b *claimBatcher) flush(batch []*pendingClaim) {
	defer func() {
		<-b.slots
		select {
		case b.finished <- struct{}{}:
		default: // the loop has one wake-up pending already
		}
	}()
	batch = slices.DeleteFunc(batch, func(p *pendingClaim) bool {
		return !p.state.CompareAndSwap(claimQueued, claimTaken)
	})
	if len(batch) == 0 {
		return
	}
	answer := func(r claimResult, decisions []workflows.Decision) {
		for i, p := range batch {
			out := r
			if decisions != nil {
				out.decision = decisions[i]
			}
			p.reply <- out
		}
	}
	id, err := uuid.NewV7()
	if err != nil {
		answer(claimResult{err: err}, nil)
		return
	}
	for k := range b.deskBusy {
		if b.deskBusy[k].CompareAndSwap(false, true) {
			taken := b.flushToDesk(batch, id.String(), k, answer)
			b.deskBusy[k].Store(false)
			if taken {
				return
			}
			// The desk rejected the batch; its metrics counted it.
			b.flushToRun(batch, id.String(), answer, false)
			return
		}
	}
	b.flushToRun(batch, id.String(), answer, true)
}

// flushToRun decides one batch through an Update-With-Start of a run of
// its own; count says to record its size and wait (a batch a desk rejected
// has them recorded already).
func (b *claimBatcher) flushToRun(batch []*pendingClaim, batchID string, answer func(claimResult, []workflows.Decision), count bool) {
	in := workflows.EnrollmentBatchInput{BatchID: batchID, ConfirmBeforeAnswer: true}
	var courses, students []string
	seenCourse, seenStudent := map[string]bool{}, make(map[string]bool, len(batch))
	for _, p := range batch {
		in.Claims = append(in.Claims, p.in)
		if !seenCourse[p.in.CourseID] {
			seenCourse[p.in.CourseID] = true
			courses = append(courses, p.in.CourseID)
		}
		if !seenStudent[p.in.StudentID] {
			seenStudent[p.in.StudentID] = true
			students = append(students, p.in.StudentID)
		}
	}
	workflowID := workflows.EnrollmentBatchWorkflowID(in.BatchID)
	// The run's page in the Web UI says what the batch holds; these travel
	// in the start request and cost no visibility write.
	summary, details := workflows.BatchStartSummary(in.Claims)
	start := b.temporal.NewWithStartWorkflowOperation(client.StartWorkflowOptions{
		ID:            workflowID,
		TaskQueue:     workflows.TaskQueue,
		StaticSummary: summary,
		StaticDetails: details,
		// Batch IDs are new each time: a second start is a bug, not a retry.
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_FAIL,
		WorkflowIDReusePolicy:    enumspb.WORKFLOW_ID_REUSE_POLICY_REJECT_DUPLICATE,
		TypedSearchAttributes: temporal.NewSearchAttributes(
			workflows.SearchCourseID.ValueSet(courses),
			workflows.SearchStudentID.ValueSet(students),
			workflows.SearchClaimStatus.ValueSet(string(workflows.StatusPending)),
		),
	}, workflows.EnrollmentBatch, in)
	// The batch belongs to no single request, so no request's context.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if start != nil {
		// The run's input is the batch: once it started, it holds every
		// claim, and a request whose wait ends before the decision says so.
		go func() {
			run, err := start.Get(ctx)
			if err != nil {
				return
			}
			for _, p := range batch {
				select {
				case p.run <- batchRun{workflowID: workflowID, runID: run.GetRunID()}:
				default:
				}
			}
		}()
	}
	call := time.Now()
	submitted := make([]time.Time, len(batch))
	for i, p := range batch {
		submitted[i] = p.submitted
	}
	if count {
		b.metrics.batchStarted(call, submitted)
	}
	decisions, runID, err := decideClaim[[]workflows.Decision](ctx, b.temporal, start, workflowID, "", b.timeout, true)
	if err == nil {
		b.noteTrip(time.Since(call))
		b.metrics.batchDecided(time.Since(call))
	}
	if errors.Is(err, errUndecided) {
		answer(claimResult{workflowID: workflowID, runID: runID,
			err: fmt.Errorf("batch %s of %d claims: %w", in.BatchID, len(batch), err)}, nil)
		return
	}
	if err != nil {
		answer(claimResult{err: fmt.Errorf("decide batch %s of %d claims: %w", in.BatchID, len(batch), err)}, nil)
		return
	}
	if len(decisions) != len(batch) {
		answer(claimResult{err: fmt.Errorf("batch %s: %d decisions for %d claims", in.BatchID, len(decisions), len(batch))}, nil)
		return
	}
	answer(claimResult{workflowID: workflowID, runID: runID}, decisions)
}

// flushToDesk decides one batch as an update to desk k, starting the desk
// if it is not there. Once the desk accepted the update it holds every
// claim and decides them on its own. It returns false, having answered
// nothing, when the desk rejected the batch because its search attributes
// could not list it (workflows.DeskFullErrorType): the batch then goes to
// a run of its own.
func (b *claimBatcher) flushToDesk(batch []*pendingClaim, batchID string, k int, answer func(claimResult, []workflows.Decision)) bool {
	in := workflows.EnrollmentBatchInput{BatchID: batchID, ConfirmBeforeAnswer: true, CollectedAt: time.Now().UTC()}
	submitted := make([]time.Time, len(batch))
	for i, p := range batch {
		in.Claims = append(in.Claims, p.in)
		submitted[i] = p.submitted
	}
	workflowID := workflows.EnrollmentDeskWorkflowID(k)
	start := b.temporal.NewWithStartWorkflowOperation(client.StartWorkflowOptions{
		ID:        workflowID,
		TaskQueue: workflows.TaskQueue,
		// The desk is there for every batch; after it closed (an
		// operator's cancel), the next batch starts it again.
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
		WorkflowIDReusePolicy:    enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
	}, workflows.EnrollmentDesk, workflows.EnrollmentDeskInput{Desk: k, BatchesPerRun: b.opts.DeskBatches, AttrBytes: b.opts.MaxAttrBytes})
	// The batch belongs to no single request, so no request's context.
	ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
	defer cancel()
	call := time.Now()
	b.metrics.batchStarted(call, submitted)
	handle, err := b.temporal.UpdateWithStartWorkflow(ctx, client.UpdateWithStartWorkflowOptions{
		StartWorkflowOperation: start,
		UpdateOptions: client.UpdateWorkflowOptions{
			WorkflowID: workflowID,
			UpdateID:   batchID, // a retried call is the same update
			UpdateName: workflows.UpdateDeskBatch,
			Args:       []any{in},
			// Accepted, then the outcome: an accepted batch is the
			// desk's to decide, whatever happens to this wait.
			WaitForStage: client.WorkflowUpdateStageAccepted,
		},
	})
	if err != nil {
		answer(claimResult{err: fmt.Errorf("send batch %s of %d claims to desk %s: %w", batchID, len(batch), workflowID, err)}, nil)
		return true
	}
	for _, p := range batch {
		select {
		case p.run <- batchRun{workflowID: workflowID, runID: handle.RunID()}:
		default:
		}
	}
	var decisions []workflows.Decision
	if err := handle.Get(ctx, &decisions); err != nil {
		var app *temporal.ApplicationError
		if errors.As(err, &app) && app.Type() == workflows.DeskFullErrorType {
			for _, p := range batch { // the desk never held them
				select {
				case <-p.run:
				default:
				}
			}
			b.metrics.deskRejected()
			return false
		}
		answer(claimResult{workflowID: workflowID, runID: handle.RunID(),
			err: fmt.Errorf("batch %s of %d claims on desk %s: %w: %w", batchID, len(batch), workflowID, errUndecided, err)}, nil)
		return true
	}
	b.noteTrip(time.Since(call))
	b.metrics.batchDecided(time.Since(call))
	if len(decisions) != len(batch) {
		answer(claimResult{err: fmt.Errorf("batch %s: %d decisions for %d claims", batchID, len(decisions), len(batch))}, nil)
		return true
	}
	answer(claimResult{workflowID: workflowID, runID: handle.RunID()}, decisions)
	return true
}
