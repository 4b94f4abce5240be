package main

// Two API processes and two worker processes on one stack (issue 11): the
// guards that keep a course from overselling, a coupon type from issuing
// beyond its stock or twice to one user, and a coupon from being used or
// paid twice must hold when the claims arrive through different processes
// at once. Within one API process the batcher and the per-type and
// per-coupon gates already serialize much of the work, so only a second
// process makes the database and the workflows the last line.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/workflowservice/v1"

	"github.com/claimflow/claimflow/cmd/internal/services"
	"github.com/claimflow/claimflow/dev/devstack"
	"github.com/claimflow/claimflow/workflows"
)

// replica is a `claimflow api` or `claimflow worker` child process of the
// test, killed at cleanup; its log is printed when the test failed.
type replica struct {
	name   string
	cmd    *exec.Cmd
	log    string
	exited chan struct{} // closed once the process is gone
}

// startReplica runs the built binary with args against the stack's
// infrastructure. The environment is built from scratch so that variables
// of the shell running the tests (CLAIM_DESKS, LOG_LEVEL...) cannot change
// what the replicas do.
func startReplica(t *testing.T, s *stack, name string, args []string, extraEnv ...string) *replica {
	t.Helper()
	logFile := filepath.Join(s.Options.DataDir, "logs", name+".log")
	f, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(claimflowBinary(t), args...)
	cmd.Env = append([]string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"),
		"DATABASE_URL=" + s.Config.DatabaseURL,
		"TEMPORAL_ADDRESS=" + s.Config.TemporalAddress,
		"TEMPORAL_NAMESPACE=" + s.Config.Namespace,
		"KAFKA_BROKERS=" + strings.Join(s.Config.KafkaBrokers, ","),
		"KAFKA_VERSION=" + s.Config.KafkaVersion,
		"VENDOR_PAYOUT_URL=" + s.Config.PayoutURL,
		"NOTIFY_WEBHOOK_URL=" + s.Config.NotifyWebhookURL,
		"JWT_SECRET=" + s.Config.Security.JWTSecret,
		"EVENT_SIGNING_KEY=" + s.Config.EventSigningKey,
		// The dev server accepts larger search attribute values than
		// Temporal's default; the replicas batch as the in-process API would.
		"CLAIM_BATCH_ATTR_BYTES=" + strconv.Itoa(services.ClaimBatchAttrBytes),
		"LOG_FORMAT=text", "LOG_LEVEL=info",
	}, extraEnv...)
	cmd.Stdout, cmd.Stderr = f, f
	// A test binary killed by its timeout takes its replicas with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	_ = f.Close()
	r := &replica{name: name, cmd: cmd, log: logFile, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(r.exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-r.exited
		if t.Failed() {
			if b, err := os.ReadFile(logFile); err == nil {
				t.Logf("--- %s log (%s) ---\n%s", name, logFile, tail(b, 60))
			}
		}
	})
	return r
}

// alive fails the test with the replica's log if the process has exited.
func (r *replica) alive(t *testing.T) {
	t.Helper()
	select {
	case <-r.exited:
		b, _ := os.ReadFile(r.log)
		t.Fatalf("%s exited (%v):\n%s", r.name, r.cmd.ProcessState, tail(b, 40))
	default:
	}
}

