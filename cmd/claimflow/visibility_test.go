package main

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.temporal.io/api/workflowservice/v1"
)

// visRuns returns "workflowID/runID" of every run the visibility query finds.
func visRuns(t *testing.T, s *stack, query string) []string {
	t.Helper()
	var out []string
	var token []byte
	for {
		resp, err := s.Client.ListWorkflow(context.Background(), &workflowservice.ListWorkflowExecutionsRequest{
			Namespace: s.Config.Namespace, Query: query, PageSize: 1000, NextPageToken: token,
		})
		if err != nil {
			t.Fatalf("list %q: %v", query, err)
		}
		for _, e := range resp.Executions {
			out = append(out, e.Execution.WorkflowId+"/"+e.Execution.RunId)
		}
		if token = resp.NextPageToken; len(token) == 0 {
			break
		}
	}
	slices.Sort(out)
	return out
}

// TestVisibilityTellsTheOutcome drives a burst through the desks, waits
// until no run is open and every desk run that decided a claim closed, and
// asks visibility what an operator would: no closed run may carry a
// non-terminal ClaimStatus, and the by-student queries of
// docs/operations.md find exactly the runs that decided each student's
// claim, as they decided it.
func TestVisibilityTellsTheOutcome(t *testing.T) {
	if testing.Short() {
		t.Skip("integration tests start the real stack; skipped with -short")
	}
	s := testStack(t, dataDir(t))
	visibilityBurst(t, s, newAPIClient(t, s), "vis")
}

func visibilityBurst(t *testing.T, s *stack, api *apiClient, prefix string) {
	courses := []string{prefix + "-a", prefix + "-b", prefix + "-c"}
	for _, c := range courses {
		api.must("POST", "/v1/courses", map[string]any{"id": c, "title": "Visibility " + c, "capacity": 30}, http.StatusCreated)
	}
	type answer struct {
		student, course string
		status          int
		run             string // workflowID/runID of a granted claim
		id              string // its enrollment ID
		code            string // refusal code
	}
	const students = 300
	answers := make([]answer, students)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 60)
	for i := range students {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			a := answer{student: fmt.Sprintf("%s-s-%03d", prefix, i), course: courses[i%len(courses)]}
			st, body, err := api.do("POST", "/v1/courses/"+a.course+"/enrollments", map[string]any{"student_id": a.student})
			if err != nil {
				t.Errorf("enroll %s: %v", a.student, err)
				return
			}
			a.status, a.code = st, errorCode(body)
			if st == http.StatusCreated {
				a.run = fmt.Sprint(body["workflow_id"]) + "/" + fmt.Sprint(body["run_id"])
				a.id = fmt.Sprint(body["id"])
			}
			answers[i] = a
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	var granted, refused []answer
	for _, a := range answers {
		switch {
		case a.status == http.StatusCreated:
			granted = append(granted, a)
		case a.status == http.StatusConflict && a.code == "course_full":
			refused = append(refused, a)
		default:
			t.Fatalf("%s on %s answered %d %s", a.student, a.course, a.status, a.code)
		}
	}
	if len(granted) != 90 || len(refused) != 210 {
		t.Fatalf("granted %d, refused %d; want 90 and 210", len(granted), len(refused))
	}
	// One cancellation, so that a Cancellation run closes too.
	api.must("DELETE", "/v1/enrollments/"+granted[0].id, nil, http.StatusOK)

	waitFor(t, 2*time.Minute, "no open run on the burst's courses", heldFor(time.Second, func() bool {
		return openRunsOf(t, s, courses...) == 0
	}))
	// A desk's decisions reach visibility when its run closes, within
	// seconds of its first decision: then its latest run holds none.
	for k := range s.Config.ClaimDesks {
		waitFor(t, time.Minute, "the desks' decisions in closed runs", func() bool {
			return deskBatchesOpen(t, s, k) == 0
		})
	}

	nonTerminal := "ExecutionStatus != 'Running' AND ClaimStatus IN ('pending', 'reserved', 'using', 'dead_lettered', 'retrying')"
	waitFor(t, 30*time.Second, "visibility to settle", heldFor(2*time.Second, func() bool {
		return len(visRuns(t, s, nonTerminal)) == 0
	}))
	if runs := visRuns(t, s, "ExecutionStatus != 'Running' AND ClaimStatus = 'pending'"); len(runs) != 0 {
		t.Errorf("closed runs still pending: %v", runs)
	}
	// Every closed claim run tells its status; the recovery schedule's runs
	// (one every RECOVERY_EVERY) decide no claim of their own.
	if runs := visRuns(t, s, "ExecutionStatus != 'Running' AND ClaimStatus IS NULL AND WorkflowType != 'RecoverReservations'"); len(runs) != 0 {
		t.Errorf("closed runs without ClaimStatus: %v", runs)
	}
	desks := visRuns(t, s, "WorkflowType = 'EnrollmentDesk' AND ExecutionStatus != 'Running'")
	mixed := visRuns(t, s, "WorkflowType = 'EnrollmentDesk' AND ClaimStatus = 'confirmed' AND RefusedStudentIds IS NOT NULL")
	t.Logf("%d closed desk runs, %d of them confirmed some claims and refused others", len(desks), len(mixed))
	if len(desks) == 0 {
		t.Errorf("no desk run closed: the burst never reached a desk")
	}

	confirmedBy := func(student string) string {
		return fmt.Sprintf("StudentId = '%s' AND ClaimStatus = 'confirmed'", student)
	}
	refusedBy := func(student string) string {
		return fmt.Sprintf("RefusedStudentIds = '%s' OR (StudentId = '%s' AND ClaimStatus IN ('course_full', 'already_enrolled', 'course_not_found', 'refused'))",
			student, student)
	}
	// Every student, not a sample: the check is two queries each.
	for _, a := range granted {
		if got := visRuns(t, s, confirmedBy(a.student)); !slices.Equal(got, []string{a.run}) {
			t.Errorf("%s was confirmed by %s; %q finds %v", a.student, a.run, confirmedBy(a.student), got)
		}
		if got := visRuns(t, s, refusedBy(a.student)); len(got) != 0 {
			t.Errorf("%s was never refused; %q finds %v", a.student, refusedBy(a.student), got)
		}
	}
	for _, a := range refused {
		if got := visRuns(t, s, confirmedBy(a.student)); len(got) != 0 {
			t.Errorf("%s was refused; %q finds %v", a.student, confirmedBy(a.student), got)
		}
		got := visRuns(t, s, refusedBy(a.student))
		if len(got) != 1 {
			t.Errorf("%s was refused once; %q finds %v", a.student, refusedBy(a.student), got)
			continue
		}
		// A desk refused the student and lists it.
		if !strings.HasPrefix(got[0], "enrollment-desk:") {
			t.Errorf("%s on %s was refused by %s, not a desk", a.student, a.course, got[0])
		}
	}
}
