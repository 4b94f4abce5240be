package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/google/uuid"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/claimflow/claimflow/internal/store"
	"github.com/claimflow/claimflow/workflows"
)

type enrollment = store.Enrollment

type enrollRequest struct {
	StudentID string `json:"student_id"`
	// Waitlist: on a full course, join its waitlist (202 waitlisted)
	// instead of 409 course_full.
	Waitlist bool `json:"waitlist"`
}

// refusalStatus maps business refusals to HTTP answers.
var refusalStatus = map[workflows.Refusal]int{
	workflows.RefusalCourseFull:         http.StatusConflict,
	workflows.RefusalAlreadyEnrolled:    http.StatusConflict,
	workflows.RefusalCourseNotFound:     http.StatusNotFound,
	workflows.RefusalEnrollmentNotFound: http.StatusNotFound,
	workflows.RefusalEnrollmentPending:  http.StatusConflict,
	workflows.RefusalEnrollmentInactive: http.StatusConflict,
	workflows.RefusalWaitlistFull:       http.StatusConflict,
}

func (s *server) enroll(c *gin.Context) {
	requestedAt := time.Now().UTC()
	courseID := c.Param("id")
	if !validID(c, "course_id", courseID) {
		return
	}
	wait := c.Query("wait")
	if wait != "" && wait != "confirmed" {
		writeError(c, http.StatusBadRequest, "invalid_field", `wait must be "confirmed" or absent`, "wait")
		return
	}
	var req enrollRequest
	if !decodeJSON(c, &req) || !validID(c, "student_id", req.StudentID) || !s.mayActFor(c, "student_id", req.StudentID) {
		return
	}
	enrollmentID, err := uuid.NewV7()
	if err != nil {
		s.internalError(c, err)
		return
	}
	in := workflows.EnrollmentInput{
		EnrollmentID: enrollmentID.String(),
		CourseID:     courseID,
		StudentID:    req.StudentID,
		RequestedAt:  requestedAt,
		Waitlist:     req.Waitlist,
	}
	ctx, cancel := context.WithTimeout(c.Request.Context(), s.decisionWait(workflows.ClaimEnrollment))
	r, err := s.batcher.submit(ctx, in)
	cancel()
	if errors.Is(err, errOverloaded) {
		c.Header("Retry-After", "1")
		writeError(c, http.StatusTooManyRequests, "overloaded", "too many claims waiting; retry after the Retry-After delay", "")
		return
	}
	if errors.Is(err, errUndecided) { // the desk holds the claim
		s.answerUndecidedEnrollment(c, err, in, r.workflowID, r.runID)
		return
	}
	if err != nil {
		s.unavailable(c, fmt.Errorf("enroll %s in %s: %w", req.StudentID, courseID, err))
		return
	}
	decision, workflowID, runID := r.decision, r.workflowID, r.runID
	// From here to the answer written is the answer's own time (counted
	// unless it waits for the confirmation).
	decidedAt, awaited := time.Now(), false
	defer func() {
		if !awaited {
			s.metrics.answered(decidedAt)
		}
	}()
	s.metrics.decided("Enrollment", string(decision.Status), string(decision.Refusal))
	if decision.Status == workflows.StatusFailed {
		s.internalError(c, fmt.Errorf("enroll %s in %s: %s", req.StudentID, courseID, decision.Message))
		return
	}
	if decision.Status == workflows.StatusRefused {
		status, ok := refusalStatus[decision.Refusal]
		if !ok {
			status = http.StatusConflict
		}
		body := gin.H{"error": apiError{Code: string(decision.Refusal), Message: decision.Message}}
		if decision.Refusal == workflows.RefusalAlreadyEnrolled && decision.EnrollmentID != "" {
			body["enrollment_id"] = decision.EnrollmentID
		}
		c.AbortWithStatusJSON(status, body)
		return
	}

	got := enrollment{
		ID: decision.EnrollmentID, CourseID: courseID, StudentID: req.StudentID,
		Status: string(decision.Status), WorkflowID: workflowID, RunID: runID,
		WorkflowURL: s.runURL(workflowID, runID),
	}
	if decision.Status == workflows.StatusWaitlisted {
		// No seat yet: the place in the queue is durable, and a promotion
		// enrolls the student when a seat frees (GET shows the position).
		got.Position = &decision.Position
		c.JSON(http.StatusAccepted, got)
		return
	}
	if wait != "confirmed" {
		c.JSON(http.StatusCreated, got)
		return
	}
	awaited = true
	current, err := s.awaitSettled(c, decision.EnrollmentID)
	if err != nil {
		s.internalError(c, err)
		return
	}
	current.WorkflowURL = got.WorkflowURL
	if current.Status == string(workflows.StatusConfirmed) {
		c.JSON(http.StatusCreated, current)
		return
	}
	// The claim is taken and durable; only its confirmation is late.
	c.JSON(http.StatusAccepted, current)
}

