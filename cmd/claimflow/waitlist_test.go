package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/claimflow/claimflow/internal/store"
	"github.com/claimflow/claimflow/workflows"
)

// TestWaitlist drives the waitlist on the real stack: places first come
// first served, leaving the queue, a cancellation's seat going to the head
// (enrollment.promoted, then enrollment.confirmed), a capacity raise
// promoting in order, and under concurrency the audit's invariants.
func TestWaitlist(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the real stack; skipped with -short")
	}
	s := testStack(t, dataDir(t))
	admin := newAPIClient(t, s)
	as := func(sub string) *apiClient { return newStudentClient(t, s, sub) }
	run := fmt.Sprintf("%d", time.Now().UnixNano()%1_000_000)
	status := func(id string) map[string]any {
		return admin.must("GET", "/v1/enrollments/"+id, nil, http.StatusOK)
	}
	waitStatus := func(id, want string) {
		t.Helper()
		waitFor(t, 2*time.Minute, id+" "+want, func() bool { return status(id)["status"] == want })
	}

	t.Run("places, leaving, promotion by cancellation and by capacity", func(t *testing.T) {
		course := "wl-" + run
		admin.must("POST", "/v1/courses", map[string]any{"id": course, "title": "Waitlisted", "capacity": 2}, http.StatusCreated)
		enroll := func(student string, waitlist bool, want int) map[string]any {
			t.Helper()
			body := map[string]any{"student_id": student}
			if waitlist {
				body["waitlist"] = true
			}
			return as(student).must("POST", "/v1/courses/"+course+"/enrollments", body, want)
		}
		s1 := enroll("s1-"+run, false, http.StatusCreated)["id"].(string)
		enroll("s2-"+run, false, http.StatusCreated)
		if st, body, _ := as("p-"+run).do("POST", "/v1/courses/"+course+"/enrollments", map[string]any{"student_id": "p-" + run}); st != http.StatusConflict || errorCode(body) != "course_full" {
			t.Fatalf("a plain claim on a full course: %d %v", st, body)
		}
		var w []string
		for i := 1; i <= 4; i++ { // WAITLIST_PER_SEAT 2 × capacity 2
			got := enroll(fmt.Sprintf("w%d-%s", i, run), true, http.StatusAccepted)
			if got["status"] != "waitlisted" || got["position"] != float64(i) {
				t.Fatalf("w%d: %v, want waitlisted at position %d", i, got, i)
			}
			w = append(w, got["id"].(string))
		}
		if st, body, _ := as("w5-"+run).do("POST", "/v1/courses/"+course+"/enrollments", map[string]any{"student_id": "w5-" + run, "waitlist": true}); st != http.StatusConflict || errorCode(body) != "waitlist_full" {
			t.Fatalf("the fifth place: %d %v", st, body)
		}
		if got := status(w[1]); got["status"] != "waitlisted" || got["position"] != float64(2) {
			t.Fatalf("w2 reads: %v", got)
		}
		// w2 leaves; w3 moves up.
		as("w2-"+run).must("DELETE", "/v1/enrollments/"+w[1], nil, http.StatusOK)
		if got := status(w[2]); got["position"] != float64(2) {
			t.Fatalf("w3 after w2 left: %v", got)
		}
		// s1 cancels: w1, the head, gets the seat through its own saga.
		waitStatus(s1, "confirmed")
		as("s1-"+run).must("DELETE", "/v1/enrollments/"+s1, nil, http.StatusOK)
		waitStatus(w[0], "confirmed")
		if got := status(w[0]); got["promoted_at"] == nil {
			t.Errorf("w1 confirmed without promoted_at: %v", got)
		}
		c := admin.must("GET", "/v1/courses/"+course, nil, http.StatusOK)
		if c["enrolled"] != float64(2) || c["waitlisted"] != float64(2) {
			t.Fatalf("course after one promotion: %v", c)
		}
		// Raising the capacity by one promotes the next in line, w3; w4 waits.
		admin.must("PATCH", "/v1/courses/"+course, map[string]any{"capacity": 3}, http.StatusOK)
		waitStatus(w[2], "confirmed")
		if got := status(w[3]); got["status"] != "waitlisted" || got["position"] != float64(1) {
			t.Errorf("w4: %v", got)
		}
		if st, body, _ := admin.do("PATCH", "/v1/courses/"+course, map[string]any{"capacity": 1}); st != http.StatusConflict || errorCode(body) != "capacity_below_enrolled" {
			t.Errorf("capacity below the enrolled: %d %v", st, body)
		}
		// The promoted students' events: promoted, then confirmed.
		events := topicEvents(t, s, workflows.EnrollmentTopic)
		for _, id := range []string{w[0], w[2]} {
			promoted, confirmed := -1, -1
			for i, e := range events {
				switch e.ID {
				case workflows.EventID(id, workflows.EventEnrollmentPromoted):
					promoted = i
				case workflows.EventID(id, workflows.EventEnrollmentConfirmed):
					confirmed = i
				}
			}
			if promoted < 0 || confirmed < promoted {
				t.Errorf("%s: enrollment.promoted at %d, enrollment.confirmed at %d", id, promoted, confirmed)
			}
		}
		auditCourses(t, s, course)
	})

	t.Run("under concurrency nobody waits beside a free seat", func(t *testing.T) {
		course := "wlc-" + run
		const seats, waiters = 10, 20
		admin.must("POST", "/v1/courses", map[string]any{"id": course, "title": "Busy", "capacity": seats}, http.StatusCreated)
		var mu sync.Mutex
		var enrolled, waiting []string
		concurrentlyDo(seats+waiters, func(i int) {
			student := fmt.Sprintf("c%02d-%s", i, run)
			st, body, err := as(student).do("POST", "/v1/courses/"+course+"/enrollments", map[string]any{"student_id": student, "waitlist": true})
			if err != nil || (st != http.StatusCreated && st != http.StatusAccepted) {
				t.Errorf("%s: %d %v %v", student, st, body, err)
				return
			}
			mu.Lock()
			if st == http.StatusCreated {
				enrolled = append(enrolled, body["id"].(string)+" "+student)
			} else {
				waiting = append(waiting, body["id"].(string)+" "+student)
			}
			mu.Unlock()
		})
		if len(enrolled) != seats {
			t.Fatalf("%d enrolled on %d seats", len(enrolled), seats)
		}
		// Half the enrolled cancel while five of the waiting leave, all at once.
		for _, e := range enrolled[:seats/2] {
			waitStatus(strings.Fields(e)[0], "confirmed")
		}
		const leaving = 5
		concurrentlyDo(seats/2+leaving, func(i int) {
			var id, student string
			if i < seats/2 {
				fmt.Sscan(enrolled[i], &id, &student)
			} else {
				fmt.Sscan(waiting[len(waiting)-1-(i-seats/2)], &id, &student)
			}
			as(student).must("DELETE", "/v1/enrollments/"+id, nil, http.StatusOK)
		})
		waitFor(t, 3*time.Minute, "the freed seats taken from the waitlist", func() bool {
			c := admin.must("GET", "/v1/courses/"+course, nil, http.StatusOK)
			return c["enrolled"] == float64(seats) && c["waitlisted"] == float64(waiters-seats/2-leaving)
		})
		waitFor(t, 3*time.Minute, "every promoted enrollment confirmed", func() bool {
			got := admin.must("GET", "/v1/courses/"+course+"/enrollments?status=reserved", nil, http.StatusOK)
			list, _ := got["enrollments"].([]any)
			return len(list) == 0
		})
		auditCourses(t, s, course)
	})
}

