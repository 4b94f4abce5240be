package workflows

import "go.temporal.io/sdk/workflow"

// Activity is a typed reference to an activity that takes In and returns
// Out. Workflows call activities through these references rather than by
// method value because package activities imports this package for its
// inputs and results; the worker registers each implementation under its
// reference (worker.register), so the compiler checks that the method's
// signature matches In and Out, and Name, which histories record, is held
// in one place.
type Activity[In, Out any] struct{ Name string }

// Execute schedules the activity with the activity options on ctx and waits
// for its result.
func (a Activity[In, Out]) Execute(ctx workflow.Context, in In) (Out, error) {
	var out Out
	err := workflow.ExecuteActivity(ctx, a.Name, in).Get(ctx, &out)
	return out, err
}

// ExecuteLocal runs the activity as a local activity, in the worker that
// holds the workflow task, with the local activity options on ctx. It is
// called by its registered name, as the recorded histories have it.
func (a Activity[In, Out]) ExecuteLocal(ctx workflow.Context, in In) (Out, error) {
	var out Out
	err := workflow.ExecuteLocalActivity(ctx, a.Name, in).Get(ctx, &out)
	return out, err
}

// ActivityNoResult is a typed reference to an activity that takes In and
// returns only an error.
type ActivityNoResult[In any] struct{ Name string }

// Execute schedules the activity with the activity options on ctx and waits
// for it to finish.
func (a ActivityNoResult[In]) Execute(ctx workflow.Context, in In) error {
	return workflow.ExecuteActivity(ctx, a.Name, in).Get(ctx, nil)
}

// ExecuteLocal runs the activity as a local activity; see Activity.ExecuteLocal.
func (a ActivityNoResult[In]) ExecuteLocal(ctx workflow.Context, in In) error {
	return workflow.ExecuteLocalActivity(ctx, a.Name, in).Get(ctx, nil)
}

// Every activity a workflow calls. Names are recorded in histories: changing
// one breaks the replay of runs in flight. Each is implemented by the method
// of the same name on activities.Activities (DeliverNotification and
// RecordConsumeDeadLetter: the consumer's activities) and registered in
// worker.RegisterActivities.
var (
	// Publish is activities.(*Activities).Publish.
	Publish = ActivityNoResult[PublishInput]{Name: "Publish"}
	// MarkConfirmed is activities.(*Activities).MarkConfirmed; its input is
	// the enrollment ID.
	MarkConfirmed = ActivityNoResult[string]{Name: "MarkConfirmed"}
	// ReleaseSeat is activities.(*Activities).ReleaseSeat.
	ReleaseSeat = ActivityNoResult[ReleaseSeatInput]{Name: "ReleaseSeat"}
	// RecordDeadLetter is activities.(*Activities).RecordDeadLetter.
	RecordDeadLetter = Activity[DeadLetterInput, DeadLetterRecord]{Name: "RecordDeadLetter"}
	// ResolveDeadLetter is activities.(*Activities).ResolveDeadLetter.
	ResolveDeadLetter = ActivityNoResult[ResolveDeadLetterInput]{Name: "ResolveDeadLetter"}
	// CancelEnrollment is activities.(*Activities).CancelEnrollment.
	CancelEnrollment = Activity[CancelEnrollmentInput, CancelEnrollmentResult]{Name: "CancelEnrollment"}
	// PromoteWaitlist is activities.(*Activities).PromoteWaitlist.
	PromoteWaitlist = Activity[PromoteWaitlistInput, PromoteWaitlistResult]{Name: "PromoteWaitlist"}

	// ReserveSeats is activities.(*Activities).ReserveSeats; a local
	// activity of the desk.
	ReserveSeats = Activity[ReserveSeatsInput, ReserveSeatsResult]{Name: "ReserveSeats"}
	// PublishBatch is activities.(*Activities).PublishBatch; local on the
	// desk, an ordinary activity on the batch run's retry policy.
	PublishBatch = ActivityNoResult[PublishBatchInput]{Name: "PublishBatch"}
	// ConfirmBatch is activities.(*Activities).ConfirmBatch; a local
	// activity whose input is the enrollment IDs.
	ConfirmBatch = ActivityNoResult[[]string]{Name: "ConfirmBatch"}
	// ReleaseSeats is activities.(*Activities).ReleaseSeats, the batch's
	// compensation; its input is the enrollment IDs.
	ReleaseSeats = ActivityNoResult[[]string]{Name: "ReleaseSeats"}
	// FindStrandedReservations is
	// activities.(*Activities).FindStrandedReservations.
	FindStrandedReservations = Activity[RecoverReservationsInput, FindStrandedResult]{Name: "FindStrandedReservations"}

	// ReserveCoupon is activities.(*Activities).ReserveCoupon.
	ReserveCoupon = Activity[ReserveCouponInput, ReserveCouponResult]{Name: "ReserveCoupon"}
	// RevokeCoupon is activities.(*Activities).RevokeCoupon.
	RevokeCoupon = Activity[RevokeCouponInput, RevokeCouponResult]{Name: "RevokeCoupon"}
	// MarkCouponUsed is activities.(*Activities).MarkCouponUsed.
	MarkCouponUsed = Activity[MarkCouponUsedInput, MarkCouponUsedResult]{Name: "MarkCouponUsed"}
	// UnmarkCouponUsed is activities.(*Activities).UnmarkCouponUsed.
	UnmarkCouponUsed = ActivityNoResult[UnmarkCouponUsedInput]{Name: "UnmarkCouponUsed"}
	// PayVendor is activities.(*Activities).PayVendor.
	PayVendor = Activity[PayVendorInput, PayVendorResult]{Name: "PayVendor"}
	// RecordPayout is activities.(*Activities).RecordPayout.
	RecordPayout = Activity[RecordPayoutInput, RecordPayoutResult]{Name: "RecordPayout"}

	// DeliverNotification is consumer.(*Activities).DeliverNotification.
	DeliverNotification = Activity[DeliverNotificationInput, DeliverNotificationResult]{Name: "DeliverNotification"}
	// RecordConsumeDeadLetter is
	// consumer.(*Activities).RecordConsumeDeadLetter.
	RecordConsumeDeadLetter = Activity[ConsumeDeadLetterInput, DeadLetterRecord]{Name: "RecordConsumeDeadLetter"}
)