// answerUndecidedEnrollment answers 202 for an enrollment whose desk holds
// the claim but did not decide within the wait: the claim finishes on its
// own, and its outcome is read at the enrollment's status URL.
func (s *server) answerUndecidedEnrollment(c *gin.Context, err error, in workflows.EnrollmentInput, workflowID, runID string) {
	s.answerUndecided(c, err, gin.H{"id": in.EnrollmentID, "course_id": in.CourseID, "student_id": in.StudentID},
		"/v1/enrollments/"+url.PathEscape(in.EnrollmentID), workflowID, runID)
}

// awaitSettled waits until the enrollment leaves "reserved" or the confirm
// bound passes, woken by the enrollment_settled notification rather than
// polling (settled.go). When MaxConfirmWaiters requests already wait, it
// answers the current status at once: the handler then answers 202 unless
// the enrollment is already confirmed.
func (s *server) awaitSettled(c *gin.Context, id string) (enrollment, error) {
	wake, ok := s.settled.add(id)
	if !ok {
		return s.loadEnrollment(c, id)
	}
	defer s.settled.remove(id, wake)
	bound := time.NewTimer(s.cfg.ConfirmTimeout)
	defer bound.Stop()
	for {
		// Read after registering: a notification between the two wakes us.
		got, err := s.loadEnrollment(c, id)
		if err != nil || got.Status != string(workflows.StatusReserved) {
			return got, err
		}
		select {
		case <-wake:
		case <-bound.C:
			return got, nil
		case <-c.Request.Context().Done():
			return got, nil
		}
	}
}

func (s *server) getEnrollment(c *gin.Context) {
	got, ok := loadOwned(s, c, s.loadEnrollment)
	if !ok {
		return
	}
	got.WorkflowURL = s.runURL(got.WorkflowID, got.RunID)
	c.JSON(http.StatusOK, got)
}

func (s *server) loadEnrollment(ctx context.Context, id string) (enrollment, error) {
	return store.LoadEnrollment(ctx, s.db, id)
}

func (s *server) cancelEnrollment(c *gin.Context) {
	id := c.Param("id")
	if !validID(c, "id", id) {
		return
	}
	// Only the enrollment's student (or an admin) may cancel it; anyone
	// else hears enrollment_not_found, decided here before any run starts.
	if _, ok := s.authorizeOwner(c, "id", id); !ok {
		return
	}
	current, err := s.loadEnrollment(c.Request.Context(), id)
	if err != nil {
		s.internalError(c, err)
		return
	}
	if current.Status == string(workflows.StatusCancelled) {
		// Final: the answer is the row, as the run would give it, without
		// starting one.
		current.WorkflowURL = s.runURL(current.WorkflowID, current.RunID)
		c.JSON(http.StatusOK, current)
		return
	}
	workflowID := workflows.CancellationWorkflowID(id)
	start := s.temporal.NewWithStartWorkflowOperation(client.StartWorkflowOptions{
		ID:                       workflowID,
		TaskQueue:                workflows.TaskQueue,
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
		WorkflowIDReusePolicy:    enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
		TypedSearchAttributes: temporal.NewSearchAttributes(
			workflows.SearchCourseID.ValueSet([]string{current.CourseID}),
			workflows.SearchStudentID.ValueSet([]string{current.StudentID}),
			workflows.SearchClaimStatus.ValueSet(string(workflows.StatusPending)),
		),
	}, workflows.Cancellation, workflows.CancellationInput{EnrollmentID: id})
	decision, _, err := decideClaim[workflows.Decision](c.Request.Context(), s.temporal, start, workflowID, "",
		s.decisionWait(workflows.ClaimCancellation), false)
	if err != nil {
		s.unavailable(c, fmt.Errorf("cancel enrollment %s: %w", id, err))
		return
	}
	s.metrics.decided("Cancellation", string(decision.Status), string(decision.Refusal))
	if decision.Status == workflows.StatusFailed {
		s.internalError(c, fmt.Errorf("cancel enrollment %s: %s", id, decision.Message))
		return
	}
	if decision.Status == workflows.StatusRefused {
		if decision.Refusal == workflows.RefusalEnrollmentPending {
			c.Header("Retry-After", "1")
		}
		writeError(c, refusalStatus[decision.Refusal], string(decision.Refusal), decision.Message, "")
		return
	}
	got, err := s.loadEnrollment(c, id)
	if err != nil {
		s.internalError(c, err)
		return
	}
	got.WorkflowURL = s.runURL(got.WorkflowID, got.RunID)
	c.JSON(http.StatusOK, got)
}