// startAPIReplica starts `claimflow api` on a free port and returns a
// client of it once /readyz answers 200.
func startAPIReplica(t *testing.T, s *stack, name string) *apiClient {
	t.Helper()
	port, err := devstack.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	// The stack migrated the database already; two APIs migrating at once
	// is not what this test is about.
	r := startReplica(t, s, name, []string{"api", "-migrate=false"}, "HTTP_ADDR="+addr)
	token, err := mintToken(s.Config.Security.JWTSecret, "test-admin", "admin", 24*time.Hour)
	if err != nil {
		t.Fatalf("mint the test client's token: %v", err)
	}
	c := &apiClient{t: t, base: "http://" + addr, token: token, http: &http.Client{
		Timeout:   60 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: 256},
	}}
	waitFor(t, time.Minute, name+" ready", func() bool {
		r.alive(t)
		resp, err := c.http.Get(c.base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return c
}

// startWorkerReplicas starts n `claimflow worker` processes and waits until
// each polls both the workflow and the activity task queue, so that work is
// shared from the first claim on.
func startWorkerReplicas(t *testing.T, s *stack, n int) {
	t.Helper()
	var workers []*replica
	for i := range n {
		// A bounded number of activities keeps the pools of four processes
		// within the private cluster's default 100 connections.
		workers = append(workers, startReplica(t, s, fmt.Sprintf("worker-%d", i), []string{"worker"},
			"METRICS_ADDR=127.0.0.1:0", "WORKER_MAX_ACTIVITIES=16"))
	}
	pids := map[string]bool{}
	for _, w := range workers {
		pids[strconv.Itoa(w.cmd.Process.Pid)] = true
	}
	waitFor(t, time.Minute, fmt.Sprintf("%d worker processes polling", n), func() bool {
		for _, w := range workers {
			w.alive(t)
		}
		for _, tq := range []enumspb.TaskQueueType{enumspb.TASK_QUEUE_TYPE_WORKFLOW, enumspb.TASK_QUEUE_TYPE_ACTIVITY} {
			resp, err := s.Client.DescribeTaskQueue(context.Background(), workflows.TaskQueue, tq)
			if err != nil {
				return false
			}
			polling := map[string]bool{}
			for _, p := range resp.Pollers {
				// The SDK's default identity is "<pid>@<host>@".
				if pid, _, _ := strings.Cut(p.Identity, "@"); pids[pid] {
					polling[pid] = true
				}
			}
			if len(polling) < n {
				return false
			}
		}
		return true
	})
}

// reply is one answer of an API replica, with the header a 503 must carry.
type reply struct {
	api        int // which replica answered
	status     int
	body       map[string]any
	retryAfter string
	err        error
}

// send is apiClient.do that also keeps Retry-After.
func send(c *apiClient, api int, method, path string, body any) reply {
	r := reply{api: api}
	b, err := json.Marshal(body)
	if err != nil {
		r.err = err
		return r
	}
	req, err := http.NewRequest(method, c.base+path, bytes.NewReader(b))
	if err != nil {
		r.err = err
		return r
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := c.http.Do(req)
	if err != nil {
		r.err = fmt.Errorf("%s %s via api-%d: %w", method, path, api, err)
		return r
	}
	defer resp.Body.Close()
	r.status, r.retryAfter = resp.StatusCode, resp.Header.Get("Retry-After")
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		r.err = fmt.Errorf("read the answer to %s %s: %w", method, path, err)
		return r
	}
	r.body = map[string]any{}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &r.body); err != nil {
			r.err = fmt.Errorf("decode the answer to %s %s %q: %w", method, path, raw, err)
		}
	}
	return r
}

// burst sends n requests from concurrency clients, released together so that
// both replicas are busy with the same resource at the same time.
func burst(n, concurrency int, call func(i int) reply) ([]reply, time.Duration) {
	out := make([]reply, n)
	next := make(chan int, n)
	for i := range n {
		next <- i
	}
	close(next)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range concurrency {
		wg.Go(func() {
			<-start
			for i := range next {
				out[i] = call(i)
			}
		})
	}
	began := time.Now()
	close(start)
	wg.Wait()
	return out, time.Since(began)
}

// outcome names an answer "<status>" or "<status> <error code>" and fails the
// test for one not in allowed. A 503 is always allowed (temporalio/temporal#7741
// can leave an update to a run that several processes update at once
// unanswered until its deadline) but must tell the client when to retry.
func outcome(t *testing.T, what string, r reply, allowed ...string) string {
	t.Helper()
	if r.err != nil {
		t.Errorf("%s: %v", what, r.err)
		return "transport error"
	}
	key := strconv.Itoa(r.status)
	if code := errorCode(r.body); code != "" {
		key += " " + code
	}
	if r.status == http.StatusServiceUnavailable {
		if n, err := strconv.Atoi(r.retryAfter); err != nil || n < 1 {
			t.Errorf("%s: 503 via api-%d with Retry-After %q, want a number of seconds: %v", what, r.api, r.retryAfter, r.body)
		}
		return key
	}
	if r.status == http.StatusAccepted && r.body["status"] == "pending" {
		// Undecided within the wait (as a 503 was before): it must name
		// where the claim's outcome is read.
		if u, _ := r.body["status_url"].(string); u == "" {
			t.Errorf("%s: 202 via api-%d without a status_url: %v", what, r.api, r.body)
		}
		return key
	}
	if !slices.Contains(allowed, key) {
		t.Errorf("%s: api-%d answered %d %v, want one of %q or 503", what, r.api, r.status, r.body, allowed)
	}
	return key
}

