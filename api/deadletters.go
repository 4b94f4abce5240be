package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/jackc/pgx/v5"

	"github.com/claimflow/claimflow/internal/store"
	"github.com/claimflow/claimflow/workflows"
)

type deadLetter = store.DeadLetter

var deadLetterStates = map[string]bool{
	string(workflows.DeadLetterOpen): true, string(workflows.DeadLetterRetrying): true,
	string(workflows.DeadLetterCompensating): true, string(workflows.DeadLetterResolved): true,
	string(workflows.DeadLetterCompensated): true, string(workflows.DeadLetterDiscarded): true,
}

func (s *server) listDeadLetters(c *gin.Context) {
	status := c.Query("status")
	if status != "" && !deadLetterStates[status] {
		writeError(c, http.StatusBadRequest, "invalid_field", "status must be open, retrying, compensating, resolved, compensated or discarded", "status")
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
	items, err := store.ListDeadLetters(c, s.db, status, stage, limit)
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
	d, err := store.LoadDeadLetter(c, s.db, id)
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

// signalTimeout bounds one signal to a run.
const signalTimeout = 10 * time.Second

// decidedState is what a row says once the API took action on it: retrying
// (as the run itself marks it) or compensating (until the run has
// compensated and marks it compensated or discarded).
func decidedState(action workflows.DeadLetterAction) string {
	if action == workflows.ActionCompensate {
		return store.DeadLetterCompensating
	}
	return store.DeadLetterRetrying
}

// decideDeadLetter hands an operator's decision to the run that waits for it.
// The row is marked decided in the statement that finds it open, so of two
// concurrent calls one answers 202 and the other 409; the signal names the
// dead letter and its round, so the run ignores a stale or duplicate one.
// The run records the outcome; the answer here only says it was delivered.
func (s *server) decideDeadLetter(c *gin.Context, action workflows.DeadLetterAction) {
	id, err := strconv.ParseInt(c.Param("id"), 10, 64)
	if err != nil || id < 1 {
		writeError(c, http.StatusBadRequest, "invalid_field", "id must be a positive integer", "id")
		return
	}
	d, err := store.DecideDeadLetter(c.Request.Context(), s.db, id, decidedState(action))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		writeError(c, http.StatusNotFound, "dead_letter_not_found", "no dead letter with this id", "id")
		return
	case errors.Is(err, store.ErrDeadLetterNotOpen):
		writeError(c, http.StatusConflict, "dead_letter_not_open",
			fmt.Sprintf("dead letter %d is %s; only open dead letters take a decision", d.ID, d.Status), "")
		return
	case err != nil:
		s.internalError(c, err)
		return
	}
	if err := s.signalDecision(c.Request.Context(), d, action); err != nil {
		s.unavailable(c, err)
		return
	}
	c.JSON(http.StatusAccepted, gin.H{"id": d.ID, "round": d.Rounds, "action": action, "status": d.Status,
		"workflow_id": d.WorkflowID, "run_id": d.RunID, "workflow_url": s.runURL(d.WorkflowID, d.RunID)})
}

// signalDecision tells d's run the decision taken on d. When the signal
// fails, the row is opened again (if it still carries this decision), so the
// row never claims a decision its run did not get.
func (s *server) signalDecision(ctx context.Context, d deadLetter, action workflows.DeadLetterAction) error {
	sctx, cancel := context.WithTimeout(ctx, signalTimeout)
	defer cancel()
	err := s.temporal.SignalWorkflow(sctx, d.WorkflowID, d.RunID, workflows.SignalDeadLetter,
		workflows.DeadLetterDecision{Action: action, DeadLetterID: d.ID, Round: d.Rounds})
	if err == nil {
		return nil
	}
	err = fmt.Errorf("signal %s of dead letter %d on %s: %w", action, d.ID, d.WorkflowID, err)
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), signalTimeout)
	defer rcancel()
	if rerr := store.ReopenDeadLetter(rctx, s.db, d.ID, d.Status, d.Rounds); rerr != nil {
		return errors.Join(err, fmt.Errorf("reopen dead letter %d: %w", d.ID, rerr))
	}
	return err
}

