package workflows

import (
	"fmt"
	"time"

	"go.temporal.io/sdk/workflow"
)

// Names of the handlers clients and operators use.
const (
	// UpdateDecision returns the definitive answer of a claim as soon as it is
	// decided, while the rest of the saga goes on durably.
	UpdateDecision = "decision"
	// QueryStatus returns the run's current state.
	QueryStatus = "status"
)

// claim is the scaffold every claimflow workflow is built on, so that each
// answers its callers the same way:
//
//   - the status query returns state (S);
//   - the decision update waits until the run decided (D) and answers it;
//     a run that ends without deciding answers undecided, never nothing;
//   - every update handler drains before the run returns.
//
// The run keeps its ClaimStatus search attribute in step with its status
// through upsertClaimStatus.
//
// Handler rule, decided here once: a caller waits for its answer, and the
// run for its callers, on a disconnected context. An operator's cancel must
// not leave a caller without an answer: a cancelled run still decides (its
// compensation runs, then "undecided" at the latest), and the caller hears
// that decision rather than a cancellation of its update.
type claim[S, D any] struct {
	state    S
	decision *D
	// answered counts decision requests: the first is the claim itself, any
	// later one is a second claim of the same thing by the same caller.
	answered int
	// onDecide mirrors a decision into the state and ClaimStatus; nil when
	// the workflow keeps its status itself.
	onDecide func(workflow.Context, D)
	// starter is the decision update of the request that started the run,
	// when the run's input names it (expectStarter).
	starter starterUpdate
}

// starterUpdate is what a run knows of its starter's decision update.
type starterUpdate struct {
	id   string        // the update's ID; "" when the input names none
	wait time.Duration // how long the starter waits for its answer
	seen bool          // the update reached this run
}

// expectStarter names the decision update of the request that started the
// run (its update ID, chosen by the API and carried in the input) and how
// long that request waits for its answer. With it the run answers that
// request as the claim itself, whichever update comes first, and stays open
// for it (keepOpenForStarter). An empty id (a run started without a
// waiting request) keeps the plain rule: the first update is the claim.
func (c *claim[S, D]) expectStarter(id string, wait time.Duration) {
	c.starter = starterUpdate{id: id, wait: wait}
}

// register registers the status query and, when answer is not nil, the
// decision update, which answers answer(decision, first) once decided.
func (c *claim[S, D]) register(ctx workflow.Context, answer func(d D, first bool) D) error {
	if err := workflow.SetQueryHandler(ctx, QueryStatus, func() (S, error) {
		return c.state, nil
	}); err != nil {
		return fmt.Errorf("register status query: %w", err)
	}
	if answer == nil {
		return nil
	}
	if err := workflow.SetUpdateHandler(ctx, UpdateDecision, func(ctx workflow.Context) (D, error) {
		c.answered++
		first := c.answered == 1
		if c.starter.id != "" {
			first = workflow.GetCurrentUpdateInfo(ctx).ID == c.starter.id
			c.starter.seen = c.starter.seen || first
		}
		if err := awaitAnswer(ctx, func() bool { return c.decision != nil }); err != nil {
			var none D
			return none, err
		}
		return answer(*c.decision, first), nil
	}); err != nil {
		return fmt.Errorf("register decision update: %w", err)
	}
	return nil
}

// same answers every request with the decision as it is.
func same[D any](d D, _ bool) D { return d }

// decide records the decision every waiting and later request is answered.
func (c *claim[S, D]) decide(ctx workflow.Context, d D) {
	c.decision = &d
	if c.onDecide != nil {
		c.onDecide(ctx, d)
	}
}

// end closes a run: one that ends without a decision (a fault that is not
// a refusal, or an operator's cancel) decides undecided(err), so callers
// waiting on it hear so; then every handler drains. undecided may be nil for
// a workflow without a decision.
func (c *claim[S, D]) end(ctx workflow.Context, err error, undecided func(error) D) {
	if c.decision == nil && undecided != nil {
		c.decide(ctx, undecided(err))
	}
	c.keepOpenForStarter(ctx)
	drainHandlers(ctx)
}

// keepOpenForStarter keeps a decided run open, up to the starter's own wait,
// until the starter's update has arrived. That update is sent with the
// start, but under load it can reach the run only after the run decided
// (through the client's retry of the call). A run closed by then would
// leave it to a new run of the same workflow ID, which would answer the
// request that made the claim as a second claim of it (already_issued,
// already_enrolled). Requests that arrive during the wait are answered as
// usual; the wait is on a disconnected context, as every caller's is, so a
// cancelled run still answers its starter.
func (c *claim[S, D]) keepOpenForStarter(ctx workflow.Context) {
	if c.starter.id == "" || c.starter.seen || c.starter.wait <= 0 {
		return
	}
	dctx, cancel := workflow.NewDisconnectedContext(ctx)
	defer cancel()
	arrived, _ := workflow.AwaitWithTimeout(dctx, c.starter.wait, func() bool { return c.starter.seen })
	if !arrived {
		workflow.GetLogger(ctx).Warn("the starter's decision update never reached the run; closing without it",
			"update_id", c.starter.id, "waited", c.starter.wait)
	}
}

// awaitAnswer blocks an update handler until ready; on a disconnected
// context, so that a cancelled run still answers with its decision.
func awaitAnswer(ctx workflow.Context, ready func() bool) error {
	dctx, cancel := workflow.NewDisconnectedContext(ctx)
	defer cancel()
	return workflow.Await(dctx, ready)
}

// drainHandlers lets every waiting caller have its answer before the run
// closes, also when the run was cancelled.
func drainHandlers(ctx workflow.Context) {
	_ = awaitAnswer(ctx, func() bool { return workflow.AllHandlersFinished(ctx) })
}

// undecidedMessage says why a run ended without a decision.
func undecidedMessage(err error) string {
	msg := "the claim ended without a decision"
	if err != nil {
		msg += ": " + err.Error()
	}
	return msg
}

// undecided is the answer of an enrollment claim whose run ended without a
// decision.
func undecided(id string, err error) Decision {
	return Decision{EnrollmentID: id, Status: StatusFailed, Message: undecidedMessage(err)}
}
