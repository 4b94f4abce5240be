package main

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/claimflow/claimflow/workflows"
)

// TestDeadLetterDecisions drives dead letters on the real stack (Temporal
// dev server, Kafka-protocol broker, PostgreSQL): concurrent decisions on
// one dead letter are taken once, a stale decision is not applied to a
// later round, and the bulk routes re-drive every open dead letter of a
// filter once.
func TestDeadLetterDecisions(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the real stack; skipped under -short")
	}
	s := testStack(t, dataDir(t))
	c := newAPIClient(t, s)

	// concurrently sends n copies of one request at once and returns the
	// status of each.
	concurrently := func(n int, method, path string, body any) []int {
		codes := make([]int, n)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				status, out, err := c.do(method, path, body)
				if err != nil {
					t.Errorf("%s %s: %v", method, path, err)
				}
				if status == http.StatusConflict && errorCode(out) != "dead_letter_not_open" {
					t.Errorf("%s %s: 409 %v, want dead_letter_not_open", method, path, out)
				}
				codes[i] = status
			}()
		}
		close(start)
		wg.Wait()
		return codes
	}
	count := func(codes []int, status int) int {
		n := 0
		for _, c := range codes {
			if c == status {
				n++
			}
		}
		return n
	}
	deadLetter := func(id any) map[string]any {
		return c.must("GET", fmt.Sprintf("/v1/dead-letters/%v", id), nil, http.StatusOK)
	}

	t.Run("two concurrent decisions: one taken, nothing applied to a later round", func(t *testing.T) {
		const course = "dld101"
		c.must("POST", "/v1/courses", map[string]any{"id": course, "title": "Decisions", "capacity": 2}, http.StatusCreated)
		removeFault := failProduces(t, s, workflows.EnrollmentTopic)
		e := c.must("POST", "/v1/courses/"+course+"/enrollments", map[string]any{"student_id": "ann"}, http.StatusCreated)
		id := e["id"].(string)
		dl := waitDeadLetter(t, c, id)
		dlID := dl["id"]

		// Two operators retry at once while the broker still refuses: one
		// decision is taken, the run retries once and parks round 2.
		codes := concurrently(2, "POST", fmt.Sprintf("/v1/dead-letters/%v/retry", dlID), nil)
		if count(codes, http.StatusAccepted) != 1 || count(codes, http.StatusConflict) != 1 {
			t.Fatalf("two concurrent retries answered %v, want one 202 and one 409", codes)
		}
		waitFor(t, 60*time.Second, "round 2 of the dead letter", func() bool {
			got := deadLetter(dlID)
			return got["rounds"] == float64(2) && got["status"] == "open"
		})

		// A decision for round 1 that reaches the run now (a replica that
		// read the row before the retry) must not be applied to round 2.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Client.SignalWorkflow(ctx, dl["workflow_id"].(string), dl["run_id"].(string), workflows.SignalDeadLetter,
			workflows.DeadLetterDecision{Action: workflows.ActionRetry, DeadLetterID: int64(dlID.(float64)), Round: 1}); err != nil {
			t.Fatalf("signal a stale decision: %v", err)
		}
		waitFor(t, 30*time.Second, "round 2 still waiting for its own decision", heldFor(10*time.Second, func() bool {
			got := deadLetter(dlID)
			_, enr, _ := c.do("GET", "/v1/enrollments/"+id, nil)
			return got["rounds"] == float64(2) && got["status"] == "open" && enr["status"] == "dead_lettered"
		}))

		// Two operators compensate at once: one compensation.
		removeFault()
		codes = concurrently(2, "POST", fmt.Sprintf("/v1/dead-letters/%v/compensate", dlID), nil)
		if count(codes, http.StatusAccepted) != 1 || count(codes, http.StatusConflict) != 1 {
			t.Fatalf("two concurrent compensates answered %v, want one 202 and one 409", codes)
		}
		waitFor(t, 30*time.Second, "dead letter compensated", func() bool { return deadLetter(dlID)["status"] == "compensated" })
		waitFor(t, 30*time.Second, "enrollment.failed event", func() bool {
			return eventsFor(topicEvents(t, s, workflows.EnrollmentTopic), workflows.EventEnrollmentFailed)[id] == 1
		})
		got := deadLetter(dlID)
		if got["rounds"] != float64(2) {
			t.Errorf("dead letter after compensation: %v, want 2 rounds", got)
		}
		if enr := c.must("GET", "/v1/enrollments/"+id, nil, http.StatusOK); enr["status"] != "failed" {
			t.Errorf("enrollment after compensation: %v", enr)
		}
		if cr := c.must("GET", "/v1/courses/"+course, nil, http.StatusOK); cr["enrolled"] != float64(0) {
			t.Errorf("course after one compensation: %v, want 0 enrolled", cr)
		}
		events := topicEvents(t, s, workflows.EnrollmentTopic)
		if n := eventsFor(events, workflows.EventEnrollmentConfirmed)[id]; n != 0 {
			t.Errorf("%d confirmed events for a compensated enrollment", n)
		}
		waitFor(t, 30*time.Second, "the enrollment's run closed", func() bool { return openRunsOf(t, s, course) == 0 })
		if n := eventsFor(topicEvents(t, s, workflows.EnrollmentTopic), workflows.EventEnrollmentFailed)[id]; n != 1 {
			t.Errorf("%d enrollment.failed events, want exactly 1", n)
		}
	})

	t.Run("bulk retry and compensate by course, each dead letter once", func(t *testing.T) {
		c.must("POST", "/v1/courses", map[string]any{"id": "blk101", "title": "Bulk", "capacity": 5}, http.StatusCreated)
		c.must("POST", "/v1/courses", map[string]any{"id": "blk201", "title": "Bulk other", "capacity": 5}, http.StatusCreated)
		removeFault := failProduces(t, s, workflows.EnrollmentTopic)
		var bulk []string
		for _, student := range []string{"bo", "bea", "bill"} {
			bulk = append(bulk, c.must("POST", "/v1/courses/blk101/enrollments", map[string]any{"student_id": student}, http.StatusCreated)["id"].(string))
		}
		other := c.must("POST", "/v1/courses/blk201/enrollments", map[string]any{"student_id": "olga"}, http.StatusCreated)["id"].(string)
		var ids []int64
		for _, e := range bulk {
			ids = append(ids, int64(waitDeadLetter(t, c, e)["id"].(float64)))
		}
		otherDL := waitDeadLetter(t, c, other)["id"]
		removeFault()
		slices.Sort(ids)

		var decided []int64
		for i, want := range []int{2, 1, 0} {
			got := c.must("POST", "/v1/dead-letters/retry", map[string]any{"course_id": "blk101", "limit": 2}, http.StatusAccepted)
			listed, _ := got["ids"].([]any)
			if got["signalled"] != float64(want) || len(listed) != want || got["more"] != (want == 2) {
				t.Fatalf("bulk retry call %d: %v, want %d signalled", i+1, got, want)
			}
			for _, id := range listed {
				decided = append(decided, int64(id.(float64)))
			}
		}
		if !slices.Equal(decided, ids) {
			t.Fatalf("bulk retry decided %v, want the course's dead letters %v oldest first", decided, ids)
		}
		for _, e := range bulk {
			waitFor(t, 60*time.Second, e+" confirmed after the bulk retry", func() bool {
				_, got, _ := c.do("GET", "/v1/enrollments/"+e, nil)
				return got["status"] == "confirmed"
			})
		}
		for _, id := range ids {
			waitFor(t, 30*time.Second, fmt.Sprintf("dead letter %d resolved", id), func() bool { return deadLetter(id)["status"] == "resolved" })
		}
		if got := deadLetter(otherDL); got["status"] != "open" {
			t.Fatalf("a dead letter of another course: %v, want open", got)
		}
		events := topicEvents(t, s, workflows.EnrollmentTopic)
		for _, e := range bulk {
			if n := eventsFor(events, workflows.EventEnrollmentConfirmed)[e]; n != 1 {
				t.Errorf("%s: %d confirmed events, want 1", e, n)
			}
		}

		got := c.must("POST", "/v1/dead-letters/compensate", map[string]any{"course_id": "blk201", "stage": "publish"}, http.StatusAccepted)
		if got["signalled"] != float64(1) {
			t.Fatalf("bulk compensate: %v, want 1 signalled", got)
		}
		waitFor(t, 30*time.Second, "the other course's enrollment failed", func() bool {
			_, enr, _ := c.do("GET", "/v1/enrollments/"+other, nil)
			return enr["status"] == "failed" && deadLetter(otherDL)["status"] == "compensated"
		})
		if again := c.must("POST", "/v1/dead-letters/compensate", map[string]any{"course_id": "blk201"}, http.StatusAccepted); again["signalled"] != float64(0) {
			t.Errorf("the same bulk compensate again: %v, want nothing signalled", again)
		}
	})
}

