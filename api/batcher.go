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
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/claimflow/claimflow/internal/config"
	"github.com/claimflow/claimflow/internal/tracing"
	"github.com/claimflow/claimflow/workflows"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// errOverloaded means the claim queue is full: the caller answers 429 at
// once instead of letting requests pile up behind Temporal.
var errOverloaded = errors.New("claim queue full")

// BatchOptions tune group commit of enrollment claims; zero fields take
// internal/config's defaults.
type BatchOptions struct {
	// MaxBatch bounds the claims of one batch (CLAIM_BATCH_MAX).
	MaxBatch int
	// QueueLimit bounds the claims waiting for a batch; beyond it, 429.
	QueueLimit int
	// MaxAttrBytes bounds the encoded size of a batch's StudentId and
	// CourseId lists, and of what a desk run lists (CLAIM_BATCH_ATTR_BYTES,
	// within the server's frontend.searchAttributesSizeOfValueLimit).
	MaxAttrBytes int
	// Desks is how many desk runs this API sends batches to, one batch on
	// each at a time (CLAIM_DESKS): the batches under way at once. While
	// every desk holds a batch, arriving claims wait and join the next
	// batch, so batches grow with load.
	Desks int
	// DeskBatches is how many batches a desk run decides before it
	// continues as new (CLAIM_DESK_BATCHES).
	DeskBatches int
}

// claimBatcher collects enrollment claims and sends them, a batch at a
// time, to the desks. A claim that finds a desk free goes out at once,
// alone, so a quiet system answers as fast as with a run per request.
type claimBatcher struct {
	temporal Temporal
	log      *slog.Logger
	// metrics observes the claims' waits and the batch calls; nil (a
	// batcher built by hand) records nothing.
	metrics *metrics
	opts    BatchOptions
	timeout time.Duration
	queue   chan *pendingClaim
	// free holds the desks with no batch of this batcher under way.
	free chan int
	done chan struct{}
}

type pendingClaim struct {
	in        workflows.EnrollmentInput
	submitted time.Time
	// span is the claim's wait in the batcher (a no-op without tracing);
	// the batch's span links to it.
	span  trace.Span
	reply chan claimResult
	// state moves once, from claimQueued: to claimTaken by the flush that
	// sends the claim to a desk, or to claimWithdrawn by its request,
	// whose wait ended first; a withdrawn claim never reaches a desk.
	state atomic.Int32
	// run receives the desk run once it accepted the batch: from then on
	// the desk holds the claim and decides it on its own.
	run chan deskRun
}

const (
	claimQueued int32 = iota
	claimTaken
	claimWithdrawn
)

// deskRun names the run that holds a claim.
type deskRun struct{ workflowID, runID string }

type claimResult struct {
	decision   workflows.Decision
	workflowID string
	runID      string
	err        error
}

// startGrace bounds how long a request whose wait ended keeps waiting to
// learn whether the desk accepted its batch, once the claim is in a flush.
const startGrace = time.Second

func newClaimBatcher(t Temporal, log *slog.Logger, m *metrics, o BatchOptions, timeout time.Duration) *claimBatcher {
	// Zero options take the environment's defaults (internal/config), so
	// the API built by hand in a test batches as production does.
	if o.MaxBatch <= 0 {
		o.MaxBatch = config.DefaultClaimBatchMax
	}
	if o.Desks <= 0 {
		o.Desks = config.DefaultClaimDesks
	}
	if o.QueueLimit <= 0 {
		o.QueueLimit = 4 * o.MaxBatch * o.Desks
	}
	if o.DeskBatches <= 0 {
		o.DeskBatches = config.DefaultClaimDeskBatches
	}
	if o.MaxAttrBytes <= 0 {
		o.MaxAttrBytes = config.DefaultClaimBatchAttrBytes
	}
	b := &claimBatcher{
		temporal: t, log: log, metrics: m, opts: o, timeout: timeout,
		queue: make(chan *pendingClaim, o.QueueLimit),
		free:  make(chan int, o.Desks),
		done:  make(chan struct{}),
	}
	for k := range o.Desks {
		b.free <- k
	}
	go b.loop()
	return b
}

// close stops collecting; claims already queued are answered with an error.
func (b *claimBatcher) close() { close(b.done) }

