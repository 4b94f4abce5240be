package main

import (
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"
)

// TestReads drives the lists on the real stack: a student's enrollments,
// the roster, a user's coupons and the inbox the consumer fills, each paged
// and each closed to anyone but the owner and an admin.
func TestReads(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the real stack; skipped with -short")
	}
	s := testStack(t, dataDir(t))
	admin := newAPIClient(t, s)
	as := func(sub string) *apiClient { return newStudentClient(t, s, sub) }
	run := fmt.Sprintf("%d", time.Now().UnixNano()%1_000_000)
	me, other := "s-me-"+run, "s-other-"+run
	alice, bob := as(me), as(other)

	courses := []string{"rd1-" + run, "rd2-" + run, "rd3-" + run}
	for _, id := range courses {
		admin.must("POST", "/v1/courses", map[string]any{"id": id, "title": "Reading " + id, "capacity": 5}, http.StatusCreated)
	}
	var mine []string
	for _, id := range courses {
		e := alice.must("POST", "/v1/courses/"+id+"/enrollments", map[string]any{"student_id": me}, http.StatusCreated)
		mine = append(mine, e["id"].(string))
	}
	bob.must("POST", "/v1/courses/"+courses[0]+"/enrollments", map[string]any{"student_id": other}, http.StatusCreated)

	list := func(c *apiClient, path, key string) ([]map[string]any, string) {
		t.Helper()
		got := c.must("GET", path, nil, http.StatusOK)
		raw, _ := got[key].([]any)
		out := make([]map[string]any, len(raw))
		for i, r := range raw {
			out[i] = r.(map[string]any)
		}
		next, _ := got["next"].(string)
		return out, next
	}

	t.Run("a student's enrollments, newest first, two pages", func(t *testing.T) {
		page1, next := list(alice, "/v1/students/"+me+"/enrollments?limit=2", "enrollments")
		if len(page1) != 2 || next == "" || page1[0]["id"] != mine[2] || page1[1]["id"] != mine[1] {
			t.Fatalf("page 1: %v next %q; want %s, %s", page1, next, mine[2], mine[1])
		}
		if page1[0]["workflow_id"] == nil || page1[0]["course_id"] != courses[2] {
			t.Errorf("a listed enrollment: %v", page1[0])
		}
		page2, end := list(alice, "/v1/students/"+me+"/enrollments?limit=2&after="+url.QueryEscape(next), "enrollments")
		if len(page2) != 1 || end != "" || page2[0]["id"] != mine[0] {
			t.Fatalf("page 2: %v next %q; want %s and no next", page2, end, mine[0])
		}
		if all, _ := list(admin, "/v1/students/"+me+"/enrollments", "enrollments"); len(all) != 3 {
			t.Errorf("the admin sees %d of the student's enrollments, want 3", len(all))
		}
		waitFor(t, time.Minute, "the three confirmed", func() bool {
			got, _ := list(alice, "/v1/students/"+me+"/enrollments?status=confirmed", "enrollments")
			return len(got) == 3
		})
		if got, _ := list(alice, "/v1/students/"+me+"/enrollments?status=cancelled", "enrollments"); len(got) != 0 {
			t.Errorf("cancelled: %v", got)
		}
	})

	t.Run("refusals", func(t *testing.T) {
		for _, tc := range []struct {
			c      *apiClient
			path   string
			status int
			code   string
			field  string
		}{
			{bob, "/v1/students/" + me + "/enrollments", http.StatusNotFound, "student_not_found", "id"},
			{bob, "/v1/users/" + me + "/coupons", http.StatusNotFound, "user_not_found", "id"},
			{bob, "/v1/users/" + me + "/notifications", http.StatusNotFound, "user_not_found", "id"},
			{alice, "/v1/courses/" + courses[0] + "/enrollments", http.StatusForbidden, "forbidden", ""},
			{admin, "/v1/courses/nope-" + run + "/enrollments", http.StatusNotFound, "course_not_found", "id"},
			{alice, "/v1/students/" + me + "/enrollments?status=gone", http.StatusBadRequest, "invalid_field", "status"},
			{alice, "/v1/students/" + me + "/enrollments?limit=201", http.StatusBadRequest, "invalid_field", "limit"},
			{alice, "/v1/students/" + me + "/enrollments?limit=0", http.StatusBadRequest, "invalid_field", "limit"},
			{alice, "/v1/students/" + me + "/enrollments?after=bm9wZQ", http.StatusBadRequest, "invalid_field", "after"},
			{alice, "/v1/users/" + me + "/coupons?status=lost", http.StatusBadRequest, "invalid_field", "status"},
			{alice, "/v1/users/" + me + "/notifications?unread=maybe", http.StatusBadRequest, "invalid_field", "unread"},
		} {
			status, body, err := tc.c.do("GET", tc.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			e, _ := body["error"].(map[string]any)
			if status != tc.status || errorCode(body) != tc.code || (tc.field != "" && e["field"] != tc.field) {
				t.Errorf("GET %s = %d %v, want %d %s (field %q)", tc.path, status, body, tc.status, tc.code, tc.field)
			}
		}
	})

	t.Run("the roster, in request order", func(t *testing.T) {
		roster, next := list(admin, "/v1/courses/"+courses[0]+"/enrollments", "enrollments")
		if len(roster) != 2 || next != "" || roster[0]["student_id"] != me || roster[1]["student_id"] != other {
			t.Fatalf("roster: %v", roster)
		}
	})

	t.Run("a user's coupons", func(t *testing.T) {
		vendor, typeID := "rv-"+run, "rt-"+run
		admin.must("POST", "/v1/vendors", map[string]any{"id": vendor, "name": "Reading Room"}, http.StatusCreated)
		admin.must("POST", "/v1/coupon-types", map[string]any{"id": typeID, "vendor_id": vendor, "name": "free tea",
			"stock": 10, "payout_cents": 100}, http.StatusCreated)
		k := alice.must("POST", "/v1/coupon-types/"+typeID+"/coupons", map[string]any{"user_id": me}, http.StatusCreated)
		got, next := list(alice, "/v1/users/"+me+"/coupons", "coupons")
		if len(got) != 1 || next != "" || got[0]["id"] != k["id"] || got[0]["type_name"] != "free tea" ||
			got[0]["vendor_id"] != vendor || got[0]["status"] != "issued" {
			t.Fatalf("coupons: %v", got)
		}
		if used, _ := list(alice, "/v1/users/"+me+"/coupons?status=used", "coupons"); len(used) != 0 {
			t.Errorf("used coupons: %v", used)
		}
	})

	t.Run("the inbox", func(t *testing.T) {
		// Three enrollment.confirmed and one coupon.issued name the student.
		var inbox []map[string]any
		waitFor(t, 2*time.Minute, "four notifications", func() bool {
			inbox, _ = list(alice, "/v1/users/"+me+"/notifications?unread=true", "notifications")
			return len(inbox) == 4
		})
		newest := inbox[0]
		id := fmt.Sprintf("%.0f", newest["id"].(float64))
		if st, body, _ := bob.do("POST", "/v1/notifications/"+id+"/read", nil); st != http.StatusNotFound || errorCode(body) != "notification_not_found" {
			t.Errorf("someone else marking it read: %d %v", st, body)
		}
		read := alice.must("POST", "/v1/notifications/"+id+"/read", nil, http.StatusOK)
		if read["read_at"] == nil || read["event_id"] != newest["event_id"] {
			t.Errorf("marked: %v", read)
		}
		if unread, _ := list(alice, "/v1/users/"+me+"/notifications?unread=true", "notifications"); len(unread) != 3 {
			t.Errorf("unread after one read: %d", len(unread))
		}
		// Mark the third-newest and everything older read, by its cursor.
		marked := alice.must("POST", "/v1/users/"+me+"/notifications/read", map[string]any{"before": inbox[2]["cursor"]}, http.StatusOK)
		if marked["marked"] != float64(2) {
			t.Errorf("mark read before the third: %v, want 2 marked", marked)
		}
		unread, _ := list(alice, "/v1/users/"+me+"/notifications?unread=true", "notifications")
		if len(unread) != 1 || unread[0]["id"] != inbox[1]["id"] {
			t.Errorf("unread left: %v, want only the second-newest", unread)
		}
		if all, _ := list(alice, "/v1/users/"+me+"/notifications?limit=3", "notifications"); len(all) != 3 {
			t.Errorf("a page of 3: %d", len(all))
		}
	})
}
