package main

// Integration tests: the real Temporal dev server (the pinned CLI), a real
// Kafka-protocol broker (kfake, or Apache Kafka when CLAIMFLOW_TEST_KAFKA_BROKERS
// is set), real PostgreSQL, and the API and worker wired as `claimflow dev`
// wires them. Nothing here is mocked.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/claimflow/claimflow/internal/kafka"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
	commonpb "go.temporal.io/api/common/v1"
	enumspb "go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/claimflow/claimflow/dev/devstack"
	appconfig "github.com/claimflow/claimflow/internal/config"
	"github.com/claimflow/claimflow/workflows"
)

// testStack starts a stack on free ports in dataDir and stops it at cleanup.
func testStack(t *testing.T, dataDir string) *stack {
	t.Helper()
	o := testStackOptions(t, dataDir)
	return startTestStack(t, o)
}

func testStackOptions(t *testing.T, dataDir string) stackOptions {
	t.Helper()
	ports, err := devstack.FreePorts(5)
	if err != nil {
		t.Fatal(err)
	}
	o := stackOptions{
		DataDir:      dataDir,
		HTTPAddr:     fmt.Sprintf("127.0.0.1:%d", ports[0]),
		TemporalPort: ports[1],
		UIPort:       ports[2],
		KafkaPort:    ports[3],
		PGPort:       ports[4],
		Headless:     true,
		Progress:     testWriter{t},
	}
	if b := os.Getenv("CLAIMFLOW_TEST_KAFKA_BROKERS"); b != "" {
		o.KafkaBrokers = strings.Split(b, ",")
	}
	return o
}

func startTestStack(t *testing.T, o stackOptions) *stack {
	t.Helper()
	cfg, err := appconfig.Load()
	if err != nil {
		t.Fatal(err)
	}
	cfg.LogLevel = slog.LevelWarn
	// The test stack checks iss and aud as production must; mintToken puts them in.
	cfg.Security.Issuer, cfg.Security.Audience = testIssuer, testAudience
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	began := time.Now()
	s, err := startStack(ctx, cfg, log, o)
	if err != nil {
		t.Fatalf("start stack: %v", err)
	}
	t.Logf("stack up in %s: %s", time.Since(began).Round(time.Millisecond), s.ReadyLine())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := s.Stop(ctx); err != nil {
			t.Errorf("stop stack: %v", err)
		}
	})
	// Cleanups run last-in-first-out: every run the test closed is replayed
	// against this build before the server stops, so a non-deterministic
	// change fails CI even where no recorded fixture covers the path.
	t.Cleanup(func() { replayRunsOf(t, s, "") })
	return s
}

// dataDir returns a directory the postgres system user can also use, since
// the private cluster runs as that user when the tests run as root.
func dataDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for d := filepath.Dir(dir); d != "/" && d != "."; d = filepath.Dir(d) {
		if d == os.TempDir() {
			break
		}
		_ = os.Chmod(d, 0o755)
	}
	return dir
}

// logLine marks a test's line that quotes a log (the stack's, a server's)
// rather than saying what the test saw: .ci/run leaves such lines out when it
// shows a failing test's own lines, which a long log would push out of view.
const logLine = "log| "

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	for line := range strings.SplitSeq(strings.TrimRight(string(p), "\n"), "\n") {
		w.t.Log(logLine + line)
	}
	return len(p), nil
}

// apiClient speaks JSON to the API under test.
type apiClient struct {
	t    *testing.T
	base string
	http *http.Client
	// token is sent as the bearer token: an admin's, which may act for any student.
	token string
}

func newAPIClient(t *testing.T, s *stack) *apiClient {
	token, err := mintToken(s.Config.Security.JWTSecret, "test-admin", "admin", 24*time.Hour)
	if err != nil && !s.Config.Security.InsecureNoAuth {
		t.Fatalf("mint the test client's token: %v", err)
	}
	return &apiClient{t: t, base: "http://" + s.API.Addr, token: token, http: &http.Client{
		Timeout:   60 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: 256},
	}}
}

// newStudentClient speaks to the API as sub, a student or user without a
// role.
func newStudentClient(t *testing.T, s *stack, sub string) *apiClient {
	c := newAPIClient(t, s)
	tok, err := mintToken(s.Config.Security.JWTSecret, sub, "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	c.token = tok
	return c
}

// do sends a request and decodes a JSON answer into a map.
func (c *apiClient) do(method, path string, body any) (int, map[string]any, error) {
	status, out, _, err := c.exchange(method, path, body)
	return status, out, err
}

// exchange is do that also returns the answer's headers.
func (c *apiClient) exchange(method, path string, body any) (int, map[string]any, http.Header, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, c.base+path, rd)
	if err != nil {
		return 0, nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, nil, resp.Header, err
	}
	out := map[string]any{}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &out); err != nil {
			return resp.StatusCode, nil, resp.Header, fmt.Errorf("decode %s %s answer %q: %w", method, path, raw, err)
		}
	}
	return resp.StatusCode, out, resp.Header, nil
}

// must is do that fails the test on a transport error or an unexpected status.
func (c *apiClient) must(method, path string, body any, want int) map[string]any {
	c.t.Helper()
	out, _ := c.mustHeader(method, path, body, want)
	return out
}

// mustHeader is must that also returns the answer's headers.
func (c *apiClient) mustHeader(method, path string, body any, want int) (map[string]any, http.Header) {
	c.t.Helper()
	status, out, header, err := c.exchange(method, path, body)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	if status != want {
		c.t.Fatalf("%s %s = %d %v, want %d", method, path, status, out, want)
	}
	return out, header
}

func errorCode(body map[string]any) string {
	e, _ := body["error"].(map[string]any)
	code, _ := e["code"].(string)
	return code
}