// auditCourses runs the audit's waitlist check on the courses with prefix.
func auditCourses(t *testing.T, s *stack, prefix string) {
	t.Helper()
	r, err := store.AuditWaitlist(context.Background(), s.Pool, prefix)
	if err != nil {
		t.Fatal(err)
	}
	if !r.OK() {
		t.Errorf("waitlist audit of %s: %+v", prefix, r)
	}
	t.Logf("waitlist audit of %s: %+v", prefix, r)
}

// concurrentlyDo runs fn(0..n-1) at once and waits.
func concurrentlyDo(n int, fn func(i int)) {
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			fn(i)
		}()
	}
	close(start)
	wg.Wait()
}

// TestPromotionSurvivesAWorkerKill: the worker is SIGKILLed right after a
// cancellation freed a seat, before the head of the waitlist was promoted;
// a new worker picks the saga up from its history and the student is
// promoted and confirmed. The kill must land in that window (checked: the
// waiter still waits when the worker is dead); a kill that came too late is
// tried again on a fresh course.
func TestPromotionSurvivesAWorkerKill(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the real stack; skipped with -short")
	}
	o := testStackOptions(t, dataDir(t))
	o.NoWorker = true
	s := startTestStack(t, o)
	c := newAPIClient(t, s)
	run := fmt.Sprintf("%d", time.Now().UnixNano()%1_000_000)
	status := func(id string) string {
		got := c.must("GET", "/v1/enrollments/"+id, nil, http.StatusOK)
		st, _ := got["status"].(string)
		return st
	}
	for try := 1; try <= 5; try++ {
		w := startWorkerProcess(t, s)
		course := fmt.Sprintf("wk-%s-%d", run, try)
		c.must("POST", "/v1/courses", map[string]any{"id": course, "title": "Killed", "capacity": 1}, http.StatusCreated)
		held := c.must("POST", "/v1/courses/"+course+"/enrollments?wait=confirmed", map[string]any{"student_id": "held-" + course}, http.StatusCreated)
		waiter := c.must("POST", "/v1/courses/"+course+"/enrollments", map[string]any{"student_id": "waiter-" + course, "waitlist": true}, http.StatusAccepted)
		c.must("DELETE", "/v1/enrollments/"+held["id"].(string), nil, http.StatusOK)
		w.kill() // SIGKILL: the seat is free, the saga goes on elsewhere or nowhere
		waiterID := waiter["id"].(string)
		if got := status(waiterID); got != "waitlisted" {
			t.Logf("try %d: the kill came after the promotion (waiter %s); again", try, got)
			continue
		}
		t.Logf("try %d: worker killed between the freed seat and the promotion", try)
		startWorkerProcess(t, s)
		waitFor(t, 2*time.Minute, "the waiter promoted and confirmed by the new worker", func() bool {
			return status(waiterID) == "confirmed"
		})
		auditCourses(t, s, course)
		return
	}
	t.Fatal("five kills all came after the promotion: the window was never hit")
}