// countOutcomes tallies outcome keys per replica, for the log.
type countOutcomes map[string][2]int

func (c countOutcomes) add(key string, api int) {
	n := c[key]
	n[api]++
	c[key] = n
}

func (c countOutcomes) total(key string) int { return c[key][0] + c[key][1] }

// unavailable counts the answers that left a claim's outcome open: 503,
// and the 202 of a claim not decided within the wait.
func (c countOutcomes) unavailable() int {
	n := 0
	for k := range c {
		if strings.HasPrefix(k, "503") || strings.HasPrefix(k, "202") {
			n += c.total(k)
		}
	}
	return n
}

func (c countOutcomes) String() string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "[%s: %d (api-0 %d, api-1 %d)] ", k, c.total(k), c[k][0], c[k][1])
	}
	return strings.TrimSpace(b.String())
}

// runningRuns counts open runs matching a visibility filter.
func runningRuns(t *testing.T, s *stack, filter string) int64 {
	t.Helper()
	resp, err := s.Client.CountWorkflow(context.Background(), &workflowservice.CountWorkflowExecutionsRequest{
		Namespace: s.Config.Namespace, Query: filter + " AND ExecutionStatus = 'Running'",
	})
	if err != nil {
		t.Fatalf("count runs (%s): %v", filter, err)
	}
	return resp.Count
}

// waitSettled waits until no run matching filter is open, for a while in a
// row: visibility is written asynchronously, and a run a 503 left behind
// may still be deciding. Only then are the counts below final.
func waitSettled(t *testing.T, s *stack, filter string) {
	t.Helper()
	waitFor(t, 3*time.Minute, "no open run with "+filter, heldFor(2*time.Second, func() bool {
		return runningRuns(t, s, filter) == 0
	}))
}

