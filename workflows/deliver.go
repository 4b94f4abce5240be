package workflows

import (
	"errors"
	"fmt"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"
)

// The event consumer applies each event's notification inline and hands an
// event to a DeliverEvent run only when that inline attempt failed, so the
// happy path never pays for a workflow.

// ConsumedTopics are the topics the consumer reads unless configured
// otherwise.
var ConsumedTopics = []string{EnrollmentTopic, CouponTopic}

// DeliverEventWorkflowID is derived from the event ID alone: a redelivered
// event (a crash or a rebalance before its offset was committed) joins the
// run that already owns it instead of starting a second one.
func DeliverEventWorkflowID(eventID string) string {
	return "deliver:" + eventID
}

// ConsumedEvent is one record read from a topic, as the consumer hands it
// over. Value is kept as it was on the topic, so a malformed event can still
// be dead-lettered and inspected.
type ConsumedEvent struct {
	Topic     string
	Partition int32
	Offset    int64
	Key       string
	// EventID comes from the envelope (or the event_id header); a record
	// without one is identified by its position, "<topic>/<partition>@<offset>".
	EventID   string
	EventType string `json:",omitempty"`
	Value     string
	// Malformed says why no notification can be built from Value; such an
	// event is dead-lettered at once.
	Malformed string `json:",omitempty"`
}

type DeliverEventInput struct {
	Event ConsumedEvent
	// InlineError is why the consumer's own attempt failed. It counts as the
	// first attempt of DeliveryRetryPolicy.
	InlineError string
}

// DeliverNotificationInput delivers one event's notification. PriorAttempts
// counts attempts made before this activity's own, for the record.
type DeliverNotificationInput struct {
	Event         ConsumedEvent
	PriorAttempts int
}

type DeliverNotificationResult struct {
	// AlreadyDone: the notification existed (or the event was discarded)
	// before this call, so nothing was sent.
	AlreadyDone bool
	Attempts    int
}

// ConsumeDeadLetterInput parks an event whose notification exhausted its
// retry policy: a dead_letters row with stage consume and a copy on
// <topic>.DLT carrying the error.
type ConsumeDeadLetterInput struct {
	Event      ConsumedEvent
	WorkflowID string
	RunID      string
	Error      string
	Round      int
}

// DeliveryStatus is the life of one DeliverEvent run.
type DeliveryStatus string

const (
	DeliveryRetrying     DeliveryStatus = "retrying"
	DeliveryDeadLettered DeliveryStatus = "dead_lettered"
	DeliveryDelivered    DeliveryStatus = "delivered"
	DeliveryDiscarded    DeliveryStatus = "discarded"
	// DeliveryFailed: the run ended on a fault before it delivered or
	// parked the event.
	DeliveryFailed DeliveryStatus = "failed"
)

// DeliveryState is what the status query of a DeliverEvent run returns.
type DeliveryState struct {
	EventID      string
	Topic        string
	Status       DeliveryStatus
	Attempts     int
	DeadLetterID int64  `json:",omitempty"`
	LastError    string `json:",omitempty"`
}

// DeliveryRetryPolicy is the user's consumer backoff, 1 s → 2 s → 4 s: four
// attempts, then the event is dead-lettered. When the consumer's inline
// attempt already failed, that attempt is the first of the four.
var DeliveryRetryPolicy = &temporal.RetryPolicy{
	InitialInterval:    time.Second,
	BackoffCoefficient: 2,
	MaximumInterval:    4 * time.Second,
	MaximumAttempts:    4,
}

// afterInlineAttempt is DeliveryRetryPolicy with its first attempt already
// spent: wait one initial interval, then the remaining attempts with the
// intervals that follow. Deliveries thus happen 1 s, 3 s and 7 s after the
// inline failure, as in the user's error handler, and not twice at once.
func afterInlineAttempt(p *temporal.RetryPolicy) (time.Duration, *temporal.RetryPolicy) {
	rest := *p
	rest.InitialInterval = time.Duration(float64(p.InitialInterval) * p.BackoffCoefficient)
	if p.MaximumInterval > 0 && rest.InitialInterval > p.MaximumInterval {
		rest.InitialInterval = p.MaximumInterval
	}
	if p.MaximumAttempts > 1 {
		rest.MaximumAttempts = p.MaximumAttempts - 1
	}
	return p.InitialInterval, &rest
}

func deliveryOptions(ctx workflow.Context, policy *temporal.RetryPolicy) workflow.Context {
	return workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		// The webhook call is bounded well below this (see activities.Sink).
		StartToCloseTimeout: 30 * time.Second,
		RetryPolicy:         policy,
	})
}

