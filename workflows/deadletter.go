package workflows

import (
	"fmt"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"
)

// SignalDeadLetter carries an operator's DeadLetterDecision.
const SignalDeadLetter = "dead-letter"

// DeadLetterAction is an operator's choice for a parked message.
type DeadLetterAction string

const (
	ActionRetry      DeadLetterAction = "retry"
	ActionCompensate DeadLetterAction = "compensate"
)

// DeadLetterDecision is the payload of SignalDeadLetter. DeadLetterID and
// Round name the dead letter the decision is for, as the API read it
// (dead_letters.id and .rounds): a run applies it only to that dead letter
// in that round, so a duplicate or stale decision (a second concurrent call,
// a decision for a round already retried) is ignored instead of being
// applied to whatever the run parks next. A decision without an ID (an
// operator's `temporal workflow signal --query …` over many runs) applies to the dead letter open
// when the run takes it; one that arrives while no dead letter is open is
// dropped (see dropUndecidable). Round 0 with an ID means any round of it.
type DeadLetterDecision struct {
	Action       DeadLetterAction
	DeadLetterID int64 `json:",omitempty"`
	Round        int   `json:",omitempty"`
}

// parked is the dead letter a run waits on: its row's ID and the round the
// row recorded (it may be ahead of the run's count when an earlier run of
// the same event dead-lettered it).
type parked struct {
	ID    int64
	Round int
}

// accepts reports whether d is a decision for p.
func (p parked) accepts(d DeadLetterDecision) bool {
	if d.DeadLetterID == 0 {
		return true
	}
	return d.DeadLetterID == p.ID && (d.Round == 0 || d.Round == p.Round)
}

// dropUndecidable discards the decisions that arrived while no dead letter
// of this run was open (between a decision and the next round's record, or
// before the first) — duplicates of a decision already taken, or a bulk CLI
// signal that reached the run while it was retrying — so that none of them
// is applied to the dead letter about to be recorded. Call it just before
// recording one: a decision sent once the new row is open arrives after.
func dropUndecidable(ctx workflow.Context, decisions workflow.ReceiveChannel) {
	for {
		var d DeadLetterDecision
		if !decisions.ReceiveAsync(&d) {
			return
		}
		workflow.GetLogger(ctx).Warn("ignoring a dead-letter decision that arrived while no dead letter was open",
			"action", d.Action, "dead_letter_id", d.DeadLetterID, "round", d.Round)
	}
}

// publishOrDeadLetter publishes msg on the publish retry policy. When the
// policy is exhausted it parks the message (a dead-letter row, a copy on the
// .DLT topic, status dead_lettered) and waits for an operator: retry publishes
// again with the same event ID, compensate returns ActionCompensate to the
// caller. It returns "" once the message is published (and any dead letter
// it left on the way is resolved).
func publishOrDeadLetter(ctx workflow.Context, state *EnrollmentState, msg Message, stampFor string,
	setStatus func(workflow.Context, EnrollmentStatus)) (DeadLetterAction, error) {
	statusBefore := state.Status
	return publishOrPark(ctx, msg, stampFor, parking{
		deadLetterID: &state.DeadLetterID,
		lastError:    &state.LastError,
		park:         func(ctx workflow.Context) { setStatus(ctx, StatusDeadLettered) },
		unpark:       func(ctx workflow.Context) { setStatus(ctx, statusBefore) },
	})
}

// parking is the part of a run's state the publish-or-dead-letter loop keeps
// current, whatever the saga: the open dead letter, the last error, and how
// the run shows that it is parked (status dead_lettered) and no longer is.
type parking struct {
	deadLetterID *int64
	lastError    *string
	park, unpark func(workflow.Context)
}

