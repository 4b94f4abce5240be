package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/jackc/pgx/v5"

	"github.com/claimflow/claimflow/workflows"
)

type deadLetter struct {
	ID           int64           `json:"id"`
	EventID      string          `json:"event_id"`
	EventType    string          `json:"event_type"`
	Topic        string          `json:"topic"`
	Key          string          `json:"key"`
	Payload      json.RawMessage `json:"payload"`
	WorkflowID   string          `json:"workflow_id"`
	RunID        string          `json:"run_id"`
	WorkflowURL  string          `json:"workflow_url,omitempty"`
	EnrollmentID *string         `json:"enrollment_id,omitempty"`
	Stage        string          `json:"stage"` // publish (a saga's event) or consume (a notification)
	Error        string          `json:"error"`
	Rounds       int             `json:"rounds"`
	Status       string          `json:"status"`
	CreatedAt    time.Time       `json:"created_at"`
	UpdatedAt    time.Time       `json:"updated_at"`
}

const deadLetterColumns = `id, event_id, event_type, topic, message_key, payload, workflow_id, run_id,
	enrollment_id, stage, error, rounds, status, created_at, updated_at`

func scanDeadLetter(row pgx.Row) (deadLetter, error) {
	var d deadLetter
	err := row.Scan(&d.ID, &d.EventID, &d.EventType, &d.Topic, &d.Key, &d.Payload, &d.WorkflowID, &d.RunID,
		&d.EnrollmentID, &d.Stage, &d.Error, &d.Rounds, &d.Status, &d.CreatedAt, &d.UpdatedAt)
	return d, err
}

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
	if stage != "" && stage != "publish" && stage != "consume" {
		writeError(c, http.StatusBadRequest, "invalid_field", "stage must be publish or consume", "stage")
		return
	}
	rows, err := s.DB.Query(c, `SELECT `+deadLetterColumns+` FROM dead_letters
		WHERE ($1 = '' OR status = $1) AND ($3 = '' OR stage = $3) ORDER BY id DESC LIMIT $2`, status, limit, stage)
	if err != nil {
		s.internalError(c, err)
		return
	}
	items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (deadLetter, error) { return scanDeadLetter(r) })
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
	d, err := scanDeadLetter(s.DB.QueryRow(c, `SELECT `+deadLetterColumns+` FROM dead_letters WHERE id = $1`, id))
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
