// Package workflows holds claimflow's domain logic: the sagas that claim scarce
// things, in the order their steps run, with their compensations and retry
// policies. It does no I/O itself; every effect is an activity named here and
// implemented in package activities.
package workflows

import (
	"time"

	"go.temporal.io/sdk/temporal"
)

// TaskQueue is where every claimflow workflow and activity is scheduled.
const TaskQueue = "claimflow"

// Topic names. The DLT suffix follows the Spring Kafka convention the user's
// source systems already use for manual reprocessing.
const (
	EnrollmentTopic    = "enrollment.events"
	EnrollmentDLTTopic = EnrollmentTopic + ".DLT"
)

// Search attributes kept on every run so operators can filter in the UI and
// with `temporal workflow list --query "CourseId='cs101'"`. CourseId and
// StudentId are lists because a desk run carries many enrollments; on a
// list "=" means "contains", so one query finds single and desk runs.
var (
	SearchCourseID    = temporal.NewSearchAttributeKeyKeywordList("CourseId")
	SearchStudentID   = temporal.NewSearchAttributeKeyKeywordList("StudentId")
	SearchClaimStatus = temporal.NewSearchAttributeKeyKeyword("ClaimStatus")
	// RefusedStudentIds: the students a desk run refused, set when the run
	// closes (see deskOutcome for what StudentId and CourseId then hold).
	SearchRefusedStudentIDs = temporal.NewSearchAttributeKeyKeywordList("RefusedStudentIds")
	// Coupon runs: `CouponTypeId='spring-10' AND ClaimStatus='payout_failed'`.
	SearchCouponID     = temporal.NewSearchAttributeKeyKeyword("CouponId")
	SearchCouponTypeID = temporal.NewSearchAttributeKeyKeyword("CouponTypeId")
	SearchVendorID     = temporal.NewSearchAttributeKeyKeyword("VendorId")
)

// SearchAttributeTypes is what a Temporal server must have registered for the
// attributes above; the local stack registers them at start.
var SearchAttributeTypes = map[string]string{
	"CourseId":    "KeywordList",
	"StudentId":   "KeywordList",
	"ClaimStatus": "Keyword",
	// The third and last KeywordList a namespace on SQL visibility (the dev
	// server's SQLite, compose's PostgreSQL) can have: it has three columns
	// of that type.
	"RefusedStudentIds": "KeywordList",
	// coupons
	"CouponId":     "Keyword",
	"CouponTypeId": "Keyword",
	"VendorId":     "Keyword",
}

// EnrollmentStatus is the lifecycle of one enrollment, stored in Postgres and
// mirrored into the ClaimStatus search attribute.
type EnrollmentStatus string

const (
	// StatusPending: the run started but the seat is not decided yet.
	StatusPending      EnrollmentStatus = "pending"
	StatusReserved     EnrollmentStatus = "reserved"
	StatusConfirmed    EnrollmentStatus = "confirmed"
	StatusDeadLettered EnrollmentStatus = "dead_lettered"
	StatusFailed       EnrollmentStatus = "failed"
	StatusCancelled    EnrollmentStatus = "cancelled"
	// StatusWaitlisted: the course was full and the claim asked to wait;
	// Decision.Position is its place in the course's queue.
	StatusWaitlisted EnrollmentStatus = "waitlisted"
	// StatusRefused: a business refusal ended the run; Refusal says which.
	StatusRefused EnrollmentStatus = "refused"
	// StatusHandedOff: a batch run whose publish ran out of retries handed
	// its reserved enrollments to Enrollment runs of their own, which
	// dead-letter and then confirm or fail them. Only a closed batch run's
	// ClaimStatus holds it.
	StatusHandedOff EnrollmentStatus = "handed_off"
)

// Event is the JSON envelope published to Kafka. ID is derived in the
// workflow, so a republish after a lost ack carries the same ID and every
// consumer can dedupe on it.
type Event struct {
	ID         string         `json:"event_id"`
	Type       string         `json:"type"`
	OccurredAt time.Time      `json:"occurred_at"`
	Data       map[string]any `json:"data"`
}

// Message is one event on its way to a topic.
type Message struct {
	Topic string
	Key   string
	Event Event
}

// Event types on EnrollmentTopic.
const (
	EventEnrollmentConfirmed = "enrollment.confirmed"
	EventEnrollmentCancelled = "enrollment.cancelled"
	EventEnrollmentFailed    = "enrollment.failed"
)

// EventID derives an event's ID from the enrollment and what happened to it:
// one enrollment has at most one event of each type.
func EventID(enrollmentID, eventType string) string {
	return enrollmentID + "/" + eventType
}
