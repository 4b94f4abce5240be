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

type DeadLetterDecision struct {
	Action DeadLetterAction
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
	for round := 1; ; round++ {
		err := Publish.Execute(publishOptions(ctx), PublishInput{Message: msg, StampPublishedFor: stampFor})
		if err == nil {
			if *p.deadLetterID == 0 {
				return "", nil
			}
			// Resolve before the caller moves on, so that whoever sees the
			// enrollment confirmed also sees its dead letter resolved.
			p.unpark(ctx)
			return "", resolveDeadLetter(ctx, *p.deadLetterID, DeadLetterResolved)
		}
		if temporal.IsCanceledError(err) {
			return "", err
		}
		*p.lastError = err.Error()
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
		*p.deadLetterID = record.ID
		p.park(ctx)
		workflow.GetLogger(ctx).Error("event dead-lettered; waiting for an operator",
			"event_id", msg.Event.ID, "dead_letter_id", record.ID, "error", *p.lastError)

		action, err := awaitOperator(ctx, deadLetters)
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

// awaitOperator blocks until an operator decides; a decision it does not know
// (a typo on the CLI) is logged and ignored rather than guessed at.
func awaitOperator(ctx workflow.Context, decisions workflow.ReceiveChannel) (DeadLetterAction, error) {
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
