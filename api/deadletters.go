package api

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/gin-gonic/gin"
	"github.com/jackc/pgx/v5"

	"github.com/claimflow/claimflow/internal/store"
	"github.com/claimflow/claimflow/workflows"
)

type deadLetter = store.DeadLetter

var deadLetterStates = map[string]bool{
	string(workflows.DeadLetterOpen): true, string(workflows.DeadLetterRetrying): true,
	string(workflows.DeadLetterResolved): true, string(workflows.DeadLetterCompensated): true,
	string(workflows.DeadLetterDiscarded): true,
}

func (s *server) listDeadLetters(c *gin.Context) {
	status := c.Query("status")
	if status != "" && !deadLetterStates[status] {
		writeError(c, http.StatusBadRequest, "invalid_field", "status must be open, retrying, resolved, compensated or discarded", "status")
		return
	}
	limit := 100
	if l := c.Query("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 1000 {
			writeError(c, http.StatusBadRequest, "invalid_field", "limit must be between 1 and 1000", "limit")
			return
		}
		limit = n
	}
	stage := c.Query("stage")
	if stage != "" && stage != store.StagePublish && stage != store.StageConsume {
		writeError(c, http.StatusBadRequest, "invalid_field", "stage must be publish or consume", "stage")
		return
	}
	items, err := store.ListDeadLetters(c, s.DB, status, stage, limit)
	if err != nil {
		s.internalError(c, err)
		return
	}
	for i := range items {
		items[i].WorkflowURL = s.runURL(items[i].WorkflowID, items[i].RunID)
	}
	c.JSON(http.StatusOK, gin.H{"dead_letters": items})
}

func (s *server) loadDeadLetter(c *gin.Context) (deadLetter, bool) {
	id, err := strconv.ParseInt(c.Param("id"), 10, 64)
	if err != nil || id < 1 {
		writeError(c, http.StatusBadRequest, "invalid_field", "id must be a positive integer", "id")
		return deadLetter{}, false
	}
	d, err := store.LoadDeadLetter(c, s.DB, id)
	if errors.Is(err, pgx.ErrNoRows) {
		writeError(c, http.StatusNotFound, "dead_letter_not_found", "no dead letter with this id", "id")
		return d, false
	}
	if err != nil {
		s.internalError(c, err)
		return d, false
	}
	d.WorkflowURL = s.runURL(d.WorkflowID, d.RunID)
	return d, true
}

func (s *server) getDeadLetter(c *gin.Context) {
	if d, ok := s.loadDeadLetter(c); ok {
		c.JSON(http.StatusOK, d)
	}
}

func (s *server) retryDeadLetter(c *gin.Context) { s.decideDeadLetter(c, workflows.ActionRetry) }
func (s *server) compensateDeadLetter(c *gin.Context) {
	s.decideDeadLetter(c, workflows.ActionCompensate)
}

// decideDeadLetter hands an operator's decision to the run that waits for it.
// The run records the outcome; the answer here only says it was delivered.
func (s *server) decideDeadLetter(c *gin.Context, action workflows.DeadLetterAction) {
	d, ok := s.loadDeadLetter(c)
	if !ok {
		return
	}
	if d.Status != string(workflows.DeadLetterOpen) {
		writeError(c, http.StatusConflict, "dead_letter_not_open",
			fmt.Sprintf("dead letter %d is %s; only open dead letters take a decision", d.ID, d.Status), "")
		return
	}
	err := s.Temporal.SignalWorkflow(c, d.WorkflowID, d.RunID, workflows.SignalDeadLetter,
		workflows.DeadLetterDecision{Action: action})
	if err != nil {
		s.unavailable(c, fmt.Errorf("signal %s on %s: %w", action, d.WorkflowID, err))
		return
	}
	c.JSON(http.StatusAccepted, gin.H{"id": d.ID, "action": action, "workflow_id": d.WorkflowID,
		"run_id": d.RunID, "workflow_url": d.WorkflowURL})
}
