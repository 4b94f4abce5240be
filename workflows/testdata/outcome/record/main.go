// record runs EnrollmentBatch (fast, durable, hand-off) and DeliverEvent
// against a fresh Temporal dev server with fake activities, counts the
// server's visibility-store requests per kind of run, and writes histories.
package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/claimflow/claimflow/workflows"
)

const port, metricsPort = 17233, 17299

func main() {
	out := os.Args[1]
	_ = os.MkdirAll(out, 0o755)
	args := []string{"server", "start-dev", "--headless", "--ip", "127.0.0.1", "--port", fmt.Sprint(port), "--ui-port", "17234",
		"--metrics-port", fmt.Sprint(metricsPort), "--log-level", "error"}
	for k, v := range map[string]string{"CourseId": "KeywordList", "StudentId": "KeywordList", "RefusedStudentIds": "KeywordList",
		"ClaimStatus": "Keyword", "CouponId": "Keyword", "CouponTypeId": "Keyword", "VendorId": "Keyword"} {
		args = append(args, "--search-attribute", k+"="+v)
	}
	srv := exec.Command(os.Getenv("TEMPORAL_CLI"), args...)
	srv.Stdout, srv.Stderr = os.Stderr, os.Stderr
	must(srv.Start())
	defer func() { _ = srv.Process.Kill(); _ = srv.Wait() }()
	var c client.Client
	var err error
	for i := 0; i < 100; i++ {
		if c, err = client.Dial(client.Options{HostPort: fmt.Sprintf("127.0.0.1:%d", port)}); err == nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	must(err)
	w := worker.New(c, workflows.TaskQueue, worker.Options{})
	w.RegisterWorkflow(workflows.EnrollmentBatch)
	w.RegisterWorkflow(workflows.Enrollment)
	w.RegisterWorkflow(workflows.DeliverEvent)
	reg := func(name string, fn any) { w.RegisterActivityWithOptions(fn, activity.RegisterOptions{Name: name}) }
	reg("ReserveSeats", func(_ context.Context, in workflows.ReserveSeatsInput) (workflows.ReserveSeatsResult, error) {
		var r workflows.ReserveSeatsResult
		for _, cl := range in.Claims {
			d := workflows.Decision{EnrollmentID: cl.EnrollmentID, Status: workflows.StatusReserved}
			if strings.HasPrefix(cl.StudentID, "r") {
				d.Status, d.Refusal, d.Message = workflows.StatusRefused, workflows.RefusalCourseFull, "full"
			}
			r.Decisions = append(r.Decisions, d)
		}
		return r, nil
	})
	reg("PublishBatch", func(_ context.Context, in workflows.PublishBatchInput) error {
		id := in.EnrollmentIDs[0]
		if strings.HasPrefix(id, "handoff") || (strings.HasPrefix(id, "durable") && in.FailFast) {
			return errors.New("broker down")
		}
		return nil
	})
	reg("ConfirmBatch", func(context.Context, []string) error { return nil })
	reg("ReleaseSeats", func(context.Context, []string) error { return nil })
	reg("Publish", func(context.Context, workflows.PublishInput) error {
		return temporal.NewNonRetryableApplicationError("broker down", "x", nil)
	})
	reg("RecordDeadLetter", func(context.Context, workflows.DeadLetterInput) (workflows.DeadLetterRecord, error) {
		return workflows.DeadLetterRecord{ID: 1}, nil
	})
	reg("ResolveDeadLetter", func(context.Context, workflows.ResolveDeadLetterInput) error { return nil })
	reg("MarkConfirmed", func(context.Context, string) error { return nil })
	reg("ReleaseSeat", func(context.Context, workflows.ReleaseSeatInput) error { return nil })
	reg("DeliverNotification", func(context.Context, workflows.DeliverNotificationInput) (workflows.DeliverNotificationResult, error) {
		return workflows.DeliverNotificationResult{Attempts: 2}, nil
	})
	reg("RecordConsumeDeadLetter", func(context.Context, workflows.ConsumeDeadLetterInput) (workflows.DeadLetterRecord, error) {
		return workflows.DeadLetterRecord{ID: 2}, nil
	})
	must(w.Start())
	defer w.Stop()
	ctx := context.Background()

	batch := func(kind string, n int) string {
		var claims []workflows.EnrollmentInput
		var students, courses []string
		for i := 0; i < 4; i++ {
			st := fmt.Sprintf("s-%s-%d-%d", kind, n, i)
			if i == 3 {
				st = fmt.Sprintf("r-%s-%d", kind, n)
			}
			course := []string{"cs101", "ma201"}[i%2]
			claims = append(claims, workflows.EnrollmentInput{EnrollmentID: fmt.Sprintf("%s-%d-%d", kind, n, i), CourseID: course, StudentID: st, RequestedAt: time.Now()})
			students = append(students, st)
			if !contains(courses, course) {
				courses = append(courses, course)
			}
		}
		in := workflows.EnrollmentBatchInput{BatchID: fmt.Sprintf("%s-%d", kind, n), Claims: claims, ConfirmBeforeAnswer: true}
		id := workflows.EnrollmentBatchWorkflowID(in.BatchID)
		start := c.NewWithStartWorkflowOperation(client.StartWorkflowOptions{ID: id, TaskQueue: workflows.TaskQueue, WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_FAIL,
			TypedSearchAttributes: temporal.NewSearchAttributes(workflows.SearchCourseID.ValueSet(courses),
				workflows.SearchStudentID.ValueSet(students), workflows.SearchClaimStatus.ValueSet("pending"))}, workflows.EnrollmentBatch, in)
		h, err := c.UpdateWithStartWorkflow(ctx, client.UpdateWithStartWorkflowOptions{StartWorkflowOperation: start,
			UpdateOptions: client.UpdateWorkflowOptions{UpdateName: workflows.UpdateDecision, WaitForStage: client.WorkflowUpdateStageCompleted}})
		must(err)
		var d []workflows.Decision
		must(h.Get(ctx, &d))
		must(c.GetWorkflow(ctx, id, "").Get(ctx, nil))
		return id
	}
	deliver := func(n int) string {
		id := workflows.DeliverEventWorkflowID(fmt.Sprintf("evt-%d", n))
		r, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: workflows.TaskQueue}, workflows.DeliverEvent,
			workflows.DeliverEventInput{Event: workflows.ConsumedEvent{Topic: "enrollment.events", EventID: fmt.Sprintf("evt-%d", n), Value: "{}"}, InlineError: "sink 503"})
		must(err)
		must(r.Get(ctx, nil))
		return id
	}
	phase := func(name string, n int, run func(i int) string) {
		before := scrape()
		var ids []string
		for i := 0; i < n; i++ {
			ids = append(ids, run(i))
		}
		time.Sleep(3 * time.Second) // let the visibility queue drain
		after := scrape()
		fmt.Printf("%-10s runs=%d", name, n)
		for _, k := range keys(after) {
			if d := after[k] - before[k]; d != 0 {
				fmt.Printf("  %s=%.0f", k, d)
			}
		}
		fmt.Println()
		dump(c, out, name, ids[0])
	}
	phase("fast", 10, func(i int) string { return batch("fast", i) })
	phase("durable", 3, func(i int) string { return batch("durable", i) })
	phase("handoff", 2, func(i int) string { return batch("handoff", i) })
	phase("deliver", 3, deliver)
	// A fourth KeywordList on SQL visibility?
	cmd := exec.Command(os.Getenv("TEMPORAL_CLI"), "operator", "search-attribute", "create", "--address", fmt.Sprintf("127.0.0.1:%d", port),
		"--name", "ConfirmedStudentIds", "--type", "KeywordList")
	b, err := cmd.CombinedOutput()
	fmt.Printf("create a 4th KeywordList: err=%v %s\n", err, strings.TrimSpace(string(b)))
}

