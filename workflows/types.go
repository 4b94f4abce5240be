// Package workflows holds claimflow's domain logic: the sagas that claim scarce
// things, in the order their steps run, with their compensations and retry
// policies. It does no I/O itself; every effect is an activity named here and
// implemented in package activities.
package workflows

import (
	"errors"
	"fmt"
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
// StudentId are lists because a batch run carries many enrollments; on a
// list "=" means "contains", so one query finds single and batch runs.
var (
	SearchCourseID    = temporal.NewSearchAttributeKeyKeywordList("CourseId")
	SearchStudentID   = temporal.NewSearchAttributeKeyKeywordList("StudentId")
	SearchClaimStatus = temporal.NewSearchAttributeKeyKeyword("ClaimStatus")
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
	// StatusRefused: a business refusal ended the run; Refusal says which.
	StatusRefused EnrollmentStatus = "refused"
)

// Refusal is a business "no". Refusals are answers, not faults: activities
// return them as non-retryable application errors whose type is the code.
type Refusal string

const (
	RefusalCourseFull      Refusal = "course_full"
	RefusalAlreadyEnrolled Refusal = "already_enrolled"
	RefusalCourseNotFound  Refusal = "course_not_found"
	// The enrollment refusals answer cancellations.
	RefusalEnrollmentNotFound Refusal = "enrollment_not_found"
	RefusalEnrollmentPending  Refusal = "enrollment_pending"
	RefusalEnrollmentInactive Refusal = "enrollment_not_active"
)

// Refuse builds the error an activity returns for a business refusal. It is
// benign: an expected answer, logged quietly and not counted as a failure.
func Refuse(r Refusal, format string, args ...any) error {
	return temporal.NewApplicationErrorWithOptions(fmt.Sprintf(format, args...), string(r),
		temporal.ApplicationErrorOptions{NonRetryable: true, Category: temporal.ApplicationErrorCategoryBenign})
}

// RefusalWithHolder is a refusal that names the enrollment already holding
// the claim, so the caller can be pointed at it.
func RefusalWithHolder(r Refusal, holder, format string, args ...any) error {
	return temporal.NewApplicationErrorWithOptions(fmt.Sprintf(format, args...), string(r),
		temporal.ApplicationErrorOptions{NonRetryable: true, Category: temporal.ApplicationErrorCategoryBenign, Details: []any{holder}})
}

type refused struct {
	Refusal Refusal
	Message string
	Holder  string
}

// refusalOf extracts the refusal from an activity error, if it is one.
func refusalOf(err error) (refused, bool) {
	var appErr *temporal.ApplicationError
	if !errors.As(err, &appErr) {
		return refused{}, false
	}
	r := refused{Refusal: Refusal(appErr.Type()), Message: appErr.Message()}
	switch r.Refusal {
	case RefusalCourseFull, RefusalAlreadyEnrolled, RefusalCourseNotFound,
		RefusalEnrollmentNotFound, RefusalEnrollmentPending, RefusalEnrollmentInactive:
	default:
		return refused{}, false
	}
	if appErr.HasDetails() {
		_ = appErr.Details(&r.Holder)
	}
	return r, true
}

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
