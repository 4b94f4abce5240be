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
	uses := fixturesOf("UseCoupon")
	if len(uses) == 0 {
		t.Fatal("no coupon use histories in the fixtures table")
	}
	payFirst := func(ctx workflow.Context, in workflows.UseCouponInput) (workflows.CouponState, error) {
		ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: 10e9})
		err := workflow.ExecuteActivity(ctx, workflows.PayVendor.Name, workflows.PayVendorInput{}).Get(ctx, nil)
		return workflows.CouponState{}, err
	}
	for _, f := range uses {
		file := filepath.Join("testdata", f.file)
		r := worker.NewWorkflowReplayer()
		r.RegisterWorkflowWithOptions(payFirst, workflow.RegisterOptions{Name: "UseCoupon"})
		err := r.ReplayWorkflowHistoryFromJSONFile(quiet, file)
		if err == nil || !strings.Contains(err.Error(), "TMPRL1100") {
			t.Errorf("replaying %s against a reordered UseCoupon: got %v, want a nondeterminism error", file, err)
		}
	}
}
