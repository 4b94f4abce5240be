package api

import (
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/gin-gonic/gin"
	"github.com/jackc/pgx/v5"

	"github.com/claimflow/claimflow/internal/store"
	"github.com/claimflow/claimflow/workflows"
)

// The lists: what a student, a user or a registrar reads next. Each pages
// by an opaque keyset cursor (?limit= 1-200, ?after=<next of the previous
// page>); "next" is null on the last page.

// readPage parses ?limit and ?after; it writes the 400 itself.
func readPage(c *gin.Context) (store.Page, bool) {
	p := store.Page{Limit: store.DefaultPageLimit, After: c.Query("after")}
	if l := c.Query("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > store.MaxPageLimit {
			writeError(c, http.StatusBadRequest, "invalid_field", "limit must be between 1 and "+strconv.Itoa(store.MaxPageLimit), "limit")
			return p, false
		}
		p.Limit = n
	}
	if len(p.After) > 512 {
		writeError(c, http.StatusBadRequest, "invalid_field", "after must be the next cursor of a previous page", "after")
		return p, false
	}
	return p, true
}

// readStatus parses ?status against the values the table allows.
func readStatus(c *gin.Context, allowed []string) (string, bool) {
	s := c.Query("status")
	if s != "" && !slices.Contains(allowed, s) {
		writeError(c, http.StatusBadRequest, "invalid_field", "status must be one of "+strings.Join(allowed, ", "), "status")
		return "", false
	}
	return s, true
}

// listed answers a page, or the error the store gave.
func (s *server) listed(c *gin.Context, key string, items any, next string, err error) {
	switch {
	case errors.Is(err, store.ErrBadCursor):
		writeError(c, http.StatusBadRequest, "invalid_field", "after must be the next cursor of a previous page", "after")
	case err != nil:
		s.internalError(c, err)
	default:
		var n *string
		if next != "" {
			n = &next
		}
		c.JSON(http.StatusOK, gin.H{key: items, "next": n})
	}
}

// readListQuery parses a list's ?status (against the values allowed) and
// its page; it writes the 400 itself.
func readListQuery(c *gin.Context, allowed []string) (string, store.Page, bool) {
	status, ok := readStatus(c, allowed)
	if !ok {
		return "", store.Page{}, false
	}
	page, ok := readPage(c)
	return status, page, ok
}

// linkRuns fills each enrollment's link to its run in the Web UI.
func (s *server) linkRuns(items []store.Enrollment) {
	for i := range items {
		items[i].WorkflowURL = s.runURL(items[i].WorkflowID, items[i].RunID)
	}
}

// owned lets the subject the path names, and an admin, read its list;
// anyone else is answered as for a missing owner (the route's owner rule).
func (s *server) owned(c *gin.Context, id string) bool {
	_, ok := s.authorizeOwner(c, "id", id)
	return ok
}

func (s *server) listStudentEnrollments(c *gin.Context) {
	id := c.Param("id")
	if !validID(c, "id", id) || !s.owned(c, id) {
		return
	}
	status, page, ok := readListQuery(c, store.EnrollmentStatuses)
	if !ok {
		return
	}
	items, next, err := store.StudentEnrollments(c, s.db, id, status, page)
	s.linkRuns(items)
	s.listed(c, "enrollments", items, next, err)
}

// listRoster is the registrar's view of a course (admin only, by policy).
func (s *server) listRoster(c *gin.Context) {
	id := c.Param("id")
	if !validID(c, "id", id) {
		return
	}
	status, page, ok := readListQuery(c, store.EnrollmentStatuses)
	if !ok {
		return
	}
	if _, err := s.loadCourse(c, id); errors.Is(err, pgx.ErrNoRows) {
		writeError(c, http.StatusNotFound, string(workflows.RefusalCourseNotFound), "no course with this id", "id")
		return
	} else if err != nil {
		s.internalError(c, err)
		return
	}
	items, next, err := store.CourseRoster(c, s.db, id, status, page)
	s.linkRuns(items)
	s.listed(c, "enrollments", items, next, err)
}

func (s *server) listUserCoupons(c *gin.Context) {
	id := c.Param("id")
	if !validID(c, "id", id) || !s.owned(c, id) {
		return
	}
	status, page, ok := readListQuery(c, store.CouponStatuses)
	if !ok {
		return
	}
	items, next, err := store.UserCoupons(c, s.db, id, status, page)
	s.listed(c, "coupons", items, next, err)
}

func (s *server) listNotifications(c *gin.Context) {
	id := c.Param("id")
	if !validID(c, "id", id) || !s.owned(c, id) {
		return
	}
	unread := false
	switch c.Query("unread") {
	case "", "false":
	case "true":
		unread = true
	default:
		writeError(c, http.StatusBadRequest, "invalid_field", `unread must be "true" or "false"`, "unread")
		return
	}
	page, ok := readPage(c)
	if !ok {
		return
	}
	items, next, err := store.Inbox(c, s.db, id, unread, page)
	s.listed(c, "notifications", items, next, err)
}

// readNotification marks one notification read: the recipient's own, or
// any for an admin; someone else's is 404 like a missing one (the owner
// rule decides before anything changes).
func (s *server) readNotification(c *gin.Context) {
	// A malformed ID names no notification: the owner rule answers it as
	// a missing one.
	recipient, ok := s.authorizeOwner(c, "id", c.Param("id"))
	if !ok {
		return
	}
	id, err := strconv.ParseInt(c.Param("id"), 10, 64)
	if err != nil {
		s.internalError(c, err)
		return
	}
	item, found, err := store.MarkRead(c, s.db, recipient, id)
	switch {
	case err != nil:
		s.internalError(c, err)
	case !found:
		writeError(c, http.StatusNotFound, "notification_not_found", "no notification with this id", "id")
	default:
		c.JSON(http.StatusOK, item)
	}
}

type markAllRequest struct {
	// Before is an inbox item's cursor: it and everything older is marked
	// read; empty marks the whole inbox.
	Before string `json:"before"`
}

func (s *server) readAllNotifications(c *gin.Context) {
	id := c.Param("id")
	if !validID(c, "id", id) || !s.owned(c, id) {
		return
	}
	var req markAllRequest
	if c.Request.ContentLength != 0 && !decodeJSON(c, &req) {
		return
	}
	n, err := store.MarkAllRead(c, s.db, id, req.Before)
	switch {
	case errors.Is(err, store.ErrBadCursor):
		writeError(c, http.StatusBadRequest, "invalid_field", "before must be the cursor of an inbox item", "before")
	case err != nil:
		s.internalError(c, err)
	default:
		c.JSON(http.StatusOK, gin.H{"marked": n})
	}
}
