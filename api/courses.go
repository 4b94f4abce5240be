package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/gin-gonic/gin"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/claimflow/claimflow/internal/store"
	"github.com/claimflow/claimflow/workflows"
)

type course = store.Course

type createCourseRequest struct {
	ID       string  `json:"id"`
	Title    *string `json:"title"`
	Capacity *int    `json:"capacity"`
	Credits  int     `json:"credits"`
}

const maxCapacity = 1_000_000

func (s *server) createCourse(c *gin.Context) {
	var req createCourseRequest
	if !decodeJSON(c, &req) {
		return
	}
	if req.ID == "" {
		req.ID = "c-" + strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
	}
	if !validID(c, "id", req.ID) || !validText(c, "title", req.Title) {
		return
	}
	switch {
	case req.Capacity == nil:
		writeError(c, http.StatusBadRequest, "missing_field", "capacity is required", "capacity")
		return
	case *req.Capacity < 0 || *req.Capacity > maxCapacity:
		writeError(c, http.StatusBadRequest, "invalid_field", "capacity must be between 0 and 1000000", "capacity")
		return
	case req.Credits < 0 || req.Credits > 100:
		writeError(c, http.StatusBadRequest, "invalid_field", "credits must be between 0 and 100", "credits")
		return
	}
	created, err := store.InsertCourse(c, s.db, req.ID, strings.TrimSpace(*req.Title), *req.Capacity, req.Credits)
	if err != nil {
		s.internalError(c, err)
		return
	}
	if !created {
		writeError(c, http.StatusConflict, "course_exists", "a course with this id already exists", "id")
		return
	}
	got, err := s.loadCourse(c, req.ID)
	if err != nil {
		s.internalError(c, err)
		return
	}
	c.JSON(http.StatusCreated, got)
}

func (s *server) getCourse(c *gin.Context) {
	got, ok := loadByID(s, c, "course_not_found", "course", s.loadCourse)
	if !ok {
		return
	}
	c.JSON(http.StatusOK, got)
}

func (s *server) loadCourse(ctx context.Context, id string) (course, error) {
	return store.LoadCourse(ctx, s.db, id)
}

type patchCourseRequest struct {
	Capacity *int `json:"capacity"`
}

// patchCourse changes a course's capacity (admin). A raise frees seats,
// which go to the head of the waitlist through a Promotion run; a cut
// below the enrolled count is refused with 409.
func (s *server) patchCourse(c *gin.Context) {
	id := c.Param("id")
	if !validID(c, "id", id) {
		return
	}
	var req patchCourseRequest
	if !decodeJSON(c, &req) {
		return
	}
	switch {
	case req.Capacity == nil:
		writeError(c, http.StatusBadRequest, "missing_field", "capacity is required", "capacity")
		return
	case *req.Capacity < 0 || *req.Capacity > maxCapacity:
		writeError(c, http.StatusBadRequest, "invalid_field", "capacity must be between 0 and 1000000", "capacity")
		return
	}
	before, err := store.SetCapacity(c, s.db, id, *req.Capacity)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		writeError(c, http.StatusNotFound, string(workflows.RefusalCourseNotFound), "no course with this id", "id")
		return
	case errors.Is(err, store.ErrBelowEnrolled):
		writeError(c, http.StatusConflict, "capacity_below_enrolled", "capacity cannot go below the students already enrolled", "capacity")
		return
	case err != nil:
		s.internalError(c, err)
		return
	}
	got, err := s.loadCourse(c, id)
	if err != nil {
		s.internalError(c, err)
		return
	}
	if *req.Capacity > before && got.Waitlisted > 0 {
		by := "capacity-" + uuid.NewString()
		_, err := s.temporal.ExecuteWorkflow(c, client.StartWorkflowOptions{
			ID:        workflows.PromotionWorkflowID(id, by),
			TaskQueue: workflows.TaskQueue,
			TypedSearchAttributes: temporal.NewSearchAttributes(
				workflows.SearchCourseID.ValueSet([]string{id}),
				workflows.SearchClaimStatus.ValueSet(string(workflows.StatusPending)),
			),
		}, workflows.Promotion, workflows.PromoteWaitlistInput{CourseID: id, By: by})
		if err != nil {
			// The capacity is changed; the seats wait for the next
			// promotion (any cancellation starts one) or a retried PATCH.
			s.unavailable(c, fmt.Errorf("start the promotion of %s's waitlist: %w", id, err))
			return
		}
	}
	c.JSON(http.StatusOK, got)
}
