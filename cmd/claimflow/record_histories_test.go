package main

// The recorder of workflows/testdata: it drives every workflow path in use
// through the API of a real stack (Temporal dev server, kfake or Apache
// Kafka, PostgreSQL, the payout and notification simulators), waits for each
// run to close, and writes its history as `temporal workflow show --output
// json` does. workflows/replay_test.go replays them in every `go test`.
//
//	RECORD_HISTORIES=1 go test -count=1 -run '^(TestRecordHistories|TestRecordWaitlistHistories)$' ./cmd/claimflow/
//
// or scripts/record-histories; docs/replay.md says when to.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	temporallog "go.temporal.io/sdk/log"
	sdkworker "go.temporal.io/sdk/worker"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/claimflow/claimflow/activities"
	"github.com/claimflow/claimflow/dev/notifysim"
	"github.com/claimflow/claimflow/dev/payoutsim"
	appconfig "github.com/claimflow/claimflow/internal/config"
	"github.com/claimflow/claimflow/worker"
	"github.com/claimflow/claimflow/workflows"
)

// recordDir is where the histories go, relative to this package.
var recordDir = filepath.Join("..", "..", "workflows", "testdata")

// historyRecorder waits for runs to close and writes their histories.
type historyRecorder struct {
	t        *testing.T
	s        *stack
	replayer sdkworker.WorkflowReplayer
	written  []string
}

// closed waits until the run (the latest one of the workflow ID when runID
// is "") is closed and returns it with its run ID.
func (r *historyRecorder) closed(workflowID, runID string) runRef {
	r.t.Helper()
	ref := runRef{WorkflowID: workflowID, RunID: runID}
	waitFor(r.t, 2*time.Minute, "run "+ref.String()+" closed", func() bool {
		d, err := r.s.Client.DescribeWorkflow(context.Background(), workflowID, runID)
		if err != nil {
			return false // not started yet
		}
		info := d.RawResponse.WorkflowExecutionInfo
		if info.Status == enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING {
			return false
		}
		ref.RunID = info.Execution.RunId
		return true
	})
	return ref
}

// record waits for the run to close, checks that its history replays
// against this build, and writes it to workflows/testdata/<name>.json.
func (r *historyRecorder) record(name, workflowID, runID string) {
	r.t.Helper()
	ref := r.closed(workflowID, runID)
	h, err := fetchHistory(context.Background(), r.s.Client, ref)
	if err != nil {
		r.t.Fatal(err)
	}
	last := h.Events[len(h.Events)-1].EventType
	if last != enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED && last != enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW {
		r.t.Fatalf("%s: run %s ended with %s, want a completed run (or, for a desk, one that continued as new)", name, ref, last)
	}
	quiet := temporallog.NewStructuredLogger(slog.New(slog.NewTextHandler(testWriter{r.t}, &slog.HandlerOptions{Level: slog.LevelError})))
	if err := r.replayer.ReplayWorkflowHistory(quiet, h); err != nil {
		r.t.Fatalf("%s: the history of %s does not replay against this build: %v", name, ref, err)
	}
	b, err := historyJSON(h)
	if err != nil {
		r.t.Fatal(err)
	}
	file := filepath.Join(recordDir, name+".json")
	if err := os.WriteFile(file, b, 0o644); err != nil {
		r.t.Fatal(err)
	}
	r.written = append(r.written, name)
	r.t.Logf("recorded %-50s %s (%d events)", file, ref, len(h.Events))
}

// historyJSON writes a history the way `temporal workflow show --output
// json` does (protojson: camelCase fields, int64 as strings, long enum
// names, base64 payload data), indented by two spaces so that a re-recorded
// fixture diffs line by line. client.HistoryFromJSON reads it back.
func historyJSON(h *historypb.History) ([]byte, error) {
	raw, err := protojson.Marshal(h)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	if err := json.Indent(&out, raw, "", "  "); err != nil {
		return nil, err
	}
	out.WriteByte('\n')
	return out.Bytes(), nil
}

