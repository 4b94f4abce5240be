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

	appconfig "github.com/claimflow/claimflow/internal/config"
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

// TestVisibilityTellsTheOutcome drives a burst through the batcher (batch
// runs; a desk and batch runs beside it) and the single path, waits until
// no run is open and every desk run that decided a claim closed, and asks
// visibility what an operator would: no closed run may carry a
// non-terminal ClaimStatus, and the by-student queries of
// docs/operations.md find exactly the runs that decided each student's
// claim, as they decided it.
func TestVisibilityTellsTheOutcome(t *testing.T) {
	if testing.Short() {
		t.Skip("integration tests start the real stack; skipped with -short")
	}
	s := testStack(t, dataDir(t))
	c := newAPIClient(t, s)
	single := apiInMode(t, s, c, "single")
	for _, mode := range []string{"batch", "desk"} {
		t.Run(mode, func(t *testing.T) {
			visibilityBurst(t, s, apiInMode(t, s, c, mode, func(cfg *appconfig.Config) { cfg.ClaimDesks = 1 }), single, "vis-"+mode)
		})
	}
}

func visibilityBurst(t *testing.T, s *stack, batch, single *apiClient, prefix string) {
	courses := []string{prefix + "-a", prefix + "-b", prefix + "-c"}
	for _, c := range courses {
		batch.must("POST", "/v1/courses", map[string]any{"id": c, "title": "Visibility " + c, "capacity": 30}, http.StatusCreated)
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
			c := batch
			if i%10 == 0 { // some claims take the single path
				c = single
			}
			st, body, err := c.do("POST", "/v1/courses/"+a.course+"/enrollments", map[string]any{"student_id": a.student})
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
	batch.must("DELETE", "/v1/enrollments/"+granted[0].id, nil, http.StatusOK)

	waitFor(t, 2*time.Minute, "no open run on the burst's courses", heldFor(time.Second, func() bool {
		return openRunsOf(t, s, courses...) == 0
	}))
	// A desk's decisions reach visibility when its run closes, within
	// seconds of its first decision: then its latest run holds none.
	waitFor(t, time.Minute, "the desk's decisions in closed runs", func() bool {
		return deskBatchesOpen(t, s, 0) == 0
	})

	nonTerminal := "ExecutionStatus != 'Running' AND ClaimStatus IN ('pending', 'reserved', 'using', 'dead_lettered', 'retrying')"
	waitFor(t, 30*time.Second, "visibility to settle", heldFor(2*time.Second, func() bool {
		return len(visRuns(t, s, nonTerminal)) == 0
	}))
	if runs := visRuns(t, s, "ExecutionStatus != 'Running' AND ClaimStatus = 'pending'"); len(runs) != 0 {
		t.Errorf("closed runs still pending: %v", runs)
	}
	if runs := visRuns(t, s, "ExecutionStatus != 'Running' AND ClaimStatus IS NULL"); len(runs) != 0 {
		t.Errorf("closed runs without ClaimStatus: %v", runs)
	}
	batches := visRuns(t, s, "WorkflowType = 'EnrollmentBatch'")
	mixed := visRuns(t, s, "WorkflowType = 'EnrollmentBatch' AND ClaimStatus = 'confirmed' AND RefusedStudentIds IS NOT NULL")
	desks := visRuns(t, s, "WorkflowType = 'EnrollmentDesk' AND ExecutionStatus != 'Running'")
	t.Logf("%d batch runs, %d of them confirmed some claims and refused others; %d closed desk runs", len(batches), len(mixed), len(desks))
	if strings.HasPrefix(prefix, "vis-desk") && len(desks) == 0 {
		t.Errorf("no desk run closed: the burst never reached the desk")
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
		// The run that refused the student held the claim: by ID (single)
		// or in the batch's claims.
		if kind, _, _ := strings.Cut(got[0], ":"); kind == "enrollment-batch" || kind == "enrollment-desk" {
			wfType := map[string]string{"enrollment-batch": "EnrollmentBatch", "enrollment-desk": "EnrollmentDesk"}[kind]
			if batchOf := visRuns(t, s, fmt.Sprintf("RefusedStudentIds = '%s' AND WorkflowType = '%s'", a.student, wfType)); !slices.Equal(batchOf, got) {
				t.Errorf("%s: the refusing run %v is not the one listing it refused (%v)", a.student, got, batchOf)
			}
		} else if !strings.Contains(got[0], ":"+a.course+":"+a.student) {
			t.Errorf("%s on %s was refused by %s", a.student, a.course, got[0])
		}
	}
}
