package workflows_test

import (
	"path/filepath"
	"strings"
	"testing"

	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/claimflow/claimflow/workflows"
)

// The coupon histories must be able to fail too: a UseCoupon that pays the
// vendor before holding the coupon is a different program, and every
// recorded use history that got past the hold must say so.
func TestCouponReplayDetectsAChangedStepOrder(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "coupon_use_*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no coupon use histories in testdata/: %v", err)
	}
	payFirst := func(ctx workflow.Context, in workflows.UseCouponInput) (workflows.CouponState, error) {
		ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: 10e9})
		err := workflow.ExecuteActivity(ctx, workflows.PayVendor.Name, workflows.PayVendorInput{}).Get(ctx, nil)
		return workflows.CouponState{}, err
	}
	for _, file := range files {
		r := worker.NewWorkflowReplayer()
		r.RegisterWorkflowWithOptions(payFirst, workflow.RegisterOptions{Name: "UseCoupon"})
		err := r.ReplayWorkflowHistoryFromJSONFile(quiet, file)
		if err == nil || !strings.Contains(err.Error(), "TMPRL1100") {
			t.Errorf("replaying %s against a reordered UseCoupon: got %v, want a nondeterminism error", file, err)
		}
	}
}
