package workflows

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"
)

// The kernel's contract: compensations run last-in first-out, all of them
// even when one fails, and after a cancel on a disconnected context.
func TestSagaKernel(t *testing.T) {
	errUndo := errors.New("undo failed")
	tests := []struct {
		name      string
		failing   int  // index of the compensation that fails, -1 for none
		cancel    bool // cancel the run while its step waits
		forget    bool // pass the point of no return before the step
		wantOrder []int
		wantErr   error
	}{
		{name: "LIFO", failing: -1, wantOrder: []int{2, 1, 0}},
		{name: "a failing compensation does not stop the others", failing: 1, wantOrder: []int{2, 1, 0}, wantErr: errUndo},
		{name: "cancelled run unwinds on a disconnected context", failing: -1, cancel: true, wantOrder: []int{2, 1, 0}},
		{name: "nothing is undone after forget", failing: -1, cancel: true, forget: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var order []int
			wf := func(ctx workflow.Context) (err error) {
				var s saga
				defer s.unwindIfCancelled(ctx, &err, s.compensate)
				for i := range 3 {
					s.add(func(ctx workflow.Context) error {
						// A timer on a cancelled context would fail at once.
						if err := workflow.Sleep(ctx, time.Second); err != nil {
							return err
						}
						order = append(order, i)
						if i == tc.failing {
							return errUndo
						}
						return nil
					})
				}
				if tc.forget {
					s.forget()
				}
				if tc.cancel {
					return workflow.Sleep(ctx, time.Hour) // the step, cancelled
				}
				return s.compensate(ctx)
			}
			var suite testsuite.WorkflowTestSuite
			env := suite.NewTestWorkflowEnvironment()
			env.RegisterWorkflow(wf)
			if tc.cancel {
				env.RegisterDelayedCallback(env.CancelWorkflow, time.Minute)
			}
			env.ExecuteWorkflow(wf)

			err := env.GetWorkflowError()
			if tc.cancel != temporal.IsCanceledError(err) {
				t.Errorf("cancelled = %v, want %v (err %v)", temporal.IsCanceledError(err), tc.cancel, err)
			}
			// The error crossed the SDK as a failure: compare its message.
			if tc.wantErr != nil && (err == nil || !strings.Contains(err.Error(), tc.wantErr.Error())) {
				t.Errorf("err = %v, want it to carry %v", err, tc.wantErr)
			}
			if !tc.cancel && tc.wantErr == nil && err != nil {
				t.Errorf("err = %v, want none", err)
			}
			if !slices.Equal(order, tc.wantOrder) {
				t.Errorf("compensations ran in order %v, want %v", order, tc.wantOrder)
			}
		})
	}
}
