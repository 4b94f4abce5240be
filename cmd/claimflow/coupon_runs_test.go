package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/converter"

	"github.com/claimflow/claimflow/workflows"
)

// logUseRuns logs every run of a coupon's use workflow: its input's use,
// each update it accepted (by use ID) and how each ended. A failing
// concurrency test calls it so that CI's log shows which request met which
// run.
func logUseRuns(t *testing.T, s *stack, couponID string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id := workflows.UseCouponWorkflowID(couponID)
	resp, err := s.Client.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{
		Query: fmt.Sprintf("WorkflowId = %q", id),
	})
	if err != nil {
		t.Logf("list runs of %s: %v", id, err)
		return
	}
	dc := converter.GetDefaultDataConverter()
	for _, e := range resp.GetExecutions() {
		runID := e.GetExecution().GetRunId()
		h, err := fetchHistory(ctx, s.Client, runRef{id, runID})
		if err != nil {
			t.Logf("%v", err)
			continue
		}
		var lines []string
		for _, ev := range h.GetEvents() {
			switch {
			case ev.GetWorkflowExecutionStartedEventAttributes() != nil:
				var in workflows.UseCouponInput
				_ = dc.FromPayloads(ev.GetWorkflowExecutionStartedEventAttributes().GetInput(), &in)
				lines = append(lines, fmt.Sprintf("#%d started by use %s", ev.GetEventId(), in.Request.UseID))
			case ev.GetWorkflowExecutionUpdateAcceptedEventAttributes() != nil:
				a := ev.GetWorkflowExecutionUpdateAcceptedEventAttributes()
				var req workflows.UseRequest
				_ = dc.FromPayloads(a.GetAcceptedRequest().GetInput().GetArgs(), &req)
				lines = append(lines, fmt.Sprintf("#%d accepted update %s for use %s", ev.GetEventId(), a.GetProtocolInstanceId(), req.UseID))
			case ev.GetWorkflowExecutionUpdateCompletedEventAttributes() != nil:
				c := ev.GetWorkflowExecutionUpdateCompletedEventAttributes()
				var d workflows.CouponDecision
				_ = dc.FromPayloads(c.GetOutcome().GetSuccess(), &d)
				lines = append(lines, fmt.Sprintf("#%d completed update %s: %s %s (use %s)", ev.GetEventId(), c.GetMeta().GetUpdateId(), d.Status, d.Refusal, d.UseID))
			case ev.GetActivityTaskScheduledEventAttributes() != nil:
				lines = append(lines, fmt.Sprintf("#%d activity %s", ev.GetEventId(), ev.GetActivityTaskScheduledEventAttributes().GetActivityType().GetName()))
			}
		}
		t.Logf("run %s of %s (%s, started %s, closed %s):\n\t%s", runID, id, e.GetStatus(),
			e.GetStartTime().AsTime().Format(time.RFC3339Nano), e.GetCloseTime().AsTime().Format(time.RFC3339Nano), strings.Join(lines, "\n\t"))
	}
}