// waitFor polls cond until it holds or the timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// openRunsOf counts the runs holding claims on these courses that are still
// open. A batch the server accepted just before a crash reserves nothing
// until its workflow task runs again after the restart, so "every row is
// terminal" alone can be true while more rows and events are on their way.
//
// Every caller polls it inside waitFor, so a count that fails (a dev server
// busy with a fault's backlog can let one time out) answers -1, "not known
// yet", and is logged: the caller looks again, and a count that never works
// ends in waitFor's timeout.
func openRunsOf(t *testing.T, s *stack, courses ...string) int64 {
	t.Helper()
	quoted := make([]string, len(courses))
	for i, c := range courses {
		quoted[i] = "'" + c + "'"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	began := time.Now()
	resp, err := s.Client.CountWorkflow(ctx, &workflowservice.CountWorkflowExecutionsRequest{
		Namespace: s.Config.Namespace,
		Query:     "CourseId IN (" + strings.Join(quoted, ",") + ") AND ExecutionStatus = 'Running'",
	})
	if err != nil {
		t.Logf("count of open runs failed after %s, looking again: %v", time.Since(began).Round(time.Millisecond), err)
		time.Sleep(time.Second) // not a log line every 50 ms while the server is down
		return -1
	}
	return resp.Count
}

// heldFor is true once cond has been true for d in a row: Temporal writes
// visibility asynchronously, so one look can miss a run that just started.
func heldFor(d time.Duration, cond func() bool) func() bool {
	var since time.Time
	return func() bool {
		if !cond() {
			since = time.Time{}
			return false
		}
		if since.IsZero() {
			since = time.Now()
		}
		return time.Since(since) >= d
	}
}

// topicEvents reads every event on an enrollment topic from the beginning.
func topicEvents(t *testing.T, s *stack, topic string) []workflows.Event {
	t.Helper()
	return readTopic(t, s.Config.KafkaBrokers, topic, "course_id")
}

// readTopic reads every event on a topic from the beginning and checks that
// each message is keyed by the event's keyField (its ordering key).
func readTopic(t *testing.T, brokers []string, topic, keyField string) []workflows.Event {
	t.Helper()
	cfg := sarama.NewConfig()
	v, err := sarama.ParseKafkaVersion(kafka.DefaultVersion)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Version = v
	client, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		t.Fatalf("kafka client: %v", err)
	}
	defer client.Close()
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	partitions, err := client.Partitions(topic)
	if err != nil {
		t.Fatalf("partitions of %s: %v", topic, err)
	}
	var events []workflows.Event
	for _, p := range partitions {
		newest, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			t.Fatal(err)
		}
		oldest, err := client.GetOffset(topic, p, sarama.OffsetOldest)
		if err != nil {
			t.Fatal(err)
		}
		if newest <= oldest {
			continue
		}
		pc, err := consumer.ConsumePartition(topic, p, oldest)
		if err != nil {
			t.Fatal(err)
		}
		for msg := range pc.Messages() {
			var e workflows.Event
			if err := json.Unmarshal(msg.Value, &e); err != nil {
				t.Fatalf("event at %s/%d/%d is not JSON: %v", topic, p, msg.Offset, err)
			}
			if string(msg.Key) != e.Data[keyField] {
				t.Errorf("event %s has key %q, want its %s %v", e.ID, msg.Key, keyField, e.Data[keyField])
			}
			events = append(events, e)
			if msg.Offset >= newest-1 {
				break
			}
		}
		pc.Close()
	}
	return events
}

// eventsFor counts events of one type per enrollment.
// Every event's ID must be the one derived from its enrollment and type,
// or consumers could not dedupe republished events.
func eventsFor(events []workflows.Event, eventType string) map[string]int {
	out := map[string]int{}
	for _, e := range events {
		if e.Type != eventType {
			continue
		}
		id, _ := e.Data["enrollment_id"].(string)
		if e.ID != workflows.EventID(id, eventType) {
			id = "bad event id: " + e.ID
		}
		out[id]++
	}
	return out
}

// kafkaProduceFault fails every produce to topic as a broker that lost its
// in-sync replicas would, until removed.
func kafkaProduceFault(topic string) kfake.Fault {
	return kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Count: -1, Err: kerr.NotEnoughReplicas}
}

// failProduces makes the broker refuse every produce to topic until the
// returned func runs, on kfake and on a real Apache Kafka alike. kfake's fault
// hook answers NOT_ENOUGH_REPLICAS (retriable, as after losing replicas). A
// single Apache Kafka 4.x node caps min.insync.replicas at the replica count,
// so there the topic's max.message.bytes is lowered to 1 instead: the broker
// refuses each write with MESSAGE_TOO_LARGE, the app's producer returns the
// error (rolling its idempotent epoch over) and the activity's retry policy
// runs out into a dead letter. Restoring the setting is the broker taking
// writes again.
func failProduces(t *testing.T, s *stack, topic string) (remove func()) {
	t.Helper()
	if s.Kafka != nil {
		f := s.Kafka.Cluster.Fault(kafkaProduceFault(topic))
		return f.Remove
	}
	const setting = "max.message.bytes"
	cfg := sarama.NewConfig()
	v, err := sarama.ParseKafkaVersion(kafka.DefaultVersion)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Version = v
	admin, err := sarama.NewClusterAdmin(s.Config.KafkaBrokers, cfg)
	if err != nil {
		t.Fatalf("kafka admin: %v", err)
	}
	before := topicConfig(admin, topic, setting)
	set := func(op sarama.IncrementalAlterConfigsOperation, value *string) error {
		return admin.IncrementalAlterConfig(sarama.TopicResource, topic, map[string]sarama.IncrementalAlterConfigsEntry{
			setting: {Operation: op, Value: value},
		}, false)
	}
	one := "1"
	if err := set(sarama.IncrementalAlterConfigsOperationSet, &one); err != nil {
		t.Fatalf("lower %s of %s to 1: %v", setting, topic, err)
	}
	waitTopicConfig(t, admin, topic, setting, one)
	removed := false
	remove = func() {
		if removed {
			return
		}
		removed = true
		if err := set(sarama.IncrementalAlterConfigsOperationDelete, nil); err != nil {
			t.Errorf("reset %s of %s: %v", setting, topic, err)
		}
		waitTopicConfig(t, admin, topic, setting, before)
		admin.Close()
	}
	t.Cleanup(remove)
	return remove
}

