package store

import (
	"testing"

	"github.com/claimflow/claimflow/workflows"
)

func TestStatusesMatchTheWorkflows(t *testing.T) {
	for store, wf := range map[string]string{
		EnrollmentReserved:     string(workflows.StatusReserved),
		EnrollmentConfirmed:    string(workflows.StatusConfirmed),
		EnrollmentDeadLettered: string(workflows.StatusDeadLettered),
		CouponUsed:             string(workflows.CouponUsed),
		CouponRevoked:          string(workflows.CouponRevoked),
		DeadLetterOpen:         string(workflows.DeadLetterOpen),
		DeadLetterRetrying:     string(workflows.DeadLetterRetrying),
		DeadLetterResolved:     string(workflows.DeadLetterResolved),
	} {
		if store != wf {
			t.Errorf("store has %q where the workflows have %q", store, wf)
		}
	}
}
