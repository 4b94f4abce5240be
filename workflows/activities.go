package workflows

import "time"

// Activity names. Workflows refer to activities by name rather than by
// function value so that this package never imports the I/O code; package
// activities implements a method of each name and the worker registers them.
const (
	ActivityReserveSeat       = "ReserveSeat"
	ActivityPublish           = "Publish"
	ActivityMarkConfirmed     = "MarkConfirmed"
	ActivityReleaseSeat       = "ReleaseSeat"
	ActivityRecordDeadLetter  = "RecordDeadLetter"
	ActivityResolveDeadLetter = "ResolveDeadLetter"
	ActivityCancelEnrollment  = "CancelEnrollment"
)

// ActivityNames lists every activity a worker must provide.
var ActivityNames = []string{
	ActivityReserveSeat, ActivityPublish, ActivityMarkConfirmed, ActivityReleaseSeat,
	ActivityRecordDeadLetter, ActivityResolveDeadLetter, ActivityCancelEnrollment,
}

// ReserveSeatInput claims one seat for one student. EnrollmentID is the
// idempotency key: a retried reservation with the same ID succeeds without
// taking a second seat.
type ReserveSeatInput struct {
	EnrollmentID string
	CourseID     string
	StudentID    string
	WorkflowID   string
	RunID        string
	RequestedAt  time.Time
}

type ReserveSeatResult struct {
	RecordedAt time.Time
}

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

type DeadLetterRecord struct {
	ID int64
}

// DeadLetterState is what happened to a dead letter.
type DeadLetterState string

const (
	DeadLetterOpen        DeadLetterState = "open"
	DeadLetterRetrying    DeadLetterState = "retrying"
	DeadLetterResolved    DeadLetterState = "resolved"
	DeadLetterCompensated DeadLetterState = "compensated"
	DeadLetterDiscarded   DeadLetterState = "discarded"
)

type ResolveDeadLetterInput struct {
	ID    int64
	State DeadLetterState
}

type CancelEnrollmentInput struct {
	EnrollmentID string
}

// CancelEnrollmentResult reports the enrollment after the cancellation.
// Changed is false when it was already cancelled (cancelling twice is harmless).
type CancelEnrollmentResult struct {
	Changed   bool
	CourseID  string
	StudentID string
	Status    EnrollmentStatus
}