// PublishInput sends one message with acks from all in-sync replicas.
// StampPublishedFor, when set, names the enrollment whose published_at is
// recorded once the broker acknowledged.
type PublishInput struct {
	Message           Message
	StampPublishedFor string
}

// ReleaseSeatInput gives a reserved seat back and ends the enrollment as
// failed. Releasing twice frees one seat.
type ReleaseSeatInput struct {
	EnrollmentID string
}

// DeadLetterInput parks a message that exhausted its retry policy. Round
// counts how often this message has been dead-lettered in this run, so a
// retried activity does not count twice.
type DeadLetterInput struct {
	Message      Message
	WorkflowID   string
	RunID        string
	EnrollmentID string
	Error        string
	Round        int
}

// DeadLetterRecord is the dead letter's row: its ID and the round it
// recorded (dead_letters.rounds), which a decision names.
type DeadLetterRecord struct {
	ID    int64
	Round int `json:",omitempty"`
}

// DeadLetterState is what happened to a dead letter.
type DeadLetterState string

const (
	DeadLetterOpen     DeadLetterState = "open"
	DeadLetterRetrying DeadLetterState = "retrying"
	// DeadLetterCompensating: the API took an operator's compensate; the
	// run marks the row compensated (or discarded) once it has compensated.
	DeadLetterCompensating DeadLetterState = "compensating"
	DeadLetterResolved     DeadLetterState = "resolved"
	DeadLetterCompensated  DeadLetterState = "compensated"
	DeadLetterDiscarded    DeadLetterState = "discarded"
)

type ResolveDeadLetterInput struct {
	ID    int64
	State DeadLetterState
}

// CancelEnrollmentInput cancels one enrollment for the run RunID, which the
// row records, so that the run's retry after a lost answer is told what its
// first attempt did.
type CancelEnrollmentInput struct {
	EnrollmentID string
	RunID        string
}

// CancelEnrollmentResult reports the enrollment after the cancellation.
// Changed is false when it was already cancelled (cancelling twice is harmless).
type CancelEnrollmentResult struct {
	Changed   bool
	CourseID  string
	StudentID string
	Status    EnrollmentStatus
	// FreedSeat: a confirmed enrollment gave its seat back, which the
	// course's waitlist may take. LeftWaitlist: a waitlisted one left the
	// queue; it held no seat and nobody downstream heard of it.
	FreedSeat    bool `json:",omitempty"`
	LeftWaitlist bool `json:",omitempty"`
}

// PromoteWaitlistInput promotes the head of a course's waitlist into every
// free seat. By names the step that freed the seats; a retry with the same
// By returns what it promoted before, so each promoted enrollment gets its
// run exactly once.
type PromoteWaitlistInput struct {
	CourseID string
	By       string
}

// PromoteWaitlistResult lists the promoted enrollments, in queue order.
type PromoteWaitlistResult struct {
	Promoted []EnrollmentInput
}
