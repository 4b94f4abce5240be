package main

// The authorization matrix against the real stack: every /v1 route of the
// route policy table (api.PolicyRoutes) × {the owner, another student, an
// admin, no token, an expired token, a token for another audience}, each
// cell with the status it must answer written in the table below. The
// stack checks JWT_ISSUER and JWT_AUDIENCE (startTestStack sets them).

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"go.temporal.io/api/serviceerror"

	"github.com/claimflow/claimflow/api"
	"github.com/claimflow/claimflow/workflows"
)

// matrixActor is a column of the matrix.
type matrixActor int

const (
	actorOwner    matrixActor = iota // the resource's owner; on routes without one, a student
	actorOther                       // another student
	actorAdmin                       // role admin
	actorNoToken                     // no Authorization header
	actorExpired                     // the owner's token, expired
	actorWrongAud                    // the owner's token, issued for another audience
)

var actorNames = []string{"owner", "another student", "admin", "no token", "expired token", "wrong audience"}

// matrixRow is one route: the status each actor gets, in actor order.
type matrixRow struct {
	route string // the routePolicies key
	want  [6]int
	// fresh makes the resource a cell acts on (a claim or a cancellation
	// changes it), for the three actors with a valid token; nil uses the
	// shared fixture.
	fresh func(t *testing.T, m *matrix) string
}

// matrix holds the stack, the tokens and the shared fixture.
type matrix struct {
	s      *stack
	admin  *apiClient
	secret string
	run    string
	owner  string // the student/user who owns the fixture
	other  string // another student
	vendor string // the fixture's vendor, also a subject with role vendor
	n      int

	course, enrollment, couponType, coupon string
	deadLetter                             int64
	// notification is an inbox item of the owner (its numeric ID).
	notification string
}

func (m *matrix) next() string {
	m.n++
	return fmt.Sprintf("%s-%d", m.run, m.n)
}

