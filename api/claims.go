package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"
	"go.temporal.io/sdk/client"

	"github.com/claimflow/claimflow/workflows"
)

// What every claim route shares: how long a request waits for its claim's
// decision, how it waits for a run's decision update, and the answer when
// the decision does not come in time.

// errUndecided: the claim is under way but its run did not decide within
// the wait; it finishes on its own.
var errUndecided = errors.New("no decision within the wait")

// decisionWait is how long a request waits for the decision of a claim of
// kind: as long as the run's own activity timeouts and retry policies let
// its decision take (workflows.DecisionDeadline, the function the
// workflows' tests hold to their options), and never less than
// DecisionTimeout.
func (s *server) decisionWait(kind workflows.ClaimKind) time.Duration {
	d, err := workflows.DecisionDeadline(kind, s.cfg.PayoutTimeout)
	if err != nil { // a kind named in code, so a bug: wait the configured time
		s.log.Error("no decision deadline", "kind", kind, "error", err)
		return s.cfg.DecisionTimeout
	}
	return max(s.cfg.DecisionTimeout, d)
}

// decideClaim starts (or joins) a claim's run and waits, up to wait, for
// its decision update; args are the update's arguments, and updateID the
// update's ID when the run's input names it as its starter's (the SDK
// chooses one when it is ""). It returns
// errUndecided (with the run ID when known) when the claim is under way but
// its decision did not come: the run accepted the update, or, when
// startIsClaim (the run's input is the claim), the run started. Any other
// failure is returned as it is: the claim did not reach a run, and the
// caller may retry.
func decideClaim[T any](ctx context.Context, t Temporal, start client.WithStartWorkflowOperation, workflowID, updateID string,
	wait time.Duration, startIsClaim bool, args ...any) (T, string, error) {
	var d T
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	handle, err := t.UpdateWithStartWorkflow(wctx, client.UpdateWithStartWorkflowOptions{
		StartWorkflowOperation: start,
		UpdateOptions: client.UpdateWorkflowOptions{
			WorkflowID: workflowID,
			UpdateID:   updateID,
			UpdateName: workflows.UpdateDecision,
			Args:       args,
			// Accepted, then the outcome: an accepted update is the run's
			// to answer, whatever happens to this wait.
			WaitForStage: client.WorkflowUpdateStageAccepted,
		},
	})
	if err != nil {
		if startIsClaim && start != nil {
			sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			defer scancel()
			if run, serr := start.Get(sctx); serr == nil {
				return d, run.GetRunID(), fmt.Errorf("%w: %w", errUndecided, err)
			}
		}
		return d, "", err
	}
	if err := handle.Get(wctx, &d); err != nil {
		return d, handle.RunID(), fmt.Errorf("%w: %w", errUndecided, err)
	}
	return d, handle.RunID(), nil
}

// answerUndecided answers 202 for a claim that is under way but was not
// decided within the wait: the body names the claim and links its status
// (Location and status_url); the claim finishes on its own.
func (s *server) answerUndecided(c *gin.Context, err error, body gin.H, statusURL, workflowID, runID string) {
	s.log.Warn("claim not decided within the wait; answered with its status URL", "workflow_id", workflowID, "error", err)
	c.Header("Location", statusURL)
	body["status"] = "pending"
	body["status_url"] = statusURL
	body["workflow_id"] = workflowID
	body["message"] = "no decision yet; the claim goes on and finishes on its own: read status_url for its outcome"
	if runID != "" {
		body["run_id"] = runID
		body["workflow_url"] = s.runURL(workflowID, runID)
	}
	c.JSON(http.StatusAccepted, body)
}