// topicConfig is a topic's config value as the broker reports it ("" if
// it cannot say).
func topicConfig(admin sarama.ClusterAdmin, topic, name string) string {
	results, err := admin.DescribeConfigs([]*sarama.ConfigResource{{Type: sarama.TopicResource, Name: topic, ConfigNames: []string{name}}},
		sarama.DescribeConfigsOptions{})
	if err != nil {
		return ""
	}
	for _, r := range results {
		if r.Name != topic || r.ErrorCode != 0 {
			continue
		}
		for _, e := range r.Configs {
			if e.Name == name {
				return e.Value
			}
		}
	}
	return ""
}

// waitTopicConfig polls until the broker reports the topic config value.
func waitTopicConfig(t *testing.T, admin sarama.ClusterAdmin, topic, name, want string) {
	t.Helper()
	waitFor(t, 30*time.Second, fmt.Sprintf("%s of %s = %s", name, topic, want), func() bool {
		return topicConfig(admin, topic, name) == want
	})
}

func TestIntegration(t *testing.T) {
	if testing.Short() {
		t.Skip("integration tests start the real stack; skipped with -short")
	}
	s := testStack(t, dataDir(t))
	c := newAPIClient(t, s)

	t.Run("concurrent students never oversell", func(t *testing.T) {
		oversellRush(t, s, c, "hot")
	})
	t.Run("a desk decides the batches that reach it together as one", func(t *testing.T) {
		// While the desk's first batch waits on a course row this test
		// locks, three more batches reach the desk, one from each of three
		// more API replicas (an API sends a desk one batch at a time); its
		// next workflow task takes them together: one reservation, one
		// publish.
		replicas := make([]*apiClient, 4)
		for i := range replicas {
			replicas[i] = secondAPI(t, s, c, func(cfg *appconfig.Config) { cfg.ClaimDesks = 1 })
		}
		closeDesk(t, s, 0) // a desk run of this test's batches alone
		c.must("POST", "/v1/courses", map[string]any{"id": "merge101", "title": "Merged", "capacity": 10}, http.StatusCreated)
		ctx := context.Background()
		tx, err := s.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if _, err := tx.Exec(ctx, "SELECT 1 FROM courses WHERE id = 'merge101' FOR UPDATE"); err != nil {
			t.Fatal(err)
		}
		answers := make([]map[string]any, 4)
		var wg sync.WaitGroup
		enroll := func(i int) {
			wg.Go(func() {
				answers[i] = replicas[i].must("POST", "/v1/courses/merge101/enrollments", map[string]any{"student_id": fmt.Sprintf("merge-%d", i)}, http.StatusCreated)
			})
		}
		enroll(0)
		waitFor(t, 30*time.Second, "the first batch's reservation waiting on the lock", func() bool {
			var waiting int
			err := s.Pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%courses%'").Scan(&waiting)
			return err == nil && waiting > 0
		})
		// One claim at a time, each sent before the next arrives. The
		// first batch's ReserveSeats gives up after 10 s: this takes well
		// under that.
		for i := 1; i < 4; i++ {
			enroll(i)
			waitFor(t, 5*time.Second, fmt.Sprintf("claim %d sent to the desk", i), func() bool {
				return metricValue(metricsText(t, replicas[i]), "claimflow_claim_batch_claims_sum") >= 1
			})
		}
		time.Sleep(500 * time.Millisecond) // for the last update to reach the server
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		runID := ""
		for i, a := range answers {
			if a["status"] != "confirmed" || a["workflow_id"] != workflows.EnrollmentDeskWorkflowID(0) {
				t.Fatalf("enrollment %d answered %v", i, a)
			}
			runID = a["run_id"].(string)
		}
		// Over the desk's run: the batches it accepted, and the local
		// activities it ran (each a marker). Decided one by one, the four
		// batches would take two each (a reservation and a publish);
		// merged, fewer. Counted over the run rather than per workflow
		// task: a task that runs long is completed early to keep it alive
		// (the SDK's heartbeat), which splits one decision's events.
		h, err := fetchHistory(ctx, s.Client, runRef{WorkflowID: workflows.EnrollmentDeskWorkflowID(0), RunID: runID})
		if err != nil {
			t.Fatal(err)
		}
		n := countEvents(h, enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED, enumspb.EVENT_TYPE_MARKER_RECORDED)
		accepted, markers := n[0], n[1]
		if accepted != 4 || markers >= 2*accepted {
			t.Errorf("the desk's run accepted %d batches and ran %d local activities: want 4 batches, and fewer than two activities a batch (merged)", accepted, markers)
		}
	})

	t.Run("a batch the desk cannot list goes to its next run", func(t *testing.T) {
		// Desks whose search attribute values take 67 bytes, the least
		// allowed: the first batch lists a student of 7 bytes; a batch from
		// another replica whose student takes 61 would make 68, so the desk
		// turns it away and continues as new, and that replica sends it to
		// the next run.
		small := func(cfg *appconfig.Config) {
			cfg.ClaimDesks, cfg.ClaimBatchAttrBytes = 1, appconfig.MinClaimBatchAttrBytes
		}
		first, second := secondAPI(t, s, c, small), secondAPI(t, s, c, small)
		closeDesk(t, s, 0) // the next batch starts a desk with these settings
		defer closeDesk(t, s, 0)
		c.must("POST", "/v1/courses", map[string]any{"id": "full101", "title": "Full desk", "capacity": 10}, http.StatusCreated)
		a := first.must("POST", "/v1/courses/full101/enrollments", map[string]any{"student_id": "fl-0"}, http.StatusCreated)
		b := second.must("POST", "/v1/courses/full101/enrollments", map[string]any{"student_id": "fl-" + strings.Repeat("x", 55)}, http.StatusCreated)
		if a["status"] != "confirmed" || a["workflow_id"] != workflows.EnrollmentDeskWorkflowID(0) {
			t.Errorf("the first claim answered %v, want confirmed by the desk", a)
		}
		if b["status"] != "confirmed" || b["workflow_id"] != workflows.EnrollmentDeskWorkflowID(0) || b["run_id"] == a["run_id"] {
			t.Errorf("the second claim answered %v, want confirmed by the desk's next run (not %v)", b, a["run_id"])
		}
		if n := metricValue(metricsText(t, first), "claimflow_claim_desk_full_total"); n != 0 {
			t.Errorf("the first replica counted %v batches the desk could not list, want 0", n)
		}
		if n := metricValue(metricsText(t, second), "claimflow_claim_desk_full_total"); n < 1 {
			t.Errorf("the second replica counted %v batches the desk could not list, want at least 1", n)
		}
	})

	t.Run("concurrent students never oversell/desk continuing as new every 2 batches", func(t *testing.T) {
		// One desk that continues as new after every second batch: the
		// rush's batches meet runs as they close, and the server's aborted
		// updates must reach the next run, each once.
		// The desk of the rushes above keeps its own input: an operator's
		// cancel closes it, and the next batch starts a desk with this
		// API's settings.
		closeDesk(t, s, 0)
		oversellRush(t, s, secondAPI(t, s, c, func(cfg *appconfig.Config) {
			cfg.ClaimDesks, cfg.ClaimDeskBatches = 1, 2
		}), "hot-desk-can")
		// The rush's first claim goes out alone, the rest after it: at
		// least two batches, so the new desk continued as new at least once.
		chain := runChain(t, s.Client, workflows.EnrollmentDeskWorkflowID(0))
		if len(chain) < 2 {
			t.Errorf("the desk started by the rush has %d run(s): it did not continue as new", len(chain))
		}
		// A run's outcome stays with it: the run it continues as starts
		// without its lists (workflows.keepOutcomeFromNextRun).
		outcomeKeys := []string{workflows.SearchClaimStatus.GetName(), workflows.SearchStudentID.GetName(),
			workflows.SearchCourseID.GetName(), workflows.SearchRefusedStudentIDs.GetName()}
		for _, h := range chain {
			carried := []*commonpb.SearchAttributes{h.Events[0].GetWorkflowExecutionStartedEventAttributes().GetSearchAttributes()}
			if last := h.Events[len(h.Events)-1]; last.GetEventType() == enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW {
				carried = append(carried, last.GetWorkflowExecutionContinuedAsNewEventAttributes().GetSearchAttributes())
			}
			for _, sa := range carried {
				for _, k := range outcomeKeys {
					if _, ok := sa.GetIndexedFields()[k]; ok {
						t.Errorf("a desk run started or continued with its predecessor's %s", k)
					}
				}
			}
		}
	})

	t.Run("duplicate and invalid requests", func(t *testing.T) {
		c.must("POST", "/v1/courses", map[string]any{"id": "dup101", "title": "Dup", "capacity": 5}, http.StatusCreated)
		c.must("POST", "/v1/courses", map[string]any{"id": "dup101", "title": "Dup", "capacity": 5}, http.StatusConflict)
		first := c.must("POST", "/v1/courses/dup101/enrollments?wait=confirmed", map[string]any{"student_id": "ann"}, http.StatusCreated)
		if first["status"] != "confirmed" || first["published_at"] == nil || first["recorded_at"] == nil {
			t.Fatalf("wait=confirmed answered %v", first)
		}
		again := c.must("POST", "/v1/courses/dup101/enrollments", map[string]any{"student_id": "ann"}, http.StatusConflict)
		if errorCode(again) != "already_enrolled" || again["enrollment_id"] != first["id"] {
			t.Fatalf("second enrollment answered %v", again)
		}
		cases := []struct {
			method, path string
			body         any
			status       int
			code, field  string
		}{
			{"POST", "/v1/courses/dup101/enrollments", map[string]any{"student": "x"}, 400, "unknown_field", "student"},
			{"POST", "/v1/courses/dup101/enrollments", map[string]any{"student_id": ""}, 400, "missing_field", "student_id"},
			{"POST", "/v1/courses/dup101/enrollments", map[string]any{"student_id": "a:b"}, 400, "invalid_field", "student_id"},
			{"POST", "/v1/courses/dup101/enrollments", map[string]any{"student_id": 7}, 400, "invalid_field", "student_id"},
			{"POST", "/v1/courses/nope/enrollments", map[string]any{"student_id": "ann"}, 404, "course_not_found", ""},
			{"POST", "/v1/courses", map[string]any{"title": "x", "capacity": -1}, 400, "invalid_field", "capacity"},
			{"POST", "/v1/courses", map[string]any{"capacity": 3}, 400, "missing_field", "title"},
			{"GET", "/v1/courses/nope", nil, 404, "course_not_found", "id"},
			{"GET", "/v1/enrollments/nope", nil, 404, "enrollment_not_found", "id"},
			{"DELETE", "/v1/enrollments/nope", nil, 404, "enrollment_not_found", "id"},
			{"GET", "/v1/dead-letters/999999", nil, 404, "dead_letter_not_found", "id"},
			{"POST", "/v1/dead-letters/abc/retry", nil, 400, "invalid_field", "id"},
		}
		for _, tc := range cases {
			st, body, err := c.do(tc.method, tc.path, tc.body)
			if err != nil {
				t.Fatal(err)
			}
			e, _ := body["error"].(map[string]any)
			if st != tc.status || errorCode(body) != tc.code || (tc.field != "" && e["field"] != tc.field) {
				t.Errorf("%s %s %v = %d %v, want %d %s field %q", tc.method, tc.path, tc.body, st, body, tc.status, tc.code, tc.field)
			}
		}
	})

	t.Run("metrics show what happened", func(t *testing.T) {
		const fullSeries = `claimflow_claim_decisions_total{refusal="course_full",status="refused",workflow="Enrollment"}`
		fullBefore := metricValue(metricsText(t, c), fullSeries)
		c.must("POST", "/v1/courses", map[string]any{"id": "met101", "title": "Metrics", "capacity": 1}, http.StatusCreated)
		c.must("POST", "/v1/courses/met101/enrollments?wait=confirmed", map[string]any{"student_id": "m-1"}, http.StatusCreated)
		c.must("POST", "/v1/courses/met101/enrollments", map[string]any{"student_id": "m-1"}, http.StatusConflict)
		c.must("POST", "/v1/courses/met101/enrollments", map[string]any{"student_id": "m-2"}, http.StatusConflict)
		c.must("POST", "/v1/courses/met101/enrollments", map[string]any{"student_id": "m-3"}, http.StatusConflict)
		text := metricsText(t, c)
		if got := metricValue(text, fullSeries) - fullBefore; got != 2 {
			t.Errorf("course_full decisions rose by %v for two refused students, want 2", got)
		}
		for _, want := range []string{
			fullSeries,
			`claimflow_claim_decisions_total{refusal="already_enrolled",status="refused",workflow="Enrollment"}`,
			`claimflow_http_requests_total{method="POST",route="/v1/courses/:id/enrollments",status="409"}`,
			`claimflow_activity_attempts_total{activity="Publish`, // single runs or batches
			`claimflow_kafka_publish_seconds_count{topic="enrollment.events"}`,
			`claimflow_dead_letters_open 0`,
			`claimflow_db_pool_max_connections{pool="services"} 64`,
			`claimflow_db_pool_acquire_seconds_total{pool="services"}`,
			`temporal_workflow_task_execution_latency_seconds_count{`,
			`go_goroutines`,
		} {
			if !strings.Contains(text, want) {
				t.Errorf("/metrics lacks %s", want)
			}
		}
	})

	t.Run("cancel frees the seat and a cancelled student may enroll again", func(t *testing.T) {
		c.must("POST", "/v1/courses", map[string]any{"id": "can101", "title": "Cancel", "capacity": 1}, http.StatusCreated)
		e := c.must("POST", "/v1/courses/can101/enrollments?wait=confirmed", map[string]any{"student_id": "bob"}, http.StatusCreated)
		id := e["id"].(string)
		c.must("POST", "/v1/courses/can101/enrollments", map[string]any{"student_id": "eve"}, http.StatusConflict)

		got := c.must("DELETE", "/v1/enrollments/"+id, nil, http.StatusOK)
		if got["status"] != "cancelled" || got["cancelled_at"] == nil {
			t.Fatalf("cancel answered %v", got)
		}
		if course := c.must("GET", "/v1/courses/can101", nil, http.StatusOK); course["enrolled"] != float64(0) {
			t.Fatalf("seat not freed: %v", course)
		}
		if again := c.must("DELETE", "/v1/enrollments/"+id, nil, http.StatusOK); again["status"] != "cancelled" {
			t.Fatalf("second cancel answered %v", again)
		}
		if course := c.must("GET", "/v1/courses/can101", nil, http.StatusOK); course["enrolled"] != float64(0) {
			t.Fatalf("second cancel changed the seat count: %v", course)
		}
		re := c.must("POST", "/v1/courses/can101/enrollments?wait=confirmed", map[string]any{"student_id": "bob"}, http.StatusCreated)
		if re["id"] == id || re["status"] != "confirmed" {
			t.Fatalf("re-enrollment answered %v", re)
		}
		// Events of one course share a partition, so once the re-enrollment's
		// confirmed event is there and no run of the course is open, a
		// duplicated cancel publish would already be on the topic too.
		waitFor(t, 30*time.Second, "re-enrollment's confirmed event after the cancel, and no open run", heldFor(time.Second, func() bool {
			return eventsFor(topicEvents(t, s, workflows.EnrollmentTopic), workflows.EventEnrollmentConfirmed)[re["id"].(string)] >= 1 &&
				openRunsOf(t, s, "can101") == 0
		}))
		if n := eventsFor(topicEvents(t, s, workflows.EnrollmentTopic), workflows.EventEnrollmentCancelled)[id]; n != 1 {
			t.Fatalf("%d enrollment.cancelled events after two cancels, want 1", n)
		}
	})

	t.Run("publish exhausted dead-letters, retry confirms once", func(t *testing.T) {
		c.must("POST", "/v1/courses", map[string]any{"id": "dlq101", "title": "DLQ", "capacity": 3}, http.StatusCreated)
		removeFault := failProduces(t, s, workflows.EnrollmentTopic)
		e := c.must("POST", "/v1/courses/dlq101/enrollments", map[string]any{"student_id": "dan"}, http.StatusCreated)
		id := e["id"].(string)

		dl := waitDeadLetter(t, c, id)
		if got := c.must("GET", "/v1/enrollments/"+id, nil, http.StatusOK); got["status"] != "dead_lettered" {
			t.Fatalf("enrollment after exhaustion: %v", got)
		}
		if dl["event_id"] != workflows.EventID(id, workflows.EventEnrollmentConfirmed) || dl["status"] != "open" {
			t.Fatalf("dead letter: %v", dl)
		}
		removeFault()
		dlID := fmt.Sprint(dl["id"])
		c.must("POST", "/v1/dead-letters/"+dlID+"/retry", nil, http.StatusAccepted)
		waitFor(t, 30*time.Second, "confirmed after retry", func() bool {
			_, got, _ := c.do("GET", "/v1/enrollments/"+id, nil)
			return got["status"] == "confirmed"
		})
		if got := c.must("GET", "/v1/dead-letters/"+dlID, nil, http.StatusOK); got["status"] != "resolved" {
			t.Fatalf("dead letter after retry: %v", got)
		}
		c.must("POST", "/v1/dead-letters/"+dlID+"/retry", nil, http.StatusConflict)
		if n := eventsFor(topicEvents(t, s, workflows.EnrollmentTopic), workflows.EventEnrollmentConfirmed)[id]; n != 1 {
			t.Fatalf("%d confirmed events after dead letter and retry, want exactly 1", n)
		}
		dlt := topicEvents(t, s, workflows.EnrollmentDLTTopic)
		if n := eventsFor(dlt, workflows.EventEnrollmentConfirmed)[id]; n < 1 {
			t.Fatalf("no copy of the dead letter on %s", workflows.EnrollmentDLTTopic)
		}
	})

	t.Run("dead letter compensated gives the seat back", func(t *testing.T) {
		c.must("POST", "/v1/courses", map[string]any{"id": "cmp101", "title": "Compensate", "capacity": 1}, http.StatusCreated)
		removeFault := failProduces(t, s, workflows.EnrollmentTopic)
		e := c.must("POST", "/v1/courses/cmp101/enrollments", map[string]any{"student_id": "fay"}, http.StatusCreated)
		id := e["id"].(string)
		dl := waitDeadLetter(t, c, id)
		removeFault()
		c.must("POST", fmt.Sprintf("/v1/dead-letters/%v/compensate", dl["id"]), nil, http.StatusAccepted)
		waitFor(t, 30*time.Second, "failed after compensation", func() bool {
			_, got, _ := c.do("GET", "/v1/enrollments/"+id, nil)
			return got["status"] == "failed" && got["failed_at"] != nil
		})
		if course := c.must("GET", "/v1/courses/cmp101", nil, http.StatusOK); course["enrolled"] != float64(0) {
			t.Fatalf("seat not given back: %v", course)
		}
		waitFor(t, 30*time.Second, "enrollment.failed event", func() bool {
			return eventsFor(topicEvents(t, s, workflows.EnrollmentTopic), workflows.EventEnrollmentFailed)[id] == 1
		})
		if n := eventsFor(topicEvents(t, s, workflows.EnrollmentTopic), workflows.EventEnrollmentConfirmed)[id]; n != 0 {
			t.Fatalf("compensated enrollment has %d confirmed events", n)
		}
		waitFor(t, 10*time.Second, "dead letter compensated", func() bool {
			_, got, _ := c.do("GET", fmt.Sprintf("/v1/dead-letters/%v", dl["id"]), nil)
			return got["status"] == "compensated"
		})
		// The freed seat can be taken again.
		c.must("POST", "/v1/courses/cmp101/enrollments", map[string]any{"student_id": "gus"}, http.StatusCreated)
	})
}