// bulkDecisionRequest selects the open dead letters a bulk decision takes.
type bulkDecisionRequest struct {
	Stage        string  `json:"stage"`
	Topic        string  `json:"topic"`
	CourseID     string  `json:"course_id"`
	CouponTypeID string  `json:"coupon_type_id"`
	OpenedBefore *string `json:"opened_before"`
	OpenedAfter  *string `json:"opened_after"`
	Limit        *int    `json:"limit"`
}

const (
	bulkDefaultLimit = 100
	bulkMaxLimit     = 1000
	// bulkSignals is how many runs a bulk decision signals at once.
	bulkSignals = 16
)

func (s *server) retryDeadLetters(c *gin.Context) { s.decideDeadLetters(c, workflows.ActionRetry) }
func (s *server) compensateDeadLetters(c *gin.Context) {
	s.decideDeadLetters(c, workflows.ActionCompensate)
}

// decideDeadLetters takes one decision for every open dead letter that
// matches a filter, up to limit: each row is marked decided as it is picked
// (rows a concurrent call holds are skipped) and its run signalled with the
// row's ID and round. Sent again, the same request decides only rows still
// open, so no dead letter is decided twice. A row whose signal fails is
// opened again and listed under failed.
func (s *server) decideDeadLetters(c *gin.Context, action workflows.DeadLetterAction) {
	var req bulkDecisionRequest
	if !decodeJSON(c, &req) {
		return
	}
	f, limit, ok := req.filter(c)
	if !ok {
		return
	}
	decided, err := store.DecideDeadLetters(c.Request.Context(), s.db, f, decidedState(action), limit)
	if err != nil {
		s.internalError(c, err)
		return
	}
	errs := make([]error, len(decided))
	sem := make(chan struct{}, bulkSignals)
	var wg sync.WaitGroup
	for i, d := range decided {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			errs[i] = s.signalDecision(c.Request.Context(), d, action)
		}()
	}
	wg.Wait()
	ids := []int64{}
	failed := []gin.H{}
	for i, d := range decided {
		if errs[i] != nil {
			s.log.Warn("bulk dead-letter decision not delivered", "id", d.ID, "action", action, "error", errs[i])
			failed = append(failed, gin.H{"id": d.ID, "error": "the run could not be signalled; the dead letter is open again"})
			continue
		}
		ids = append(ids, d.ID)
	}
	c.JSON(http.StatusAccepted, gin.H{"action": action, "signalled": len(ids), "ids": ids, "failed": failed,
		"more": len(decided) == limit})
}

// filter validates the request; it writes the 400 itself.
func (r bulkDecisionRequest) filter(c *gin.Context) (store.DeadLetterFilter, int, bool) {
	f := store.DeadLetterFilter{Stage: r.Stage, Topic: r.Topic, CourseID: r.CourseID, CouponTypeID: r.CouponTypeID}
	if r.Stage != "" && r.Stage != store.StagePublish && r.Stage != store.StageConsume {
		writeError(c, http.StatusBadRequest, "invalid_field", "stage must be publish or consume", "stage")
		return f, 0, false
	}
	for _, field := range []struct{ name, value string }{
		{"topic", r.Topic}, {"course_id", r.CourseID}, {"coupon_type_id", r.CouponTypeID},
	} {
		if field.value != "" && !validID(c, field.name, field.value) {
			return f, 0, false
		}
	}
	if r.CourseID != "" && r.CouponTypeID != "" {
		writeError(c, http.StatusBadRequest, "invalid_field",
			"give course_id or coupon_type_id, not both: no event names both", "coupon_type_id")
		return f, 0, false
	}
	for _, t := range []struct {
		name  string
		value *string
		dst   **time.Time
	}{{"opened_before", r.OpenedBefore, &f.OpenedBefore}, {"opened_after", r.OpenedAfter, &f.OpenedAfter}} {
		if t.value == nil {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, *t.value)
		if err != nil {
			writeError(c, http.StatusBadRequest, "invalid_field", t.name+" must be an RFC 3339 time, e.g. 2026-12-01T05:00:00Z", t.name)
			return f, 0, false
		}
		*t.dst = &at
	}
	limit := bulkDefaultLimit
	if r.Limit != nil {
		if *r.Limit < 1 || *r.Limit > bulkMaxLimit {
			writeError(c, http.StatusBadRequest, "invalid_field", fmt.Sprintf("limit must be between 1 and %d", bulkMaxLimit), "limit")
			return f, 0, false
		}
		limit = *r.Limit
	}
	return f, limit, true
}