func queryInt(t *testing.T, s *stack, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := s.Pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func queryStrings(t *testing.T, s *stack, sql string, args ...any) []string {
	t.Helper()
	rows, err := s.Pool.Query(context.Background(), sql, args...)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestTwoAPIsTwoWorkers(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test: starts the real stack and four claimflow processes; skipped with -short")
	}
	began := time.Now()
	o := testStackOptions(t, dataDir(t))
	// Only the infrastructure in this process; API and worker run as two
	// processes each below. No consumer: notifications are not under test.
	o.NoAPI, o.NoWorker, o.NoConsumer = true, true, true
	s := startTestStack(t, o)
	if s.Payout == nil {
		t.Fatal("the stack did not start the payout simulator")
	}
	startWorkerReplicas(t, s, 2)
	// Two APIs send their batches to the same desks: their batches meet
	// in the desks' workflow tasks and on the courses' rows.
	apis := []*apiClient{
		startAPIReplica(t, s, "api-0"),
		startAPIReplica(t, s, "api-1"),
	}
	t.Logf("stack, 2 workers and 2 APIs up in %s", time.Since(began).Round(time.Millisecond))
	// IDs unique to this run, for a real Kafka broker shared between runs.
	run := fmt.Sprintf("%d", time.Now().UnixNano()%1_000_000)

	// Every scenario is set up first, then all are driven at the same
	// moment (not as parallel subtests: -parallel defaults to GOMAXPROCS,
	// which would run them two at a time on a small machine), then checked.
	scenarios := []struct {
		name    string
		prepare func(t *testing.T, s *stack, apis []*apiClient, run string) (drive func(), check func(t *testing.T))
	}{
		{"enrollments never oversell", twoAPIsEnroll},
		{"coupon issue never beyond stock nor twice to a user", twoAPIsIssue},
		{"coupon use once, paid once", twoAPIsUse},
	}
	drives := make([]func(), len(scenarios))
	checks := make([]func(t *testing.T), len(scenarios))
	for i, sc := range scenarios {
		drives[i], checks[i] = sc.prepare(t, s, apis, run)
	}
	driving := time.Now()
	var wg sync.WaitGroup
	for _, drive := range drives {
		wg.Go(drive)
	}
	wg.Wait()
	t.Logf("all scenarios driven at once in %s", time.Since(driving).Round(time.Millisecond))
	for i, sc := range scenarios {
		t.Run(sc.name, checks[i])
	}
	t.Logf("whole test took %s", time.Since(began).Round(time.Millisecond))
}

// twoAPIsEnroll: 300 students, alternating between the replicas, rush a
// course of 25 seats.
func twoAPIsEnroll(t *testing.T, s *stack, apis []*apiClient, run string) (drive func(), check func(t *testing.T)) {
	const students, capacity, concurrency = 300, 25, 64
	courseID := "rep-" + run
	apis[0].must("POST", "/v1/courses", map[string]any{"id": courseID, "title": "Two replicas", "capacity": capacity}, http.StatusCreated)
	var replies []reply
	var took time.Duration
	drive = func() {
		replies, took = burst(students, concurrency, func(i int) reply {
			return send(apis[i%2], i%2, "POST", "/v1/courses/"+courseID+"/enrollments", map[string]any{"student_id": fmt.Sprintf("s-%03d", i)})
		})
	}
	return drive, func(t *testing.T) { checkEnroll(t, s, courseID, capacity, replies, took) }
}

func checkEnroll(t *testing.T, s *stack, courseID string, capacity int, replies []reply, took time.Duration) {
	students := len(replies)
	counts := countOutcomes{}
	accepted := map[string]bool{}
	for i, r := range replies {
		key := outcome(t, fmt.Sprintf("student %d", i), r, "201", "409 course_full")
		counts.add(key, r.api)
		if key == "201" {
			id, _ := r.body["id"].(string)
			if id == "" || accepted[id] {
				t.Errorf("student %d: 201 with enrollment id %q (empty or given twice)", i, id)
			}
			accepted[id] = true
		}
	}
	unavailable := counts.unavailable()
	t.Logf("%d enrollments through 2 APIs in %s: %s", students, took.Round(time.Millisecond), counts)
	switch {
	case counts.total("201") > capacity:
		t.Fatalf("oversold: %d enrollments accepted for %d seats", counts.total("201"), capacity)
	case unavailable == 0 && (counts.total("201") != capacity || counts.total("409 course_full") != students-capacity):
		t.Fatalf("accepted %d, course_full %d; want %d and %d", counts.total("201"), counts.total("409 course_full"), capacity, students-capacity)
	case counts.total("409 course_full") == 0:
		t.Fatalf("no course_full answer: the seats were never all taken, nothing was contended")
	}

	// A 503 may have left its run deciding: count only once every run is closed.
	waitSettled(t, s, fmt.Sprintf("CourseId = '%s'", courseID))
	if n := queryInt(t, s, `SELECT count(*) FROM enrollments WHERE course_id = $1 AND status = 'reserved'`, courseID); n != 0 {
		t.Errorf("%d enrollments still reserved after every run closed", n)
	}
	confirmed := queryStrings(t, s, `SELECT id FROM enrollments WHERE course_id = $1 AND status = 'confirmed'`, courseID)
	enrolled := queryInt(t, s, `SELECT enrolled FROM courses WHERE id = $1`, courseID)
	// A course_full answer means every seat was taken at that moment, and
	// nothing here gives a seat back: the course ends exactly full.
	if len(confirmed) != capacity || enrolled != capacity {
		t.Fatalf("courses.enrolled = %d and %d confirmed enrollments, want both %d", enrolled, len(confirmed), capacity)
	}
	if n := queryInt(t, s, `SELECT count(*) FROM (SELECT student_id FROM enrollments WHERE course_id = $1
		AND status IN ('reserved', 'confirmed', 'dead_lettered') GROUP BY student_id HAVING count(*) > 1) d`, courseID); n != 0 {
		t.Errorf("%d students hold more than one seat", n)
	}
	isConfirmed := map[string]bool{}
	for _, id := range confirmed {
		isConfirmed[id] = true
	}
	for id := range accepted {
		if !isConfirmed[id] {
			t.Errorf("enrollment %s was answered 201 but is not confirmed", id)
		}
	}

	// One enrollment.confirmed event per confirmed enrollment, none for others.
	var events map[string]int
	waitFor(t, time.Minute, fmt.Sprintf("%d enrollment.confirmed events", capacity), func() bool {
		var ofCourse []workflows.Event
		for _, e := range topicEvents(t, s, workflows.EnrollmentTopic) {
			if e.Data["course_id"] == courseID {
				ofCourse = append(ofCourse, e)
			}
		}
		events = eventsFor(ofCourse, workflows.EventEnrollmentConfirmed)
		return len(events) >= capacity
	})
	for id, n := range events {
		switch {
		case !isConfirmed[id]:
			t.Errorf("enrollment.confirmed event for %s, which is not a confirmed enrollment", id)
		case n != 1:
			t.Errorf("enrollment %s has %d enrollment.confirmed events, want 1", id, n)
		}
	}
	for _, id := range confirmed {
		if events[id] == 0 {
			t.Errorf("confirmed enrollment %s has no enrollment.confirmed event", id)
		}
	}
	t.Logf("course %s: %d seats, %d confirmed, %d answered 201, %d answered 503 (Retry-After on each)",
		courseID, enrolled, len(confirmed), len(accepted), unavailable)
}

// twoAPIsIssue: 200 users each claim a coupon of a type with a stock of 20
// twice at once, once through each replica.
func twoAPIsIssue(t *testing.T, s *stack, apis []*apiClient, run string) (drive func(), check func(t *testing.T)) {
	const users, stock, concurrency = 200, 20, 64
	vendorID, typeID := "rep-issue-"+run, "rep-hot-"+run
	apis[0].must("POST", "/v1/vendors", map[string]any{"id": vendorID, "name": "Replicas issue"}, http.StatusCreated)
	apis[1].must("POST", "/v1/coupon-types", map[string]any{"id": typeID, "vendor_id": vendorID, "name": "hot",
		"stock": stock, "payout_cents": 100}, http.StatusCreated)
	var replies []reply
	var took time.Duration
	drive = func() {
		// Requests 2u and 2u+1 are user u's two claims, next to each other
		// and to different processes; even users go to api-0 first, odd ones
		// to api-1, so that distinct users' runs start from both processes
		// and meet at the stock in the database.
		replies, took = burst(2*users, concurrency, func(i int) reply {
			api := (i/2 + i%2) % 2
			return send(apis[api], api, "POST", "/v1/coupon-types/"+typeID+"/coupons", map[string]any{"user_id": fmt.Sprintf("u-%03d", i/2)})
		})
	}
	return drive, func(t *testing.T) { checkIssue(t, s, typeID, stock, replies, took) }
}

func checkIssue(t *testing.T, s *stack, typeID string, stock int, replies []reply, took time.Duration) {
	users := len(replies) / 2
	counts := countOutcomes{}
	holds := map[string]string{} // user → the coupon an answer says it holds
	issuedTo := map[string]string{}
	for i, r := range replies {
		user := fmt.Sprintf("u-%03d", i/2)
		key := outcome(t, fmt.Sprintf("claim %d of %s", i%2, user), r, "201", "409 sold_out", "409 already_issued")
		counts.add(key, r.api)
		var id string
		switch key {
		case "201":
			id, _ = r.body["id"].(string)
			if prev, ok := issuedTo[user]; ok {
				t.Errorf("user %s answered 201 twice: coupons %s and %s", user, prev, id)
			}
			issuedTo[user] = id
		case "409 already_issued":
			if id, _ = r.body["coupon_id"].(string); id == "" {
				continue // told it holds one, not which: nothing to compare
			}
		default:
			continue
		}
		if prev, ok := holds[user]; ok && prev != id {
			t.Errorf("user %s was told of two coupons: %s and %s", user, prev, id)
		}
		holds[user] = id
	}
	unavailable := counts.unavailable()
	t.Logf("%d claims (%d users × 2 APIs) in %s: %s", 2*users, users, took.Round(time.Millisecond), counts)
	switch {
	case len(issuedTo) > stock:
		t.Fatalf("issued beyond the stock: %d users answered 201 for a stock of %d", len(issuedTo), stock)
	case unavailable == 0 && len(issuedTo) != stock:
		t.Fatalf("%d users answered 201, want the stock of %d", len(issuedTo), stock)
	case counts.total("409 sold_out") == 0:
		t.Fatalf("no sold_out answer: the stock was never used up, nothing was contended")
	}

	waitSettled(t, s, fmt.Sprintf("CouponTypeId = '%s'", typeID))
	issued := queryInt(t, s, `SELECT issued FROM coupon_types WHERE id = $1`, typeID)
	rows := queryStrings(t, s, `SELECT id FROM coupons WHERE type_id = $1 AND status <> 'revoked'`, typeID)
	if issued != stock || len(rows) != stock {
		t.Fatalf("coupon_types.issued = %d and %d coupons, want both %d", issued, len(rows), stock)
	}
	if n := queryInt(t, s, `SELECT count(*) FROM (SELECT user_id FROM coupons WHERE type_id = $1
		GROUP BY user_id HAVING count(*) > 1) d`, typeID); n != 0 {
		t.Errorf("%d users hold more than one coupon of the type", n)
	}
	inDB := map[string]bool{}
	for _, id := range rows {
		inDB[id] = true
	}
	for user, id := range holds {
		if !inDB[id] {
			t.Errorf("user %s was told of coupon %s, which is not in the database", user, id)
		}
	}

	var events map[string]int
	waitFor(t, time.Minute, fmt.Sprintf("%d coupon.issued events", stock), func() bool {
		var ofType []workflows.Event
		for _, e := range couponEvents(t, s, workflows.CouponTopic) {
			if e.Data["coupon_type_id"] == typeID {
				ofType = append(ofType, e)
			}
		}
		events = couponEventsOf(ofType, workflows.EventCouponIssued)
		return len(events) >= stock
	})
	for id, n := range events {
		switch {
		case !inDB[id]:
			t.Errorf("coupon.issued event for %s, which is not an issued coupon of the type", id)
		case n != 1:
			t.Errorf("coupon %s has %d coupon.issued events, want 1", id, n)
		}
	}
	// Runs refused sold_out got past both APIs' gates to the database's
	// guard: the measure of how hard it was contended.
	soldOutRuns, err := s.Client.CountWorkflow(context.Background(), &workflowservice.CountWorkflowExecutionsRequest{
		Namespace: s.Config.Namespace, Query: fmt.Sprintf("CouponTypeId = '%s' AND ClaimStatus = 'sold_out'", typeID)})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("type %s: stock %d, issued %d, %d users answered 201, %d answered 503 (Retry-After on each); %d runs refused sold_out by the database",
		typeID, stock, issued, len(issuedTo), unavailable, soldOutRuns.Count)
}

// twoAPIsUse: the owners of 8 coupons each try to use theirs 10 times at
// once, alternating between the replicas. Within one process uses of a
// coupon take turns; across processes they meet in the coupon's one run.
func twoAPIsUse(t *testing.T, s *stack, apis []*apiClient, run string) (drive func(), check func(t *testing.T)) {
	const coupons, usesEach, payoutCents = 8, 10, 375
	vendorID, typeID := "rep-use-"+run, "rep-use-"+run
	apis[0].must("POST", "/v1/vendors", map[string]any{"id": vendorID, "name": "Replicas use"}, http.StatusCreated)
	apis[1].must("POST", "/v1/coupon-types", map[string]any{"id": typeID, "vendor_id": vendorID, "name": "use",
		"stock": coupons, "payout_cents": payoutCents}, http.StatusCreated)
	ids := make([]string, coupons)
	owner := func(k int) string { return fmt.Sprintf("owner-%d", k) }
	for k := range coupons {
		got := apis[k%2].must("POST", "/v1/coupon-types/"+typeID+"/coupons", map[string]any{"user_id": owner(k)}, http.StatusCreated)
		ids[k] = got["id"].(string)
	}

	var replies []reply
	var took time.Duration
	drive = func() {
		// Request i uses coupon i%coupons through replica (i/coupons)%2, so
		// every coupon gets half its requests from each process.
		replies, took = burst(coupons*usesEach, coupons*usesEach, func(i int) reply {
			k, api := i%coupons, (i/coupons)%2
			return send(apis[api], api, "POST", "/v1/coupons/"+ids[k]+"/use",
				map[string]any{"user_id": owner(k), "order_id": fmt.Sprintf("o-%d-%d", k, i)})
		})
	}
	return drive, func(t *testing.T) {
		checkUse(t, s, apis, vendorID, typeID, ids, owner, payoutCents, usesEach, replies, took)
	}
}

func checkUse(t *testing.T, s *stack, apis []*apiClient, vendorID, typeID string, ids []string, owner func(int) string,
	payoutCents, usesEach int, replies []reply, took time.Duration) {
	coupons := len(ids)
	counts := countOutcomes{}
	usedBy := map[string]string{} // coupon → use_id of its 200
	for i, r := range replies {
		k := i % coupons
		key := outcome(t, fmt.Sprintf("use %d of coupon %s", i, ids[k]), r, "200", "409 already_used")
		counts.add(key, r.api)
		if key != "200" {
			continue
		}
		useID, _ := r.body["use_id"].(string)
		if r.body["status"] != "used" || useID == "" {
			t.Errorf("use %d of coupon %s: 200 %v", i, ids[k], r.body)
		}
		if prev, ok := usedBy[ids[k]]; ok {
			t.Errorf("coupon %s used twice: uses %s and %s both answered 200", ids[k], prev, useID)
		}
		usedBy[ids[k]] = useID
	}
	unavailable := counts.unavailable()
	t.Logf("%d uses (%d coupons × %d) in %s: %s", coupons*usesEach, coupons, usesEach, took.Round(time.Millisecond), counts)

	// A second payout is final the moment it happens: look before waiting
	// for the runs, which a double use may leave retrying forever.
	for _, id := range ids {
		if sim := simPayouts(s, id); len(sim) > 1 {
			t.Errorf("coupon %s paid %d times: %+v", id, len(sim), sim)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	filter := "CouponId IN ('" + strings.Join(ids, "','") + "')"
	waitSettled(t, s, filter)
	// A coupon all of whose requests were answered 503 may be unused: its
	// owner retries after Retry-After, as a client would, until it is told
	// the coupon's fate.
	for k, id := range ids {
		if usedBy[id] != "" {
			continue
		}
		for attempt := 0; ; attempt++ {
			r := send(apis[k%2], k%2, "POST", "/v1/coupons/"+id+"/use", map[string]any{"user_id": owner(k)})
			key := outcome(t, "retried use of coupon "+id, r, "200", "409 already_used")
			if key == "200" {
				usedBy[id], _ = r.body["use_id"].(string)
			}
			if !strings.HasPrefix(key, "503") || attempt == 5 {
				break
			}
			// The server's own word on when to come back.
			secs, _ := strconv.Atoi(r.retryAfter)
			time.Sleep(time.Duration(max(secs, 1)) * time.Second)
		}
	}
	waitSettled(t, s, filter)

	var events map[string]int
	waitFor(t, time.Minute, fmt.Sprintf("%d coupon.used events", coupons), func() bool {
		var ofType []workflows.Event
		for _, e := range couponEvents(t, s, workflows.CouponTopic) {
			if e.Data["coupon_type_id"] == typeID {
				ofType = append(ofType, e)
			}
		}
		events = couponEventsOf(ofType, workflows.EventCouponUsed)
		return len(events) >= coupons
	})
	for id := range events {
		if !slices.Contains(ids, id) {
			t.Errorf("coupon.used event keyed %q, not one of this test's coupons", id)
		}
	}
	for _, id := range ids {
		var status string
		var useID *string
		if err := s.Pool.QueryRow(context.Background(), `SELECT status, use_id FROM coupons WHERE id = $1`, id).Scan(&status, &useID); err != nil {
			t.Fatal(err)
		}
		if status != "used" || useID == nil {
			t.Errorf("coupon %s ended %s (use %v), want used", id, status, useID)
			continue
		}
		if got := usedBy[id]; got != "" && got != *useID {
			t.Errorf("coupon %s: use %s was answered 200, the database records use %s", id, got, *useID)
		}
		key := workflows.PayoutKey(id, *useID)
		if sim := simPayouts(s, id); len(sim) != 1 || sim[0].IdempotencyKey != key {
			t.Errorf("coupon %s: the payout API paid %+v, want once under %s", id, sim, key)
		}
		if n := ledgerRows(t, s, id); n != 1 {
			t.Errorf("coupon %s: %d ledger rows, want 1", id, n)
		}
		if n := events[id]; n != 1 {
			t.Errorf("coupon %s: %d coupon.used events, want 1", id, n)
		}
	}
	v := apis[0].must("GET", "/v1/vendors/"+vendorID, nil, http.StatusOK)
	if v["balance_cents"] != float64(coupons*payoutCents) || v["payout_count"] != float64(coupons) {
		t.Errorf("vendor after %d uses: balance %v, %v payouts; want %d and %d", coupons, v["balance_cents"], v["payout_count"], coupons*payoutCents, coupons)
	}
	t.Logf("%d coupons: %d answered 200 in the rush, %d uses answered 503 (Retry-After on each); %d payouts at the simulator",
		coupons, counts.total("200"), unavailable, len(s.Payout.Payouts()))
}