// deskRunning says whether desk k has a run open (false when it never
// started or closed).
func deskRunning(ctx context.Context, s *stack, k int) bool {
	d, err := s.Client.DescribeWorkflow(ctx, workflows.EnrollmentDeskWorkflowID(k), "")
	return err == nil && d.RawResponse.GetWorkflowExecutionInfo().GetStatus() == enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING
}

// closeDesk cancels desk k, if it runs, as an operator would, and waits
// until it closed; the next batch sent to it starts a new run.
func closeDesk(t *testing.T, s *stack, k int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id := workflows.EnrollmentDeskWorkflowID(k)
	if !deskRunning(ctx, s, k) {
		return // never started, or closed already
	}
	if err := s.Client.CancelWorkflow(ctx, id, ""); err != nil {
		t.Fatalf("cancel %s: %v", id, err)
	}
	if err := s.Client.GetWorkflow(ctx, id, "").Get(ctx, nil); !temporal.IsCanceledError(err) {
		t.Fatalf("%s after its cancel: %v, want cancelled", id, err)
	}
}

// deskBatchesOpen is how many batches desk k's running run decided, which
// its search attributes tell only once it closes; 0 when no run is open.
func deskBatchesOpen(t *testing.T, s *stack, k int) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id := workflows.EnrollmentDeskWorkflowID(k)
	if !deskRunning(ctx, s, k) {
		return 0
	}
	v, err := s.Client.QueryWorkflow(ctx, id, "", workflows.QueryStatus)
	if err != nil {
		t.Logf("query %s: %v", id, err)
		return -1
	}
	var st workflows.DeskState
	if err := v.Get(&st); err != nil {
		t.Fatalf("decode %s's status: %v", id, err)
	}
	return st.Batches
}