// batchRunOf waits for the batch run that holds student's claim.
func batchRunOf(t *testing.T, s *stack, student string) runRef {
	t.Helper()
	var runs []runRef
	waitFor(t, 30*time.Second, "the batch run of "+student, func() bool {
		var err error
		runs, err = listRuns(context.Background(), s.Client, s.Config.Namespace,
			fmt.Sprintf("WorkflowType = 'EnrollmentBatch' AND StudentId = '%s'", student), 2)
		return err == nil && len(runs) == 1
	})
	return runs[0]
}

// openDeadLetter waits for the one open dead letter that match accepts.
func openDeadLetter(t *testing.T, c *apiClient, what string, match func(d map[string]any) bool) map[string]any {
	t.Helper()
	var found map[string]any
	waitFor(t, 90*time.Second, "dead letter of "+what, func() bool {
		_, body, _ := c.do("GET", "/v1/dead-letters?status=open&limit=1000", nil)
		items, _ := body["dead_letters"].([]any)
		for _, it := range items {
			if d := it.(map[string]any); match(d) {
				found = d
				return true
			}
		}
		return false
	})
	return found
}

// startRecording skips unless RECORD_HISTORIES=1, then starts a private
// stack and a recorder that checks each history replays against this build.
// The recovery schedule stays out of the way (the recorder starts its
// recovery run itself), and one desk takes every batch, so that each
// recorded desk run holds what the recorder sent.
func startRecording(t *testing.T) (*stack, *historyRecorder, *apiClient) {
	t.Helper()
	if os.Getenv("RECORD_HISTORIES") != "1" {
		t.Skip("records workflows/testdata from a real stack; run with RECORD_HISTORIES=1 (scripts/record-histories)")
	}
	t.Setenv("RECOVERY_EVERY", "1h")
	t.Setenv("CLAIM_DESKS", "1")
	s := testStack(t, dataDir(t))
	replayer := sdkworker.NewWorkflowReplayer()
	worker.RegisterWorkflows(replayer)
	return s, &historyRecorder{t: t, s: s, replayer: replayer}, newAPIClient(t, s)
}

// deskAPI is a second API whose desk run (desk 0, started afresh) continues
// as new after batches batches, so that a recorded run holds what the
// recorder sent it and closes on its own.
func deskAPI(t *testing.T, s *stack, c *apiClient, batches int, tune ...func(*appconfig.Config)) *apiClient {
	t.Helper()
	closeDesk(t, s, 0)
	return secondAPI(t, s, c, append([]func(*appconfig.Config){func(cfg *appconfig.Config) {
		cfg.ClaimDesks, cfg.ClaimDeskBatches = 1, batches
	}}, tune...)...)
}

