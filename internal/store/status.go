package store

// Status values as the tables store them, for the predicates that compare
// with them. They are literals (not conversions of the workflows' typed
// constants) so that SQL built from them stays a constant expression that
// the SQL checks can see; status_test.go ties each to the workflows' name
// for the same state.
const (
	EnrollmentReserved     = "reserved"
	EnrollmentConfirmed    = "confirmed"
	EnrollmentDeadLettered = "dead_lettered"
	EnrollmentWaitlisted   = "waitlisted"

	CouponUsed    = "used"
	CouponRevoked = "revoked"

	DeadLetterOpen         = "open"
	DeadLetterRetrying     = "retrying"
	DeadLetterCompensating = "compensating"
	DeadLetterResolved     = "resolved"

	// Dead letters come from two stages: a saga's publish or the
	// consumer's delivery of a notification.
	StagePublish = "publish"
	StageConsume = "consume"
)

// EnrollmentStatuses and CouponStatuses are every value of the tables'
// status columns, for the lists' ?status= filters;
// TestStatusListsAreTheChecks ties each to its table's CHECK constraint.
var (
	EnrollmentStatuses = []string{EnrollmentReserved, EnrollmentConfirmed, EnrollmentDeadLettered, "failed", "cancelled", EnrollmentWaitlisted}
	CouponStatuses     = []string{"issued", "using", CouponUsed, CouponRevoked}
)