// runChain fetches the histories of a workflow ID's runs, latest first,
// following each run back to the one it continued as new from.
func runChain(t *testing.T, c client.Client, id string) []*historypb.History {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var chain []*historypb.History
	for runID := ""; ; {
		h, err := fetchHistory(ctx, c, runRef{WorkflowID: id, RunID: runID})
		if err != nil || len(h.Events) == 0 {
			t.Fatalf("history of %s: %v (%d runs read)", runRef{WorkflowID: id, RunID: runID}, err, len(chain))
		}
		chain = append(chain, h)
		if runID = h.Events[0].GetWorkflowExecutionStartedEventAttributes().GetContinuedExecutionRunId(); runID == "" {
			return chain
		}
	}
}

// countEvents counts the events of h of each type asked for, in order.
func countEvents(h *historypb.History, types ...enumspb.EventType) []int {
	n := make([]int, len(types))
	for _, ev := range h.Events {
		if i := slices.Index(types, ev.GetEventType()); i >= 0 {
			n[i]++
		}
	}
	return n
}

// secondAPI is a client of a second API started on the same stack with
// tune applied to its configuration.
func secondAPI(t *testing.T, s *stack, c *apiClient, tune ...func(*appconfig.Config)) *apiClient {
	t.Helper()
	cfg := s.Config
	for _, f := range tune {
		f(&cfg)
	}
	cfg.HTTPAddr = "127.0.0.1:0"
	svc, err := startAPI(cfg, s.Log, s.Pool, s.Client, newTelemetry())
	if err != nil {
		t.Fatalf("start a second API: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := svc.Stop(ctx); err != nil {
			t.Errorf("stop the second API: %v", err)
		}
	})
	c2 := *c
	c2.t = t
	c2.base = "http://" + svc.Addr
	return &c2
}

