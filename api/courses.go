package api

import (
	"context"
	"net/http"
	"strings"

	"github.com/claimflow/claimflow/internal/store"
	"github.com/gin-gonic/gin"
	"github.com/google/uuid"
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
	created, err := store.InsertCourse(c, s.DB, req.ID, strings.TrimSpace(*req.Title), *req.Capacity, req.Credits)
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
	return store.LoadCourse(ctx, s.DB, id)
}