func dump(c client.Client, dir, name, id string) {
	it := c.GetWorkflowHistory(context.Background(), id, "", false, 0)
	var h historypb.History
	for it.HasNext() {
		e, err := it.Next()
		must(err)
		h.Events = append(h.Events, e)
	}
	b, err := protojson.MarshalOptions{Indent: "  "}.Marshal(&h)
	must(err)
	must(os.WriteFile(filepath.Join(dir, name+".json"), b, 0o644))
	var types []string
	for _, e := range h.Events {
		types = append(types, strings.TrimPrefix(e.EventType.String(), "EVENT_TYPE_"))
	}
	fmt.Printf("  %s history: %s\n", name, strings.Join(types, " "))
}

// scrape sums the visibility persistence requests by operation.
func scrape() map[string]float64 {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort))
	must(err)
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, "visibility_persistence_requests{") {
			continue
		}
		i := strings.Index(l, `operation="`)
		if i < 0 {
			continue
		}
		op := l[i+11:]
		op = op[:strings.Index(op, `"`)]
		var v float64
		fmt.Sscanf(l[strings.LastIndex(l, " ")+1:], "%g", &v)
		out[op] += v
	}
	return out
}

func keys(m map[string]float64) []string {
	var k []string
	for x := range m {
		k = append(k, x)
	}
	return k
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}