// DeliverEvent delivers one consumed event's notification on
// DeliveryRetryPolicy. When the policy is exhausted the event is
// dead-lettered and the run waits for an operator's SignalDeadLetter:
// retry runs the policy again, compensate discards the event (no
// notification will be sent for it, even if Kafka delivers it again).
func DeliverEvent(ctx workflow.Context, in DeliverEventInput) (DeliveryState, error) {
	// A delivery has no decision to answer: its callers are operators, who
	// query its status and signal it.
	c := &claim[DeliveryState, struct{}]{state: DeliveryState{EventID: in.Event.EventID, Topic: in.Event.Topic, Status: DeliveryRetrying}}
	state := &c.state
	if in.InlineError != "" {
		state.Attempts, state.LastError = 1, in.InlineError
	}
	if err := c.register(ctx, nil); err != nil {
		return *state, err
	}
	err := deliverEvent(ctx, in, state)
	if temporal.IsCanceledError(err) && state.DeadLetterID != 0 {
		// An operator cancelling a parked delivery gives up on it, like
		// compensate; the dead letter must not stay open for a run that
		// can no longer take a decision.
		dctx, cancel := workflow.NewDisconnectedContext(ctx)
		defer cancel()
		setDeliveryStatus(dctx, state, DeliveryDiscarded)
		if rerr := resolveDeadLetter(dctx, state.DeadLetterID, DeadLetterDiscarded); rerr != nil {
			err = errors.Join(err, rerr)
		}
	}
	c.end(ctx, err, nil)
	// A delivery that never parked has no ClaimStatus yet; it gets its
	// outcome in the workflow task that closes the run, which costs no
	// visibility write (visibility.go).
	if state.DeadLetterID == 0 {
		if state.Status == DeliveryRetrying { // ended before delivering
			state.Status = DeliveryFailed
			if temporal.IsCanceledError(err) {
				state.Status = DeliveryDiscarded
			}
		}
		upsertClaimStatus(ctx, string(state.Status))
	}
	return *state, err
}

func deliverEvent(ctx workflow.Context, in DeliverEventInput, state *DeliveryState) error {
	info := workflow.GetInfo(ctx)
	decisions := workflow.GetSignalChannel(ctx, SignalDeadLetter)
	for round := 1; ; round++ {
		policy := DeliveryRetryPolicy
		if round == 1 && in.InlineError != "" && in.Event.Malformed == "" {
			var wait time.Duration
			wait, policy = afterInlineAttempt(DeliveryRetryPolicy)
			if err := workflow.Sleep(ctx, wait); err != nil {
				return err
			}
		}
		res, err := DeliverNotification.Execute(deliveryOptions(ctx, policy),
			DeliverNotificationInput{Event: in.Event, PriorAttempts: state.Attempts})
		if err == nil {
			if !res.AlreadyDone {
				state.Attempts = res.Attempts
			}
			state.LastError = ""
			if state.DeadLetterID == 0 {
				// Never parked: ClaimStatus is set only as the run closes,
				// which spares the server a visibility write per retried
				// event, the common case of the durable path.
				state.Status = DeliveryDelivered
				return nil
			}
			if err := resolveDeadLetter(ctx, state.DeadLetterID, DeadLetterResolved); err != nil {
				return err
			}
			setDeliveryStatus(ctx, state, DeliveryDelivered)
			return nil
		}
		if temporal.IsCanceledError(err) {
			return err
		}
		state.Attempts += attemptsOf(err, policy)
		state.LastError = err.Error()

		dropUndecidable(ctx, decisions)
		record, err := RecordConsumeDeadLetter.Execute(databaseOptions(ctx), ConsumeDeadLetterInput{
			Event:      in.Event,
			WorkflowID: info.WorkflowExecution.ID,
			RunID:      info.WorkflowExecution.RunID,
			Error:      state.LastError,
			Round:      round,
		})
		if err != nil {
			return fmt.Errorf("record dead letter for %s: %w", in.Event.EventID, err)
		}
		state.DeadLetterID = record.ID
		open := parked(record)
		round = open.Round
		setDeliveryStatus(ctx, state, DeliveryDeadLettered)
		workflow.GetLogger(ctx).Error("notification dead-lettered; waiting for an operator",
			"event_id", in.Event.EventID, "topic", in.Event.Topic, "dead_letter_id", record.ID, "round", open.Round,
			"error", state.LastError)

		action, err := awaitOperator(ctx, decisions, open)
		if err != nil {
			return err
		}
		if action == ActionCompensate {
			// A notification cannot be taken back; compensating one that was
			// never delivered means not delivering it.
			if err := resolveDeadLetter(ctx, state.DeadLetterID, DeadLetterDiscarded); err != nil {
				return err
			}
			setDeliveryStatus(ctx, state, DeliveryDiscarded)
			return nil
		}
		if err := resolveDeadLetter(ctx, state.DeadLetterID, DeadLetterRetrying); err != nil {
			return err
		}
		setDeliveryStatus(ctx, state, DeliveryRetrying)
	}
}

// attemptsOf counts the attempts an exhausted activity made: all of the
// policy's unless the error was non-retryable (a malformed event), which
// stops after one.
func attemptsOf(err error, policy *temporal.RetryPolicy) int {
	var appErr *temporal.ApplicationError
	if errors.As(err, &appErr) && appErr.NonRetryable() {
		return 1
	}
	return int(policy.MaximumAttempts)
}

// setDeliveryStatus mirrors the status into ClaimStatus, so the operators'
// existing filter ClaimStatus = "dead_lettered" lists parked deliveries too.
func setDeliveryStatus(ctx workflow.Context, state *DeliveryState, s DeliveryStatus) {
	state.Status = s
	upsertClaimStatus(ctx, string(s))
}
