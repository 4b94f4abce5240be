package workflows

import (
	"errors"
	"fmt"
	"testing"

	"go.temporal.io/sdk/temporal"
)

// Every workflow reads refusals through the one registry: a registered code
// is an answer, anything else a fault the saga must not mistake for one.
func TestRefusalOf(t *testing.T) {
	tests := []struct {
		name       string
		err        error
		want       Refusal
		wantHolder string
		wantOK     bool
	}{
		{name: "enrollment refusal", err: Refuse(RefusalCourseFull, "full"), want: RefusalCourseFull, wantOK: true},
		{name: "coupon refusal with holder", err: RefusalWithHolder(RefusalAlreadyIssued, "cp-1", "held"),
			want: RefusalAlreadyIssued, wantHolder: "cp-1", wantOK: true},
		{name: "wrapped by the SDK and by the saga", err: fmt.Errorf("reserve: %w", Refuse(RefusalSoldOut, "none left")),
			want: RefusalSoldOut, wantOK: true},
		{name: "payout_failed is decided by the workflow, never answered by an activity",
			err: temporal.NewNonRetryableApplicationError("x", string(RefusalPayoutFailed), nil)},
		{name: "a retryable payout error is a fault",
			err: temporal.NewApplicationError("503", ErrorTypePayoutUnavailable)},
		{name: "a plain error is a fault", err: errors.New("connection refused")},
		{name: "no error", err: nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, ok := refusalOf(tc.err)
			if ok != tc.wantOK || r.Refusal != tc.want || r.Holder != tc.wantHolder {
				t.Errorf("refusalOf(%v) = %+v, %v; want %q holder %q, %v", tc.err, r, ok, tc.want, tc.wantHolder, tc.wantOK)
			}
		})
	}
}
