package workflows_test

import (
	"testing"
	"time"

	"github.com/claimflow/claimflow/workflows"
)

// The event ID is the consumers' dedupe key, so it must be a function of the
// enrollment (or coupon key) and the event type alone: the same on every
// attempt and every replay, whatever the clock says, and different for
// different enrollments or types.
func TestEventIDIsDeterministic(t *testing.T) {
	for _, tc := range []struct {
		key, eventType, want string
	}{
		{"enr-1", workflows.EventEnrollmentConfirmed, "enr-1/enrollment.confirmed"},
		{"enr-1", workflows.EventEnrollmentCancelled, "enr-1/enrollment.cancelled"},
		{"enr-2", workflows.EventEnrollmentConfirmed, "enr-2/enrollment.confirmed"},
		{"cpn-1", workflows.EventCouponIssued, "cpn-1/coupon.issued"},
	} {
		first := workflows.EventID(tc.key, tc.eventType)
		if first != tc.want {
			t.Errorf("EventID(%q, %q) = %q, want %q", tc.key, tc.eventType, first, tc.want)
		}
		// Again once the clock has moved on: a retry comes later.
		for began := time.Now(); !time.Now().After(began); {
		}
		if again := workflows.EventID(tc.key, tc.eventType); again != first {
			t.Errorf("EventID(%q, %q) changed between calls: %q then %q", tc.key, tc.eventType, first, again)
		}
	}
}