// token signs a token for sub and role with the stack's secret; exp and
// aud are the stack's unless overridden.
func (m *matrix) token(t *testing.T, sub, role string, exp time.Time, aud string) string {
	t.Helper()
	claims := jwt.MapClaims{"sub": sub, "iss": testIssuer, "aud": aud, "iat": time.Now().Add(-time.Hour).Unix(), "exp": exp.Unix()}
	if role != "" {
		claims["role"] = role
	}
	tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString([]byte(m.secret))
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// client is the admin client with the actor's token (none for actorNoToken);
// ownerSub is the owner's subject on this route (a vendor on its vendor record).
func (m *matrix) client(t *testing.T, a matrixActor, ownerSub, ownerRole string) *apiClient {
	t.Helper()
	c := *m.admin
	c.t = t
	hour := time.Now().Add(time.Hour)
	switch a {
	case actorOwner:
		c.token = m.token(t, ownerSub, ownerRole, hour, testAudience)
	case actorOther:
		c.token = m.token(t, m.other, "", hour, testAudience)
	case actorAdmin:
		c.token = m.token(t, "matrix-admin", api.RoleAdmin, hour, testAudience)
	case actorNoToken:
		c.token = ""
	case actorExpired:
		c.token = m.token(t, ownerSub, ownerRole, time.Now().Add(-5*time.Minute), testAudience)
	case actorWrongAud:
		c.token = m.token(t, ownerSub, ownerRole, hour, "another-application")
	}
	return &c
}

// subjectOf is whom an actor acts as in a body (an admin acts for the owner).
func (m *matrix) subjectOf(a matrixActor) string {
	if a == actorOther {
		return m.other
	}
	return m.owner
}

func (m *matrix) newCourse(t *testing.T) string {
	id := "mx-c-" + m.next()
	m.admin.must("POST", "/v1/courses", map[string]any{"id": id, "title": "Matrix", "capacity": 10}, http.StatusCreated)
	return id
}

// newEnrollment enrolls the owner in a course of its own and waits until
// it is confirmed, so it can be cancelled.
func (m *matrix) newEnrollment(t *testing.T) string {
	got := m.admin.must("POST", "/v1/courses/"+m.newCourse(t)+"/enrollments?wait=confirmed",
		map[string]any{"student_id": m.owner}, http.StatusCreated)
	return got["id"].(string)
}

func (m *matrix) newCouponType(t *testing.T) string {
	id := "mx-ct-" + m.next()
	m.admin.must("POST", "/v1/coupon-types", map[string]any{"id": id, "vendor_id": m.vendor, "name": "Matrix",
		"stock": 10, "payout_cents": 100}, http.StatusCreated)
	return id
}

func (m *matrix) newCoupon(t *testing.T) string {
	got := m.admin.must("POST", "/v1/coupon-types/"+m.newCouponType(t)+"/coupons", map[string]any{"user_id": m.owner}, http.StatusCreated)
	return got["id"].(string)
}

// noRun asserts that Temporal has no run under workflowID.
func noRun(t *testing.T, s *stack, workflowID string) {
	t.Helper()
	_, err := s.Client.DescribeWorkflow(context.Background(), workflowID, "")
	var nf *serviceerror.NotFound
	if !errors.As(err, &nf) {
		t.Fatalf("a run %s exists (describe: %v); the request should have been answered before any run started", workflowID, err)
	}
}

func runIDOf(t *testing.T, s *stack, workflowID string) string {
	t.Helper()
	d, err := s.Client.DescribeWorkflow(context.Background(), workflowID, "")
	if err != nil {
		t.Fatalf("describe %s: %v", workflowID, err)
	}
	return d.RawResponse.GetWorkflowExecutionInfo().GetExecution().GetRunId()
}

func TestAuthzMatrix(t *testing.T) {
	if testing.Short() {
		t.Skip("integration tests start the real stack; skipped with -short")
	}
	s := testStack(t, dataDir(t))
	if s.Config.Security.Audience != testAudience || s.Config.Security.Issuer != testIssuer {
		t.Fatalf("the test stack checks iss %q and aud %q, want %q and %q",
			s.Config.Security.Issuer, s.Config.Security.Audience, testIssuer, testAudience)
	}
	run := fmt.Sprintf("%d", time.Now().UnixNano()%1_000_000)
	m := &matrix{s: s, admin: newAPIClient(t, s), secret: s.Config.Security.JWTSecret, run: run,
		owner: "mx-owner-" + run, other: "mx-other-" + run, vendor: "mx-v-" + run}

	// The shared fixture: one of each, owned by m.owner (the vendor by itself).
	m.course = m.newCourse(t)
	m.enrollment = m.newEnrollment(t)
	m.admin.must("POST", "/v1/vendors", map[string]any{"id": m.vendor, "name": "Matrix vendor"}, http.StatusCreated)
	m.couponType = m.newCouponType(t)
	m.coupon = m.newCoupon(t)
	// A dead letter already resolved: an admin's decision on it is 409, which
	// shows it passed authorization; no run is involved.
	if err := s.Pool.QueryRow(context.Background(), `
		INSERT INTO dead_letters (event_id, event_type, topic, message_key, payload, workflow_id, run_id, error, status)
		VALUES ($1, 'enrollment.confirmed', 'enrollment.events', 'c', '{}', 'matrix-none', 'matrix-none', 'matrix', 'resolved')
		RETURNING id`, "matrix-"+run).Scan(&m.deadLetter); err != nil {
		t.Fatal(err)
	}

	// The owner's enrollment reaches its inbox through the consumer.
	waitFor(t, 2*time.Minute, "the owner's first notification", func() bool {
		got := m.admin.must("GET", "/v1/users/"+m.owner+"/notifications?limit=1", nil, http.StatusOK)
		items, _ := got["notifications"].([]any)
		if len(items) == 0 {
			return false
		}
		m.notification = fmt.Sprintf("%.0f", items[0].(map[string]any)["id"].(float64))
		return true
	})

	const (
		ok, created        = http.StatusOK, http.StatusCreated
		unauth, forbidden  = http.StatusUnauthorized, http.StatusForbidden
		notFound, conflict = http.StatusNotFound, http.StatusConflict
		accepted           = http.StatusAccepted
	)
	//                                                  owner      other      admin     no token expired wrong aud
	rows := []matrixRow{
		{route: "POST /v1/courses", want: [6]int{forbidden, forbidden, created, unauth, unauth, unauth}},
		{route: "GET /v1/courses/:id", want: [6]int{ok, ok, ok, unauth, unauth, unauth}},
		{route: "PATCH /v1/courses/:id", want: [6]int{forbidden, forbidden, ok, unauth, unauth, unauth}},
		{route: "POST /v1/courses/:id/enrollments", want: [6]int{created, created, created, unauth, unauth, unauth},
			fresh: func(t *testing.T, m *matrix) string { return m.newCourse(t) }},
		{route: "GET /v1/enrollments/:id", want: [6]int{ok, notFound, ok, unauth, unauth, unauth}},
		{route: "DELETE /v1/enrollments/:id", want: [6]int{ok, notFound, ok, unauth, unauth, unauth},
			fresh: func(t *testing.T, m *matrix) string { return m.newEnrollment(t) }},
		{route: "GET /v1/dead-letters", want: [6]int{forbidden, forbidden, ok, unauth, unauth, unauth}},
		{route: "GET /v1/dead-letters/:id", want: [6]int{forbidden, forbidden, ok, unauth, unauth, unauth}},
		{route: "POST /v1/dead-letters/:id/retry", want: [6]int{forbidden, forbidden, conflict, unauth, unauth, unauth}},
		{route: "POST /v1/dead-letters/:id/compensate", want: [6]int{forbidden, forbidden, conflict, unauth, unauth, unauth}},
		// Bulk re-drive with a filter that matches nothing: an admin's call
		// passes authorization and signals no run.
		{route: "POST /v1/dead-letters/retry", want: [6]int{forbidden, forbidden, accepted, unauth, unauth, unauth}},
		{route: "POST /v1/dead-letters/compensate", want: [6]int{forbidden, forbidden, accepted, unauth, unauth, unauth}},
		{route: "POST /v1/vendors", want: [6]int{forbidden, forbidden, created, unauth, unauth, unauth}},
		{route: "GET /v1/vendors/:id", want: [6]int{ok, notFound, ok, unauth, unauth, unauth}},
		{route: "POST /v1/coupon-types", want: [6]int{forbidden, forbidden, created, unauth, unauth, unauth}},
		{route: "GET /v1/coupon-types/:id", want: [6]int{ok, ok, ok, unauth, unauth, unauth}},
		{route: "POST /v1/coupon-types/:id/coupons", want: [6]int{created, created, created, unauth, unauth, unauth},
			fresh: func(t *testing.T, m *matrix) string { return m.newCouponType(t) }},
		{route: "GET /v1/coupons/:id", want: [6]int{ok, notFound, ok, unauth, unauth, unauth}},
		{route: "POST /v1/coupons/:id/use", want: [6]int{ok, notFound, ok, unauth, unauth, unauth},
			fresh: func(t *testing.T, m *matrix) string { return m.newCoupon(t) }},
		{route: "GET /v1/courses/:id/enrollments", want: [6]int{forbidden, forbidden, ok, unauth, unauth, unauth}},
		{route: "GET /v1/students/:id/enrollments", want: [6]int{ok, notFound, ok, unauth, unauth, unauth}},
		{route: "GET /v1/users/:id/coupons", want: [6]int{ok, notFound, ok, unauth, unauth, unauth}},
		{route: "GET /v1/users/:id/notifications", want: [6]int{ok, notFound, ok, unauth, unauth, unauth}},
		{route: "POST /v1/users/:id/notifications/read", want: [6]int{ok, notFound, ok, unauth, unauth, unauth}},
		{route: "POST /v1/notifications/:id/read", want: [6]int{ok, notFound, ok, unauth, unauth, unauth}},
	}

	// Every route of the policy table has a row, and every row a route.
	var covered []string
	for _, r := range rows {
		covered = append(covered, r.route)
	}
	slices.Sort(covered)
	if routes := api.PolicyRoutes(); !slices.Equal(covered, routes) {
		t.Fatalf("the matrix covers %v,\nthe route policy table has %v: give every route a row", covered, routes)
	}

	for _, r := range rows {
		method, pattern, _ := strings.Cut(r.route, " ")
		for a, want := range r.want {
			actor := matrixActor(a)
			t.Run(r.route+"/"+actorNames[a], func(t *testing.T) {
				ownerSub, ownerRole := m.owner, ""
				if pattern == "/v1/vendors/:id" {
					ownerSub, ownerRole = m.vendor, api.RoleVendor
				}
				id := m.sharedID(pattern)
				if r.fresh != nil && actor <= actorAdmin {
					id = r.fresh(t, m)
				}
				path := strings.Replace(pattern, ":id", id, 1)
				body := m.bodyOf(pattern, actor)
				if method == http.MethodPatch {
					body = map[string]any{"capacity": 10} // the course's own: nothing changes
				}
				status, out, err := m.client(t, actor, ownerSub, ownerRole).do(method, path, body)
				if err != nil {
					t.Fatalf("%s %s: %v", method, path, err)
				}
				if status != want {
					t.Fatalf("%s %s as %s = %d %v, want %d", method, path, actorNames[a], status, out, want)
				}
				m.checkCell(t, method, pattern, id, actor, status, out)
			})
		}
	}

	t.Run("acting as someone else in the body stays 403", func(t *testing.T) {
		other := m.client(t, actorOther, m.owner, "")
		for _, tc := range []struct {
			path  string
			body  map[string]any
			field string
		}{
			{"/v1/courses/" + m.course + "/enrollments", map[string]any{"student_id": m.owner}, "student_id"},
			{"/v1/coupon-types/" + m.couponType + "/coupons", map[string]any{"user_id": m.owner}, "user_id"},
			{"/v1/coupons/" + m.coupon + "/use", map[string]any{"user_id": m.owner}, "user_id"},
		} {
			status, out, err := other.do("POST", tc.path, tc.body)
			if err != nil || status != forbidden || errorCode(out) != "forbidden" || fieldOf(out) != tc.field {
				t.Errorf("POST %s as another student acting for the owner = %d %v %v, want 403 forbidden on %s",
					tc.path, status, out, err, tc.field)
			}
		}
	})

	t.Run("cancelling an already-cancelled enrollment answers from the row", func(t *testing.T) {
		id := m.newEnrollment(t)
		owner := m.client(t, actorOwner, m.owner, "")
		first := owner.must("DELETE", "/v1/enrollments/"+id, nil, ok)
		runID := runIDOf(t, s, workflows.CancellationWorkflowID(id))
		for range 3 {
			again := owner.must("DELETE", "/v1/enrollments/"+id, nil, ok)
			if again["status"] != "cancelled" || again["cancelled_at"] != first["cancelled_at"] {
				t.Fatalf("again = %v, first = %v", again, first)
			}
		}
		if got := runIDOf(t, s, workflows.CancellationWorkflowID(id)); got != runID {
			t.Fatalf("a second cancellation started run %s (the first was %s)", got, runID)
		}
	})
}

// sharedID is the shared fixture's ID for a route pattern.
func (m *matrix) sharedID(pattern string) string {
	switch {
	case strings.HasPrefix(pattern, "/v1/courses/"):
		return m.course
	case strings.HasPrefix(pattern, "/v1/enrollments/"):
		return m.enrollment
	case strings.HasPrefix(pattern, "/v1/dead-letters/"):
		return fmt.Sprint(m.deadLetter)
	case strings.HasPrefix(pattern, "/v1/vendors/"):
		return m.vendor
	case strings.HasPrefix(pattern, "/v1/coupon-types/"):
		return m.couponType
	case strings.HasPrefix(pattern, "/v1/coupons/"):
		return m.coupon
	case strings.HasPrefix(pattern, "/v1/students/"), strings.HasPrefix(pattern, "/v1/users/"):
		return m.owner
	case strings.HasPrefix(pattern, "/v1/notifications/"):
		return m.notification
	}
	return ""
}

// bodyOf is what an actor sends: a student acts as itself, an admin for the owner.
func (m *matrix) bodyOf(pattern string, a matrixActor) map[string]any {
	switch pattern {
	case "/v1/courses":
		return map[string]any{"title": "Matrix", "capacity": 1}
	case "/v1/vendors":
		return map[string]any{"name": "Matrix"}
	case "/v1/coupon-types":
		return map[string]any{"vendor_id": m.vendor, "name": "Matrix", "stock": 1, "payout_cents": 1}
	case "/v1/courses/:id/enrollments":
		return map[string]any{"student_id": m.subjectOf(a)}
	case "/v1/coupon-types/:id/coupons", "/v1/coupons/:id/use":
		return map[string]any{"user_id": m.subjectOf(a)}
	case "/v1/dead-letters/retry", "/v1/dead-letters/compensate":
		return map[string]any{"course_id": "mx-no-course-" + m.run}
	}
	return nil
}

// checkCell checks what a cell's status alone does not show: a non-owner's
// 404 is the missing ID's answer and started no run; a catalogue answer
// carries no one's data; a 401 says so.
func (m *matrix) checkCell(t *testing.T, method, pattern, id string, a matrixActor, status int, out map[string]any) {
	t.Helper()
	switch status {
	case http.StatusUnauthorized:
		if errorCode(out) != "unauthenticated" {
			t.Fatalf("401 with %v", out)
		}
	case http.StatusNotFound:
		if strings.HasPrefix(pattern, "/v1/students/") || strings.HasPrefix(pattern, "/v1/users/") {
			// A list under a student or user is that subject's: no table
			// says who exists, so anyone else's answer is the fixed 404.
			if code := errorCode(out); code != "student_not_found" && code != "user_not_found" {
				t.Fatalf("another student's list: %v", out)
			}
			return
		}
		missing := strings.Replace(pattern, ":id", "mx-missing-"+m.run, 1)
		mStatus, mOut, err := m.admin.do(method, missing, m.bodyOf(pattern, actorAdmin))
		if err != nil || mStatus != http.StatusNotFound || fmt.Sprint(mOut) != fmt.Sprint(out) {
			t.Fatalf("a non-owner's 404 %v differs from a missing ID's %d %v (%v)", out, mStatus, mOut, err)
		}
		switch pattern {
		case "/v1/enrollments/:id":
			if method == http.MethodDelete {
				noRun(t, m.s, workflows.CancellationWorkflowID(id))
			}
		case "/v1/coupons/:id/use":
			noRun(t, m.s, workflows.UseCouponWorkflowID(id))
		}
	case http.StatusOK:
		if method != http.MethodGet {
			return
		}
		// Catalogue reads carry no one's data: only these fields.
		allowed := map[string][]string{
			"/v1/courses/:id":      {"id", "title", "capacity", "credits", "enrolled", "available", "waitlisted", "created_at"},
			"/v1/coupon-types/:id": {"id", "vendor_id", "name", "stock", "issued", "remaining", "payout_cents", "created_at"},
		}[pattern]
		if allowed == nil {
			return
		}
		for k := range out {
			if !slices.Contains(allowed, k) {
				t.Fatalf("catalogue read %s answers %q: %v", pattern, k, out)
			}
		}
	}
}

func fieldOf(body map[string]any) string {
	e, _ := body["error"].(map[string]any)
	f, _ := e["field"].(string)
	return f
}