func TestRecordHistories(t *testing.T) {
	// A short payout timeout keeps the lost-answer path quick, as in TestCoupons.
	t.Setenv("PAYOUT_TIMEOUT", "2s")
	s, rec, c := startRecording(t)
	if s.Payout == nil || s.Notify == nil {
		t.Fatal("the recorder needs the stack's payout and notification simulators (unset VENDOR_PAYOUT_URL and NOTIFY_WEBHOOK_URL)")
	}
	// IDs unique to this recording, for a real Kafka broker shared between runs.
	run := fmt.Sprintf("%d", time.Now().UnixNano()%1_000_000)
	course := "rec-" + run
	c.must("POST", "/v1/courses", map[string]any{"id": course, "title": "Recorded", "capacity": 100}, http.StatusCreated)
	full := "full-" + run
	c.must("POST", "/v1/courses", map[string]any{"id": full, "title": "Full", "capacity": 1}, http.StatusCreated)
	enroll := func(api *apiClient, course, student string, want int, waitlist bool) map[string]any {
		t.Helper()
		return api.must("POST", "/v1/courses/"+course+"/enrollments",
			map[string]any{"student_id": student + "-" + run, "waitlist": waitlist}, want)
	}
	wantStatus := func(what string, got map[string]any, status string) {
		t.Helper()
		if got["status"] != status {
			t.Fatalf("%s answered %v, want status %s", what, got, status)
		}
	}
	c.must("POST", "/v1/courses/"+full+"/enrollments?wait=confirmed", map[string]any{"student_id": "first-" + run}, http.StatusCreated)

	// A desk's run with the broker up: one batch confirmed, one refused, one
	// waitlisted; it continues as new after the three.
	desk := deskAPI(t, s, c, 3)
	confirmed := enroll(desk, course, "desk-confirmed", http.StatusCreated, false)
	wantStatus("a desk enrollment", confirmed, "confirmed")
	if got := enroll(desk, full, "desk-refused", http.StatusConflict, false); errorCode(got) != "course_full" {
		t.Fatalf("enrollment in a full course answered %v", got)
	}
	wantStatus("a waitlisted claim", enroll(desk, full, "desk-waitlisted", http.StatusAccepted, true), "waitlisted")
	rec.record("enrollment_desk_confirmed", workflows.EnrollmentDeskWorkflowID(0), confirmed["run_id"].(string))

	// The desk's publish fails: it answers reserved, starts the batch's
	// run and continues as new (one batch a run here); the batch run
	// publishes once the broker is back, within its policy.
	desk = deskAPI(t, s, c, 1)
	removeFault := failProduces(t, s, workflows.EnrollmentTopic)
	reserved := enroll(desk, course, "desk-fallback", http.StatusCreated, false)
	wantStatus("a desk enrollment while the broker refuses writes", reserved, "reserved")
	rec.record("enrollment_desk_fallback", workflows.EnrollmentDeskWorkflowID(0), reserved["run_id"].(string))
	removeFault()
	batchRun := batchRunOf(t, s, "desk-fallback-"+run)
	rec.record("enrollment_batch_confirmed", batchRun.WorkflowID, batchRun.RunID)
	if got := c.must("GET", "/v1/enrollments/"+reserved["id"].(string), nil, http.StatusOK); got["status"] != "confirmed" {
		t.Fatalf("the enrollment the batch run finished: %v", got)
	}

	// A batch the desk cannot list (search attribute values of 67 bytes):
	// turned away, the desk continues as new and its next run takes it.
	// The fast path tries the broker again once its last failure is
	// FailFastWindow old.
	time.Sleep(activities.FailFastWindow + 500*time.Millisecond)
	small := func(cfg *appconfig.Config) { cfg.ClaimBatchAttrBytes = appconfig.MinClaimBatchAttrBytes }
	desk = deskAPI(t, s, c, 10, small)
	other := secondAPI(t, s, c, func(cfg *appconfig.Config) { cfg.ClaimDesks, cfg.ClaimDeskBatches = 1, 10 }, small)
	// 12 and 61 bytes listed (with the run's suffix): together 73.
	first := enroll(desk, course, "df", http.StatusCreated, false)
	turned := enroll(other, course, "dg-"+strings.Repeat("x", 48), http.StatusCreated, false)
	if turned["run_id"] == first["run_id"] || turned["status"] != "confirmed" {
		t.Fatalf("a batch the desk could not list answered %v (the desk's run: %s)", turned, first["run_id"])
	}
	rec.record("enrollment_desk_full", workflows.EnrollmentDeskWorkflowID(0), first["run_id"].(string))

	// The broker refuses writes until every publish policy is spent: each
	// batch run hands its enrollment to a run of its own, which
	// dead-letters it; one is retried, one compensated, and one gets two
	// concurrent retries (the API takes one), a stale decision for its
	// first round, and a compensate of its second.
	desk = deskAPI(t, s, c, 10)
	removeFault = failProduces(t, s, workflows.EnrollmentTopic)
	parked := map[string]map[string]any{}
	for _, name := range []string{"handoff-retry", "handoff-compensate", "named"} {
		e := enroll(desk, course, name, http.StatusCreated, false)
		wantStatus(name, e, "reserved")
		parked[name] = e
	}
	deadLetters := map[string]map[string]any{}
	for name, e := range parked {
		deadLetters[name] = waitDeadLetter(t, c, e["id"].(string))
	}
	recordNamedDecisions(t, s, rec, c, deadLetters["named"], parked["named"]["id"].(string), removeFault)
	for _, name := range []string{"handoff-retry", "handoff-compensate"} {
		action := strings.TrimPrefix(name, "handoff-")
		c.must("POST", fmt.Sprintf("/v1/dead-letters/%v/%s", deadLetters[name]["id"], action), nil, http.StatusAccepted)
	}
	handed := batchRunOf(t, s, "handoff-retry-"+run)
	rec.record("enrollment_batch_handed_off", handed.WorkflowID, handed.RunID)
	for name, file := range map[string]string{
		"handoff-retry":      "enrollment_handed_off_dead_letter_retried",
		"handoff-compensate": "enrollment_handed_off_dead_letter_compensated",
	} {
		dl := deadLetters[name]
		rec.record(file, dl["workflow_id"].(string), dl["run_id"].(string))
		want := "confirmed"
		if strings.HasSuffix(name, "compensate") {
			want = "failed"
		}
		if got := c.must("GET", "/v1/enrollments/"+parked[name]["id"].(string), nil, http.StatusOK); got["status"] != want {
			t.Fatalf("%s after the operator's decision: %v, want %s", name, got, want)
		}
	}

	// A reservation whose desk task was lost (written here as a desk writes
	// it, two minutes old): the recovery starts its batch's run, which
	// publishes and confirms it.
	stranded := "stranded-" + run
	ctx := context.Background()
	tx, err := s.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `
		INSERT INTO enrollments (id, course_id, student_id, status, workflow_id, run_id, requested_at, recorded_at, batch_id, occurred_at)
		VALUES ($1, $2, $3, 'reserved', 'enrollment-desk:0', 'lost', now() - interval '2 minutes', now() - interval '2 minutes', $4, now() - interval '2 minutes')`,
		stranded, course, stranded, "lost-batch-"+run); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `UPDATE courses SET enrolled = enrolled + 1 WHERE id = $1`, course); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	recovery, err := s.Client.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: "recover-" + run, TaskQueue: workflows.TaskQueue},
		workflows.RecoverReservations, workflows.RecoverReservationsInput{OlderThan: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	var recovered workflows.RecoveryState
	if err := recovery.Get(ctx, &recovered); err != nil || !slices.Equal(recovered.Started, []string{"lost-batch-" + run}) {
		t.Fatalf("the recovery: %+v, %v; want the lost batch's run started", recovered, err)
	}
	rec.record("recover_reservations", recovery.GetID(), recovery.GetRunID())
	waitFor(t, 30*time.Second, "the stranded reservation confirmed", func() bool {
		_, got, _ := c.do("GET", "/v1/enrollments/"+stranded, nil)
		return got["status"] == "confirmed"
	})

	toCancel := c.must("POST", "/v1/courses/"+course+"/enrollments?wait=confirmed",
		map[string]any{"student_id": "cancel-" + run}, http.StatusCreated)
	wantStatus("an enrollment waited for", toCancel, "confirmed")
	cancelled := c.must("DELETE", "/v1/enrollments/"+toCancel["id"].(string), nil, http.StatusOK)
	wantStatus("a cancellation", cancelled, "cancelled")
	rec.record("cancellation_cancelled", workflows.CancellationWorkflowID(toCancel["id"].(string)), "")

	// Coupons: issue, use, and each way a use can end.
	vendorID := "rec-" + run
	c.must("POST", "/v1/vendors", map[string]any{"id": vendorID, "name": "Recorded Vendor"}, http.StatusCreated)
	typeID := "rec-" + run
	c.must("POST", "/v1/coupon-types", map[string]any{"id": typeID, "vendor_id": vendorID, "name": "recorded",
		"stock": 50, "payout_cents": 250}, http.StatusCreated)
	issued := 0
	issue := func(user string) string {
		t.Helper()
		k := c.must("POST", "/v1/coupon-types/"+typeID+"/coupons", map[string]any{"user_id": user}, http.StatusCreated)
		// The issue run publishes coupon.issued after it answered: it must
		// be out before a fault on the coupon topic meets it.
		if issued++; issued == 1 {
			rec.record("coupon_issue_issued", k["workflow_id"].(string), k["run_id"].(string))
		} else {
			rec.closed(k["workflow_id"].(string), k["run_id"].(string))
		}
		return k["id"].(string)
	}
	use := func(couponID, user string, want int) map[string]any {
		t.Helper()
		return c.must("POST", "/v1/coupons/"+couponID+"/use", map[string]any{"user_id": user}, want)
	}
	uses := []struct {
		file  string
		mode  payoutsim.Mode
		count int
		want  int
		code  string
	}{
		{"coupon_use_used", payoutsim.Accept, 0, http.StatusOK, ""},
		{"coupon_use_payout_declined", payoutsim.Decline, 1, http.StatusPaymentRequired, "payout_declined"},
		{"coupon_use_5xx_retried", payoutsim.Fail, 2, http.StatusOK, ""},
		{"coupon_use_response_lost", payoutsim.TimeoutAfterProcessing, 1, http.StatusOK, ""},
		{"coupon_use_payout_failed", payoutsim.Fail, 4, http.StatusBadGateway, "payout_failed"},
	}
	for _, u := range uses {
		user := strings.TrimPrefix(u.file, "coupon_use_")
		couponID := issue(user)
		setPayoutMode(t, s, u.mode, u.count)
		got := use(couponID, user, u.want)
		if errorCode(got) != u.code {
			t.Fatalf("%s: use answered %v", u.file, got)
		}
		rec.record(u.file, workflows.UseCouponWorkflowID(couponID), "")
	}
	setPayoutMode(t, s, payoutsim.Accept, 0)

	couponID := issue("dead-letter")
	removeFault = failProduces(t, s, workflows.CouponTopic)
	got := use(couponID, "dead-letter", http.StatusOK)
	eventID := workflows.EventID(got["payout"].(map[string]any)["idempotency_key"].(string), workflows.EventCouponUsed)
	dl := openDeadLetter(t, c, eventID, func(d map[string]any) bool { return d["event_id"] == eventID })
	removeFault()
	c.must("POST", fmt.Sprintf("/v1/dead-letters/%v/retry", dl["id"]), nil, http.StatusAccepted)
	rec.record("coupon_use_dead_letter_retried", dl["workflow_id"].(string), dl["run_id"].(string))

	// The starter's update reaching the run only after its use: the run
	// waited for it and answered it used.
	late := issue("starter-late")
	if _, d := useWithLateStarter(t, s, c, late, "starter-late"); d.Status != workflows.CouponUsed {
		t.Fatalf("the late starter's update answered %+v", d)
	}
	rec.record("coupon_use_starter_late", workflows.UseCouponWorkflowID(late), "")
	// The same for an issue: the run decided before its starter's update
	// came, waited for it (a timer) and answered it issued.
	lateRun, _, d := issueWithLateStarter(t, s, c, typeID, "issue-starter-late")
	if d.Status != workflows.CouponIssued {
		t.Fatalf("the late starter's update of an issue answered %+v", d)
	}
	rec.record("coupon_issue_starter_late", workflows.IssueCouponWorkflowID(typeID, "issue-starter-late"), lateRun.GetRunID())

	// DeliverEvent, on a topic of its own read by a consumer of its own so
	// that the stack's consumer does not interfere: one event the webhook
	// refuses twice (delivered by the run within its policy), two it refuses
	// until the operator acts (one retried, one discarded).
	topic := consumerTopic(t, s, "record", 1)
	events := testEvents("rec-"+run, 3, 3)
	startTestConsumer(t, s, topic, topic+".group", 0)
	setSink(t, s, notifysim.Setting{Mode: notifysim.Failing, EventIDs: []string{events[0].Event.ID}, Attempts: 2})
	produce(t, s, topic, events[:1])
	rec.record("deliver_event_delivered", workflows.DeliverEventWorkflowID(events[0].Event.ID), "")

	setSink(t, s, notifysim.Setting{Mode: notifysim.Failing, EventIDs: []string{events[1].Event.ID, events[2].Event.ID}})
	produce(t, s, topic, events[1:])
	parkedEvents := map[string]map[string]any{}
	for _, e := range events[1:] {
		id := e.Event.ID
		parkedEvents[id] = openDeadLetter(t, c, id, func(d map[string]any) bool { return d["event_id"] == id && d["stage"] == "consume" })
	}
	setSink(t, s, notifysim.Setting{Mode: notifysim.Healthy})
	c.must("POST", fmt.Sprintf("/v1/dead-letters/%v/retry", parkedEvents[events[1].Event.ID]["id"]), nil, http.StatusAccepted)
	c.must("POST", fmt.Sprintf("/v1/dead-letters/%v/compensate", parkedEvents[events[2].Event.ID]["id"]), nil, http.StatusAccepted)
	rec.record("deliver_event_dead_letter_retried", workflows.DeliverEventWorkflowID(events[1].Event.ID), "")
	rec.record("deliver_event_dead_letter_discarded", workflows.DeliverEventWorkflowID(events[2].Event.ID), "")

	// Nothing was left parked: every run the recording started is closed
	// (but the desk, which stays).
	waitFor(t, time.Minute, "every run closed", heldFor(time.Second, func() bool {
		resp, err := s.Client.CountWorkflow(context.Background(), &workflowservice.CountWorkflowExecutionsRequest{
			Namespace: s.Config.Namespace, Query: "ExecutionStatus = 'Running' AND WorkflowType != 'EnrollmentDesk'",
		})
		return err == nil && resp.Count == 0
	}))

	// The helper the integration tests' cleanups call replays every run
	// this recording left, fixtures or not.
	if n := replayRunsOf(t, s, ""); n < len(rec.written) {
		t.Errorf("replayRunsOf replayed %d closed runs; the recorder alone closed %d", n, len(rec.written))
	}
	t.Logf("recorded %d histories in %s: %s", len(rec.written), recordDir, strings.Join(rec.written, ", "))
}