// oversellRush sends 200 students at a course of 20 seats at once: exactly
// 20 are enrolled, each with exactly one confirmed event, and 180 hear
// course_full.
func oversellRush(t *testing.T, s *stack, c *apiClient, course string) {
	c.must("POST", "/v1/courses", map[string]any{"id": course, "title": "Hot course", "capacity": 20}, http.StatusCreated)
	const students = 200
	type answer struct {
		status  int
		body    map[string]any
		err     error
		retried bool // after a 503
	}
	answers := make([]answer, students)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range students {
		wg.Go(func() {
			<-start
			// A 503 (no decision within the API's deadline, with
			// Retry-After) is retried as a client would: the same student
			// meets the same run, and if that run gave them the seat the
			// retry hears already_enrolled with the enrollment's ID.
			for try := 0; ; try++ {
				st, body, err := c.do("POST", "/v1/courses/"+course+"/enrollments", map[string]any{"student_id": fmt.Sprintf("st-%03d", i)})
				answers[i] = answer{st, body, err, try > 0}
				if err != nil || st != http.StatusServiceUnavailable || try == 5 {
					return
				}
				time.Sleep(time.Second)
			}
		})
	}
	began := time.Now()
	close(start)
	wg.Wait()
	t.Logf("%d concurrent enrollments answered in %s", students, time.Since(began).Round(time.Millisecond))

	created, full, retried := 0, 0, 0
	enrolledIDs := map[string]bool{}
	for i, a := range answers {
		if a.retried {
			retried++
		}
		switch {
		case a.err != nil:
			t.Errorf("student %d: %v", i, a.err)
		case a.status == http.StatusCreated:
			created++
			enrolledIDs[a.body["id"].(string)] = true
		case a.retried && a.status == http.StatusConflict && errorCode(a.body) == "already_enrolled":
			created++
			enrolledIDs[a.body["enrollment_id"].(string)] = true
		case a.status == http.StatusConflict && errorCode(a.body) == "course_full":
			full++
		default:
			t.Errorf("student %d: %d %v", i, a.status, a.body)
		}
	}
	if retried > 0 {
		t.Logf("%d students were answered 503 at first and asked again", retried)
	}
	if created != 20 || full != 180 || len(enrolledIDs) != 20 {
		t.Fatalf("created=%d (distinct %d) course_full=%d, want 20, 20, 180", created, len(enrolledIDs), full)
	}
	if got := c.must("GET", "/v1/courses/"+course, nil, http.StatusOK); got["enrolled"] != float64(20) || got["available"] != float64(0) {
		t.Fatalf("course after the rush: %v", got)
	}
	waitFor(t, time.Minute, "a confirmed event for each of the 20 enrollments", func() bool {
		events := eventsFor(topicEvents(t, s, workflows.EnrollmentTopic), workflows.EventEnrollmentConfirmed)
		for id := range enrolledIDs {
			if events[id] == 0 {
				return false
			}
		}
		return true
	})
	confirmed := map[string]int{}
	for id, n := range eventsFor(topicEvents(t, s, workflows.EnrollmentTopic), workflows.EventEnrollmentConfirmed) {
		if enrolledIDs[id] {
			confirmed[id] = n
		}
	}
	if len(confirmed) != 20 {
		t.Fatalf("confirmed events for %d of the 20 enrollments", len(confirmed))
	}
	for id, n := range confirmed {
		if n != 1 {
			t.Errorf("enrollment %s has %d confirmed events, want 1", id, n)
		}
	}
	for id := range enrolledIDs {
		waitFor(t, 30*time.Second, "enrollment "+id+" confirmed", func() bool {
			_, e, _ := c.do("GET", "/v1/enrollments/"+id, nil)
			return e["status"] == "confirmed"
		})
	}
}

