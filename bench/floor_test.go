package bench

import (
	"testing"

	enumspb "go.temporal.io/api/enums/v1"
)

// The floor's errors carry the run's events, so that a run that never
// got its first workflow task or its update's answer says which it was.

func TestTrailNamesEventsInOrderWithRepeatsCounted(t *testing.T) {
	for _, tc := range []struct {
		types []enumspb.EventType
		want  string
	}{
		{nil, "(no events)"},
		{[]enumspb.EventType{enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED}, "WorkflowExecutionStarted"},
		{[]enumspb.EventType{
			enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED, enumspb.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED,
			enumspb.EVENT_TYPE_WORKFLOW_TASK_STARTED, enumspb.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT,
			enumspb.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED, enumspb.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED,
			enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT,
		}, "WorkflowExecutionStarted, WorkflowTaskScheduled, WorkflowTaskStarted, WorkflowTaskTimedOut, WorkflowTaskScheduled ×2, WorkflowExecutionTimedOut"},
	} {
		if got := trail(tc.types); got != tc.want {
			t.Errorf("trail(%v) = %q, want %q", tc.types, got, tc.want)
		}
	}
}
