package workflows

import (
	"errors"
	"fmt"

	"go.temporal.io/sdk/temporal"
)

// Refusal is a business "no". Refusals are answers, not faults: activities
// return them as non-retryable application errors whose type is the code.
type Refusal string

// Enrollment refusals.
const (
	RefusalCourseFull      Refusal = "course_full"
	RefusalAlreadyEnrolled Refusal = "already_enrolled"
	RefusalCourseNotFound  Refusal = "course_not_found"
	// The enrollment refusals answer cancellations.
	RefusalEnrollmentNotFound Refusal = "enrollment_not_found"
	RefusalEnrollmentPending  Refusal = "enrollment_pending"
	RefusalEnrollmentInactive Refusal = "enrollment_not_active"
	// RefusalWaitlistFull: the course is full and so is its waitlist.
	RefusalWaitlistFull Refusal = "waitlist_full"
)

// Coupon refusals. payout_declined and payout_failed answer a use whose
// payout did not go through; the use was compensated.
const (
	RefusalSoldOut            Refusal = "sold_out"
	RefusalAlreadyIssued      Refusal = "already_issued"
	RefusalCouponTypeNotFound Refusal = "coupon_type_not_found"
	RefusalCouponNotFound     Refusal = "coupon_not_found"
	RefusalNotOwner           Refusal = "not_owner"
	RefusalAlreadyUsed        Refusal = "already_used"
	RefusalCouponRevoked      Refusal = "coupon_revoked"
	RefusalPayoutDeclined     Refusal = "payout_declined"
	RefusalPayoutFailed       Refusal = "payout_failed"
	// RefusalOwnCouponType: the user is the coupon type's vendor, who may
	// neither hold nor use a coupon that pays itself.
	RefusalOwnCouponType Refusal = "own_coupon_type"
)

// activityRefusals is the one registry of the refusals an activity may
// answer with; an application error of any other type is a fault.
// payout_failed is not among them: no activity answers it, UseCoupon
// decides it when the payout policy is spent.
var activityRefusals = map[Refusal]bool{
	RefusalCourseFull: true, RefusalAlreadyEnrolled: true, RefusalCourseNotFound: true,
	RefusalEnrollmentNotFound: true, RefusalEnrollmentPending: true, RefusalEnrollmentInactive: true,
	RefusalWaitlistFull: true,

	RefusalSoldOut: true, RefusalAlreadyIssued: true, RefusalCouponTypeNotFound: true,
	RefusalCouponNotFound: true, RefusalNotOwner: true, RefusalAlreadyUsed: true,
	RefusalCouponRevoked: true, RefusalPayoutDeclined: true, RefusalOwnCouponType: true,
}

// Refuse builds the error an activity returns for a business refusal. It is
// benign: an expected answer, logged quietly and not counted as a failure.
func Refuse(r Refusal, format string, args ...any) error {
	return temporal.NewApplicationErrorWithOptions(fmt.Sprintf(format, args...), string(r),
		temporal.ApplicationErrorOptions{NonRetryable: true, Category: temporal.ApplicationErrorCategoryBenign})
}

// RefusalWithHolder is a refusal that names the claim already holding what
// was asked for (an enrollment, a coupon), so the caller can be pointed at it.
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
	if !errors.As(err, &appErr) || !activityRefusals[Refusal(appErr.Type())] {
		return refused{}, false
	}
	r := refused{Refusal: Refusal(appErr.Type()), Message: appErr.Message()}
	if appErr.HasDetails() {
		_ = appErr.Details(&r.Holder)
	}
	return r, true
}