// metricValue is the value of one series in a Prometheus exposition (0 if
// absent).
func metricValue(text, series string) float64 {
	for _, line := range strings.Split(text, "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			var v float64
			if _, err := fmt.Sscan(rest, &v); err == nil {
				return v
			}
		}
	}
	return 0
}

// metricsText fetches the API's /metrics exposition.
func metricsText(t *testing.T, c *apiClient) string {
	t.Helper()
	resp, err := c.http.Get(c.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics = %d, %v", resp.StatusCode, err)
	}
	return string(b)
}

// waitDeadLetter waits for the dead letter of an enrollment's confirmation;
// the publish policy takes 1+2+4 s of backoff before it gives up.
func waitDeadLetter(t *testing.T, c *apiClient, enrollmentID string) map[string]any {
	t.Helper()
	var found map[string]any
	waitFor(t, 60*time.Second, "dead letter of "+enrollmentID, func() bool {
		_, body, _ := c.do("GET", "/v1/dead-letters?status=open", nil)
		items, _ := body["dead_letters"].([]any)
		for _, it := range items {
			d := it.(map[string]any)
			if d["enrollment_id"] == enrollmentID {
				found = d
				return true
			}
		}
		return false
	})
	return found
}

// TestRestartLosesNothing stops the whole stack in the middle of a stream of
// enrollments, the Temporal server with SIGKILL, then starts it again on the
// same data directory: every accepted enrollment must end confirmed with its
// event on the topic, and everything from before the restart must still be
// there.
func TestRestartLosesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("integration tests start the real stack; skipped with -short")
	}
	o := testStackOptions(t, dataDir(t))
	s := startTestStack(t, o)
	c := newAPIClient(t, s)
	c.http.Timeout = 20 * time.Second
	c.must("POST", "/v1/courses", map[string]any{"id": "rst101", "title": "Restart", "capacity": 10000}, http.StatusCreated)

	var (
		mu       sync.Mutex
		accepted = map[string]bool{}
		failed   int
		next     int
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				mu.Lock()
				next++
				student := fmt.Sprintf("r-%05d", next)
				mu.Unlock()
				st, body, err := c.do("POST", "/v1/courses/rst101/enrollments", map[string]any{"student_id": student})
				mu.Lock()
				if err == nil && st == http.StatusCreated {
					accepted[body["id"].(string)] = true
				} else {
					failed++
				}
				mu.Unlock()
				if err != nil {
					time.Sleep(100 * time.Millisecond)
				}
			}
		})
	}
	waitFor(t, 2*time.Minute, "100 accepted enrollments", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(accepted) >= 100
	})

	// Crash Temporal while requests and workflows are in flight, then take
	// the rest down.
	if err := s.Temporal.Kill(); err != nil {
		t.Fatal(err)
	}
	stopCtx, cancel := context.WithTimeout(context.Background(), time.Minute)
	if err := s.Stop(stopCtx); err != nil {
		t.Logf("stop after kill: %v", err)
	}
	cancel()
	close(stop)
	wg.Wait()
	mu.Lock()
	before := len(accepted)
	mu.Unlock()
	t.Logf("before restart: %d accepted, %d refused or failed in flight", before, failed)

	s2 := startTestStack(t, o)
	c2 := newAPIClient(t, s2)
	course := c2.must("GET", "/v1/courses/rst101", nil, http.StatusOK)
	if course["enrolled"].(float64) < float64(before) {
		t.Fatalf("after restart the course counts %v enrolled, but %d were accepted before", course["enrolled"], before)
	}

	// Drain: every enrollment the database knows, accepted over HTTP or
	// cut off mid-answer, reaches a terminal state, and no run of the
	// course is still open. A batch the server accepted just before the
	// kill may not have reserved anything yet: its workflow task runs
	// again only when its timeout passes after the restart, and then its
	// rows appear.
	ctx := context.Background()
	waitFor(t, 3*time.Minute, "every enrollment confirmed and every run closed", heldFor(3*time.Second, func() bool {
		var pending int
		if err := s2.Pool.QueryRow(ctx, `SELECT count(*) FROM enrollments WHERE course_id = 'rst101' AND status <> 'confirmed'`).Scan(&pending); err != nil {
			t.Fatal(err)
		}
		return pending == 0 && openRunsOf(t, s2, "rst101") == 0
	}))
	rows, err := s2.Pool.Query(ctx, `SELECT id FROM enrollments WHERE course_id = 'rst101' AND status = 'confirmed'`)
	if err != nil {
		t.Fatal(err)
	}
	confirmed := map[string]bool{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		confirmed[id] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for id := range accepted {
		if !confirmed[id] {
			t.Errorf("accepted enrollment %s is not confirmed after the restart", id)
		}
	}
	var seats int
	if err := s2.Pool.QueryRow(ctx, `SELECT enrolled FROM courses WHERE id = 'rst101'`).Scan(&seats); err != nil {
		t.Fatal(err)
	}
	if seats != len(confirmed) {
		t.Errorf("course counts %d seats taken, %d enrollments are confirmed", seats, len(confirmed))
	}

	var ofCourse []workflows.Event
	for _, e := range topicEvents(t, s2, workflows.EnrollmentTopic) {
		// A real broker shared between test runs holds other courses' events.
		if e.Data["course_id"] == "rst101" {
			ofCourse = append(ofCourse, e)
		}
	}
	events := eventsFor(ofCourse, workflows.EventEnrollmentConfirmed)
	redelivered := 0
	for id := range confirmed {
		switch n := events[id]; {
		case n == 0:
			t.Errorf("confirmed enrollment %s has no enrollment.confirmed event: lost", id)
		case n > 1:
			// A publish acked by Kafka but not yet recorded by the killed
			// Temporal server is sent again with the same event ID.
			redelivered += n - 1
		}
	}
	for id := range events {
		if !confirmed[id] {
			t.Errorf("event for %s, which is not a confirmed enrollment", id)
		}
	}
	t.Logf("after restart: %d confirmed (%d accepted over HTTP), %d distinct events, %d redelivered copies with the same event ID",
		len(confirmed), len(accepted), len(events), redelivered)

	// Workflow histories survived the restart too: every run that holds a
	// confirmed enrollment is there, closed, and found by CourseId: a batch
	// run completed, a desk's run continued as new (at the latest on its
	// timer, 5 s after its first decision, which tells visibility).
	type claimRun struct{ wf, run string }
	runs := map[claimRun]bool{}
	rows, err = s2.Pool.Query(ctx, `SELECT DISTINCT workflow_id, run_id FROM enrollments WHERE course_id = 'rst101' AND status = 'confirmed'`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var r claimRun
		if err := rows.Scan(&r.wf, &r.run); err != nil {
			t.Fatal(err)
		}
		runs[r] = true
	}
	// What each run must end as follows from its ID: the stack's desks
	// continue as new, every other run completes.
	desk := map[string]bool{}
	for k := range s2.Config.ClaimDesks {
		desk[workflows.EnrollmentDeskWorkflowID(k)] = true
	}
	want := func(r claimRun) string {
		if desk[r.wf] {
			return "ContinuedAsNew"
		}
		return "Completed"
	}
	statuses := map[claimRun]string{}
	pending := func() int {
		n := 0
		for r := range runs {
			if statuses[r] == want(r) {
				continue
			}
			d, err := s2.Client.DescribeWorkflow(ctx, r.wf, r.run)
			if err != nil {
				t.Fatalf("run %s/%s of a confirmed enrollment: %v", r.wf, r.run, err)
			}
			if statuses[r] = d.RawResponse.GetWorkflowExecutionInfo().GetStatus().String(); statuses[r] != want(r) {
				n++
			}
		}
		return n
	}
	for deadline := time.Now().Add(30 * time.Second); pending() > 0 && time.Now().Before(deadline); {
		time.Sleep(200 * time.Millisecond)
	}
	desks := 0
	for r, st := range statuses {
		if desk[r.wf] {
			desks++
		}
		if st != want(r) {
			t.Errorf("run %s/%s is %s, want %s", r.wf, r.run, st, want(r))
		}
	}
	waitFor(t, 30*time.Second, "runs listed by CourseId", func() bool {
		resp, err := s2.Client.CountWorkflow(ctx, &workflowservice.CountWorkflowExecutionsRequest{
			Namespace: s2.Config.Namespace, Query: "CourseId = 'rst101' AND ExecutionStatus IN ('Completed', 'ContinuedAsNew')",
		})
		if err != nil {
			t.Fatal(err)
		}
		return int(resp.Count) >= len(runs)
	})
	t.Logf("%d runs (%d of them a desk's) hold the %d confirmed enrollments", len(runs), desks, len(confirmed))
}