// recordNamedDecisions is the recorder's step (TestRecordHistories) for
// enrollment_dead_letter_named_decisions: a handed-off Enrollment run has
// dead-lettered its event (dl, while removeFault's fault holds); two
// concurrent retries, of which the API takes one; round 2 dead-letters; a
// stale decision for round 1 is signalled straight to the run and ignored;
// a compensate of round 2 releases the seat.
func recordNamedDecisions(t *testing.T, s *stack, rec *historyRecorder, admin *apiClient, dl map[string]any, id string, removeFault func()) {
	t.Helper()
	path := fmt.Sprintf("/v1/dead-letters/%v/", dl["id"])
	var codes [2]int
	var wg sync.WaitGroup
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes[i], _, _ = admin.do("POST", path+"retry", nil)
		}()
	}
	wg.Wait()
	if codes[0]+codes[1] != http.StatusAccepted+http.StatusConflict {
		t.Fatalf("two concurrent retries answered %v, want 202 and 409", codes)
	}
	waitFor(t, 60*time.Second, "round 2 of the dead letter", func() bool {
		_, got, _ := admin.do("GET", fmt.Sprintf("/v1/dead-letters/%v", dl["id"]), nil)
		return got["rounds"] == float64(2) && got["status"] == "open"
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Client.SignalWorkflow(ctx, dl["workflow_id"].(string), dl["run_id"].(string), workflows.SignalDeadLetter,
		workflows.DeadLetterDecision{Action: workflows.ActionRetry, DeadLetterID: int64(dl["id"].(float64)), Round: 1}); err != nil {
		t.Fatalf("signal a stale decision: %v", err)
	}
	removeFault()
	admin.must("POST", path+"compensate", nil, http.StatusAccepted)
	rec.record("enrollment_dead_letter_named_decisions", dl["workflow_id"].(string), dl["run_id"].(string))
	if got := admin.must("GET", "/v1/enrollments/"+id, nil, http.StatusOK); got["status"] != "failed" {
		t.Fatalf("enrollment after the compensate of round 2: %v, want failed", got)
	}
}