// publishOrPark is publishOrDeadLetter for any saga. stampFor names the
// enrollment whose published_at and dead-letter status are kept ("" for
// none).
func publishOrPark(ctx workflow.Context, msg Message, stampFor string, p parking) (DeadLetterAction, error) {
	info := workflow.GetInfo(ctx)
	deadLetters := workflow.GetSignalChannel(ctx, SignalDeadLetter)
	// recorded is the dead letter this call left, if any. The state's ID
	// stays after a resolved dead letter (reads show it), so a later publish
	// of the same run must not resolve that one again.
	var recorded int64
	for round := 1; ; round++ {
		err := Publish.Execute(publishOptions(ctx), PublishInput{Message: msg, StampPublishedFor: stampFor})
		if err == nil {
			if recorded == 0 {
				return "", nil
			}
			// Resolve before the caller moves on, so that whoever sees the
			// enrollment confirmed also sees its dead letter resolved.
			p.unpark(ctx)
			return "", resolveDeadLetter(ctx, recorded, DeadLetterResolved)
		}
		if temporal.IsCanceledError(err) {
			return "", err
		}
		*p.lastError = err.Error()
		dropUndecidable(ctx, deadLetters)
		record, err := RecordDeadLetter.Execute(databaseOptions(ctx), DeadLetterInput{
			Message:      msg,
			WorkflowID:   info.WorkflowExecution.ID,
			RunID:        info.WorkflowExecution.RunID,
			EnrollmentID: stampFor,
			Error:        *p.lastError,
			Round:        round,
		})
		if err != nil {
			return "", fmt.Errorf("record dead letter for %s: %w", msg.Event.ID, err)
		}
		recorded, *p.deadLetterID = record.ID, record.ID
		open := parked(record)
		round = open.Round
		p.park(ctx)
		workflow.GetLogger(ctx).Error("event dead-lettered; waiting for an operator",
			"event_id", msg.Event.ID, "dead_letter_id", record.ID, "round", open.Round, "error", *p.lastError)

		action, err := awaitOperator(ctx, deadLetters, open)
		if err != nil {
			return "", err
		}
		if action == ActionCompensate {
			return ActionCompensate, nil
		}
		if err := resolveDeadLetter(ctx, record.ID, DeadLetterRetrying); err != nil {
			return "", err
		}
	}
}

// awaitOperator blocks until an operator decides on the open dead letter; a
// decision it does not know (a typo on the CLI) or one named for another
// dead letter or round (a duplicate, a stale page) is logged and ignored
// rather than guessed at.
func awaitOperator(ctx workflow.Context, decisions workflow.ReceiveChannel, open parked) (DeadLetterAction, error) {
	for {
		var decision DeadLetterDecision
		cancelled := false
		sel := workflow.NewSelector(ctx)
		sel.AddReceive(decisions, func(c workflow.ReceiveChannel, _ bool) { c.Receive(ctx, &decision) })
		sel.AddReceive(ctx.Done(), func(workflow.ReceiveChannel, bool) { cancelled = true })
		sel.Select(ctx)
		if cancelled {
			return "", temporal.NewCanceledError()
		}
		if !open.accepts(decision) {
			workflow.GetLogger(ctx).Warn("ignoring a dead-letter decision for another dead letter or round",
				"action", decision.Action, "for_id", decision.DeadLetterID, "for_round", decision.Round,
				"open_id", open.ID, "open_round", open.Round)
			continue
		}
		switch decision.Action {
		case ActionRetry, ActionCompensate:
			return decision.Action, nil
		}
		workflow.GetLogger(ctx).Warn("ignoring unknown dead-letter decision; send retry or compensate",
			"action", decision.Action)
	}
}

func resolveDeadLetter(ctx workflow.Context, id int64, state DeadLetterState) error {
	if id == 0 {
		return nil
	}
	err := ResolveDeadLetter.Execute(databaseOptions(ctx), ResolveDeadLetterInput{ID: id, State: state})
	if err != nil {
		return fmt.Errorf("mark dead letter %d %s: %w", id, state, err)
	}
	return nil
}
