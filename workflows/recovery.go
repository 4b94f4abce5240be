package workflows

import (
	"fmt"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"
)

// Reservations that no run finishes, and how they get one.
//
// A desk reserves seats in a local activity, inside its workflow task, for
// claims that reached it as an update. Temporal persists an update only
// once the workflow task that accepted it completes. Should the worker die
// after the reservation committed and before that task completed, and the
// Temporal server lose the update with it (it keeps an admitted update in
// memory), and the API that sent it die too, then nobody holds the claims:
// their rows stay reserved, their seats taken, with no run to publish their
// events or to give the seats back.
//
// RecoverReservations, run by a Temporal schedule (ReservationRecoveryScheduleID),
// finds such rows — reserved by a desk's batch longer than a bound ago,
// with no event out — and starts their batch's run (EnrollmentBatch,
// enrollment-batch:<batch id>), the very run the desk starts when its
// publish fails. The run publishes enrollment.confirmed and confirms, so
// the claim ends as the student asked: the seat was durably theirs. A batch
// whose run exists already has an owner and is left alone. The batch ID,
// the run's ID and the event IDs are the same whoever starts it, so a desk
// and the recovery racing over one batch start one run and publish one
// event per enrollment.

// ReservationRecoveryScheduleID names the schedule that runs
// RecoverReservations.
const ReservationRecoveryScheduleID = "reservation-recovery"

// ReservationRecoveryWorkflowID is the run the schedule starts (the server
// appends the time).
const ReservationRecoveryWorkflowID = "reservation-recovery"

// RecoverReservationsInput bounds one recovery.
type RecoverReservationsInput struct {
	// OlderThan: a reservation recorded longer ago than this and still
	// reserved has no live desk behind it. A desk holds a reservation
	// unfinished for at most one workflow task, itself bounded by its
	// local activities' timeouts (DecisionDeadline of a claim).
	OlderThan time.Duration
	// Limit bounds the reservations one run takes on.
	Limit int
}

// StrandedBatch is a batch's reservations that nobody finishes.
type StrandedBatch struct {
	BatchID string
	Claims  []EnrollmentInput
	// Oldest is when the oldest of them was recorded.
	Oldest time.Time
}

// FindStrandedResult lists the stranded batches, oldest first.
type FindStrandedResult struct {
	Batches []StrandedBatch
}

// RecoveryState is what a recovery run did.
type RecoveryState struct {
	Found   int      // reservations found
	Started []string // batches whose run this recovery started
	Owned   []string // batches that already had their run
}

// RecoverReservations starts the run of every batch with reservations
// that nobody finishes.
func RecoverReservations(ctx workflow.Context, in RecoverReservationsInput) (RecoveryState, error) {
	var state RecoveryState
	found, err := FindStrandedReservations.Execute(databaseOptions(ctx), in)
	if err != nil {
		return state, fmt.Errorf("find stranded reservations: %w", err)
	}
	futures := make([]workflow.ChildWorkflowFuture, len(found.Batches))
	for i, b := range found.Batches {
		state.Found += len(b.Claims)
		futures[i] = startBatchRun(ctx, EnrollmentBatchInput{BatchID: b.BatchID, Claims: b.Claims})
	}
	for i, f := range futures {
		b := found.Batches[i]
		err := f.GetChildWorkflowExecution().Get(ctx, nil)
		switch {
		case err == nil:
			state.Started = append(state.Started, b.BatchID)
			workflow.GetLogger(ctx).Warn("recovered stranded reservations: their batch run is started",
				"batch_id", b.BatchID, "claims", len(b.Claims), "oldest", b.Oldest)
		case temporal.IsWorkflowExecutionAlreadyStartedError(err):
			state.Owned = append(state.Owned, b.BatchID)
		default:
			return state, fmt.Errorf("start the run of batch %s: %w", b.BatchID, err)
		}
	}
	return state, nil
}
