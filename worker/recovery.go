package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/claimflow/claimflow/workflows"
)

// ScheduleRecovery makes the Temporal schedule that runs
// workflows.RecoverReservations every `every`, for reservations older than
// `after`, exist with these settings: every worker calls it as it starts,
// so the first creates the schedule and the others (and later releases)
// bring it up to date. The schedule skips a run while the previous one is
// still going, and catches up at most one missed run after an outage.
func ScheduleRecovery(ctx context.Context, c client.Client, after, every time.Duration) error {
	action := &client.ScheduleWorkflowAction{
		ID:                       workflows.ReservationRecoveryWorkflowID,
		Workflow:                 workflows.RecoverReservations,
		Args:                     []any{workflows.RecoverReservationsInput{OlderThan: after}},
		TaskQueue:                workflows.TaskQueue,
		WorkflowExecutionTimeout: max(every, time.Minute),
	}
	spec := client.ScheduleSpec{Intervals: []client.ScheduleIntervalSpec{{Every: every}}}
	_, err := c.ScheduleClient().Create(ctx, client.ScheduleOptions{
		ID:            workflows.ReservationRecoveryScheduleID,
		Spec:          spec,
		Action:        action,
		Overlap:       enumspb.SCHEDULE_OVERLAP_POLICY_SKIP,
		CatchupWindow: every + time.Minute,
		Memo:          map[string]any{"what": "finishes reservations no run holds (docs/architecture.md)"},
	})
	if err == nil {
		return nil
	}
	if !errors.Is(err, temporal.ErrScheduleAlreadyRunning) {
		return fmt.Errorf("create the reservation recovery schedule: %w", err)
	}
	h := c.ScheduleClient().GetHandle(ctx, workflows.ReservationRecoveryScheduleID)
	err = h.Update(ctx, client.ScheduleUpdateOptions{
		DoUpdate: func(in client.ScheduleUpdateInput) (*client.ScheduleUpdate, error) {
			s := in.Description.Schedule
			s.Spec = &spec
			s.Action = action
			if s.Policy != nil {
				s.Policy.Overlap = enumspb.SCHEDULE_OVERLAP_POLICY_SKIP
			}
			return &client.ScheduleUpdate{Schedule: &s}, nil
		},
	})
	if err != nil {
		return fmt.Errorf("update the reservation recovery schedule: %w", err)
	}
	return nil
}