// submit queues a claim and waits for its decision. When ctx ends first it
// returns errUndecided, with the desk run, if the desk accepted the claim's
// batch (it holds the claim and decides it on its own), and ctx's error
// otherwise: then the claim was withdrawn before any desk took it, or,
// taken into a batch whose acceptance was not reported within startGrace,
// it may still be decided (a retry of the request then learns
// already_enrolled with the ID).
func (b *claimBatcher) submit(ctx context.Context, in workflows.EnrollmentInput) (r claimResult, err error) {
	ctx, span := tracing.Start(ctx, "claim.wait", func() []trace.SpanStartOption {
		return []trace.SpanStartOption{trace.WithAttributes(attribute.String("claimflow.course_id", in.CourseID),
			attribute.String("claimflow.student_id", in.StudentID), attribute.String("claimflow.enrollment_id", in.EnrollmentID))}
	})
	if span.IsRecording() {
		defer func() {
			span.SetAttributes(attribute.String("claimflow.outcome", string(r.decision.Status)))
			if err != nil {
				span.SetStatus(codes.Error, err.Error())
			}
			span.End()
		}()
	}
	in.TraceParent = tracing.TraceParent(ctx)
	p := &pendingClaim{in: in, submitted: time.Now(), reply: make(chan claimResult, 1), run: make(chan deskRun, 1), span: span}
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

// loop builds batches: it starts one with the first claim that arrives,
// adds the claims that arrive while every desk is busy, and sends it as
// soon as a desk is free.
func (b *claimBatcher) loop() {
	var carry *pendingClaim // did not fit the previous batch
	for {
		batch := batchBuilder{opts: b.opts}
		if carry != nil {
			batch.add(carry)
			carry = nil
		} else {
			select {
			case p := <-b.queue:
				batch.add(p)
			case <-b.done:
				b.failQueued()
				return
			}
		}
		var desk int
	waitForDesk:
		for {
			queue := b.queue
			if carry != nil || batch.full() {
				queue = nil // full: only a free desk moves us on
			}
			select {
			case desk = <-b.free:
				break waitForDesk
			case p := <-queue:
				carry = batch.take(p)
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
				carry = batch.take(p)
			default:
				break drain
			}
		}
		go b.flush(desk, batch.claims)
	}
}

// batchBuilder keeps a batch within its claim count and within the bytes a
// desk may list of it.
type batchBuilder struct {
	opts   BatchOptions
	claims []*pendingClaim
	list   workflows.ClaimList
}

func (b *batchBuilder) full() bool { return len(b.claims) >= b.opts.MaxBatch }

func (b *batchBuilder) add(p *pendingClaim) {
	b.claims = append(b.claims, p)
	b.list.Add(p.in)
}

// take adds p when it fits and returns it when it does not, to start the
// next batch.
func (b *batchBuilder) take(p *pendingClaim) (carry *pendingClaim) {
	if b.full() || !b.list.Fits(p.in, b.opts.MaxAttrBytes) {
		return p
	}
	b.add(p)
	return nil
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

// flush sends one batch to desk k and frees the desk once it answered.
// Claims whose request already gave up are left out, so they never reach
// a desk.
func (b *claimBatcher) flush(k int, batch []*pendingClaim) {
	defer func() { b.free <- k }()
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
	in := workflows.DeskBatch{BatchID: id.String(), CollectedAt: time.Now().UTC()}
	submitted := make([]time.Time, len(batch))
	for i, p := range batch {
		in.Claims = append(in.Claims, p.in)
		submitted[i] = p.submitted
	}
	// The batch belongs to no single request, so no request's context; its
	// span links to each claim's wait (docs/architecture.md#tracing).
	ctx, span := tracing.Start(context.Background(), "claim.batch", func() []trace.SpanStartOption {
		links := make([]trace.Link, len(batch))
		for i, p := range batch {
			links[i] = trace.Link{SpanContext: p.span.SpanContext()}
			p.span.SetAttributes(attribute.String("claimflow.batch_id", in.BatchID))
		}
		return []trace.SpanStartOption{trace.WithLinks(links...), trace.WithAttributes(attribute.String("claimflow.batch_id", in.BatchID),
			attribute.Int("claimflow.claims", len(batch)), attribute.Int("claimflow.desk", k))}
	})
	defer span.End()
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	call := time.Now()
	b.metrics.batchStarted(call, submitted)
	decisions, run, err := b.sendToDesk(ctx, k, in, func(run deskRun, held bool) {
		for _, p := range batch {
			select {
			case <-p.run: // what an earlier call told it
			default:
			}
			if held {
				p.run <- run
			}
		}
	})
	switch {
	case err != nil:
		span.SetStatus(codes.Error, err.Error())
		answer(claimResult{workflowID: run.workflowID, runID: run.runID,
			err: fmt.Errorf("batch %s of %d claims on desk %d: %w", in.BatchID, len(batch), k, err)}, nil)
	case len(decisions) != len(batch):
		answer(claimResult{err: fmt.Errorf("batch %s: %d decisions for %d claims", in.BatchID, len(decisions), len(batch))}, nil)
	default:
		b.metrics.batchDecided(time.Since(call))
		answer(claimResult{workflowID: run.workflowID, runID: run.runID}, decisions)
	}
}

// sendToDesk sends a batch as an update to desk k, starting the desk if it
// is not there, and waits for the decisions; hold is told the desk run once
// it accepted the batch, from when it holds the claims, and told again
// (held false) should the desk turn the batch away after all. It returns
// errUndecided when the desk accepted the batch but its decisions did not
// come within ctx. A desk that cannot list the batch (DeskFull) continues
// as new, and the batch goes again, to its next run.
func (b *claimBatcher) sendToDesk(ctx context.Context, k int, in workflows.DeskBatch, hold func(run deskRun, held bool)) ([]workflows.Decision, deskRun, error) {
	workflowID := workflows.EnrollmentDeskWorkflowID(k)
	for retry := time.Millisecond; ; retry = min(2*retry, 100*time.Millisecond) {
		update := client.UpdateWorkflowOptions{
			WorkflowID: workflowID,
			UpdateID:   in.BatchID, // a retried call is the same update
			UpdateName: workflows.UpdateDeskBatch,
			Args:       []any{in},
			// Accepted, then the outcome: an accepted batch is the
			// desk's to decide, whatever happens to this wait.
			WaitForStage: client.WorkflowUpdateStageAccepted,
		}
		// The desk is there for nearly every batch, so the batch goes as an
		// update to its run; only when there is none (the first batch, or
		// after an operator's cancel) does Update-With-Start start it: to a
		// running desk it is the slower call
		// (docs/performance.md#what-the-figures-depend-on-change-one-measure-again).
		handle, err := b.temporal.UpdateWorkflow(ctx, update)
		if notFound := (*serviceerror.NotFound)(nil); errors.As(err, &notFound) {
			handle, err = b.temporal.UpdateWithStartWorkflow(ctx, client.UpdateWithStartWorkflowOptions{
				StartWorkflowOperation: b.temporal.NewWithStartWorkflowOperation(client.StartWorkflowOptions{
					ID:                       workflowID,
					TaskQueue:                workflows.TaskQueue,
					WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
					WorkflowIDReusePolicy:    enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
				}, workflows.EnrollmentDesk, workflows.EnrollmentDeskInput{Desk: k, BatchesPerRun: b.opts.DeskBatches, AttrBytes: b.opts.MaxAttrBytes}),
				UpdateOptions: update,
			})
		}
		if err != nil && !isDeskFull(err) {
			return nil, deskRun{}, fmt.Errorf("send to desk %s: %w", workflowID, err)
		}
		var decisions []workflows.Decision
		run := deskRun{workflowID: workflowID}
		if err == nil {
			run.runID = handle.RunID()
			hold(run, true)
			err = handle.Get(ctx, &decisions)
		}
		if isDeskFull(err) {
			hold(run, false)
			b.metrics.deskRejected()
			if !b.pause(ctx, retry) {
				return nil, deskRun{}, ctx.Err()
			}
			continue
		}
		if err != nil {
			return nil, run, fmt.Errorf("%w: %w", errUndecided, err)
		}
		return decisions, run, nil
	}
}

// pause waits d, or until ctx ends (false).
func (b *claimBatcher) pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// isDeskFull says a desk turned the batch away because it could not list
// it (workflows.DeskFullErrorType).
func isDeskFull(err error) bool {
	var app *temporal.ApplicationError
	return errors.As(err, &app) && app.Type() == workflows.DeskFullErrorType
}