// TestRecordWaitlistHistories records the waitlist's paths (scripts/
// record-histories runs it with TestRecordHistories): a cancellation that
// freed a seat and started a promotion, the promotion, the promoted
// enrollment's run, a cancellation that only left the queue, and a
// promotion started by a capacity raise.
func TestRecordWaitlistHistories(t *testing.T) {
	s, rec, c := startRecording(t)
	run := fmt.Sprintf("%d", time.Now().UnixNano()%1_000_000)
	course := "recwl-" + run
	c.must("POST", "/v1/courses", map[string]any{"id": course, "title": "Recorded waitlist", "capacity": 1}, http.StatusCreated)
	held := c.must("POST", "/v1/courses/"+course+"/enrollments?wait=confirmed", map[string]any{"student_id": "held-" + run}, http.StatusCreated)
	wait := func(who string) map[string]any {
		t.Helper()
		got := c.must("POST", "/v1/courses/"+course+"/enrollments", map[string]any{"student_id": who + "-" + run, "waitlist": true}, http.StatusAccepted)
		if got["status"] != "waitlisted" {
			t.Fatalf("%s answered %v", who, got)
		}
		return got
	}
	// Two places per seat (WAITLIST_PER_SEAT): w1 and w2; w2 leaves, w3 takes the place.
	waiting := []map[string]any{wait("w1"), wait("w2")}
	c.must("DELETE", "/v1/enrollments/"+waiting[1]["id"].(string), nil, http.StatusOK)
	rec.record("cancellation_left_waitlist", workflows.CancellationWorkflowID(waiting[1]["id"].(string)), "")
	wait("w3")

	// The holder cancels: w1 is promoted through its own run.
	heldID := held["id"].(string)
	c.must("DELETE", "/v1/enrollments/"+heldID, nil, http.StatusOK)
	rec.record("cancellation_promoted", workflows.CancellationWorkflowID(heldID), "")
	rec.record("promotion_promoted", workflows.PromotionWorkflowID(course, heldID+":cancelled"), "")
	w1 := workflows.EnrollmentInput{EnrollmentID: waiting[0]["id"].(string), CourseID: course, StudentID: "w1-" + run}
	rec.record("enrollment_promoted_confirmed", workflows.EnrollmentWorkflowID(w1), "")

	// A capacity raise promotes w3.
	c.must("PATCH", "/v1/courses/"+course, map[string]any{"capacity": 2}, http.StatusOK)
	var raised []runRef
	waitFor(t, time.Minute, "the capacity raise's promotion", func() bool {
		var err error
		raised, err = listRuns(context.Background(), s.Client, s.Config.Namespace,
			fmt.Sprintf("WorkflowType = 'Promotion' AND CourseId = '%s' AND WorkflowId STARTS_WITH 'promotion:%s:capacity-'", course, course), 2)
		return err == nil && len(raised) == 1
	})
	rec.record("promotion_capacity_raised", raised[0].WorkflowID, raised[0].RunID)
	t.Logf("recorded %d waitlist histories: %v", len(rec.written), rec.written)
}
