package main

// Fault tests: a sustained enrollment load while one real part fails and
// recovers, then an audit. The worker runs as its own process (the built
// claimflow binary) so that it can be killed with SIGKILL.
//
// Short versions run with `go test ./...`. Longer ones:
//
//	CLAIMFLOW_FAULT_LOAD=2m go test -run TestFaults -timeout 60m ./cmd/claimflow/
//
// Against real Apache Kafka (deploy/kafka/kafka.sh; .ci/run does this):
//
//	CLAIMFLOW_FAULT_KAFKA_DIR=<run dir of a 1-node cluster> CLAIMFLOW_TEST_KAFKA_BROKERS=...  (broker outage on a real broker)
//	CLAIMFLOW_FAULT_KAFKA_CLUSTER_DIR=<run dir of a 3-node cluster> CLAIMFLOW_FAULT_KAFKA_CLUSTER_BROKERS=... (leader kill)

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/claimflow/claimflow/internal/kafka"

	"github.com/IBM/sarama"

	"github.com/claimflow/claimflow/cmd/internal/services"
	"github.com/claimflow/claimflow/dev/audit"
	"github.com/claimflow/claimflow/dev/devstack"
	"github.com/claimflow/claimflow/dev/notifysim"
	"github.com/claimflow/claimflow/workflows"
)

var (
	buildOnce   sync.Once
	builtBinary string
	buildErr    error
)

// claimflowBinary builds this command once per test run.
func claimflowBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "claimflow-bin-")
		if err != nil {
			buildErr = err
			return
		}
		builtBinary = filepath.Join(dir, "claimflow")
		out, err := exec.Command("go", "build", "-o", builtBinary, ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtBinary
}

// workerProcess is `claimflow worker` running against a test stack.
type workerProcess struct {
	t       *testing.T
	cmd     *exec.Cmd
	log     string
	metrics string // base URL of its /metrics
	// attempts counts its activity attempts, first ones and retries, read
	// just before it was killed (a SIGKILLed process cannot be asked after).
	attempts activityAttempts
}

// activityAttempts sums claimflow_activity_attempts_total of a worker.
type activityAttempts struct{ first, retry float64 }

func (a activityAttempts) add(b activityAttempts) activityAttempts {
	return activityAttempts{a.first + b.first, a.retry + b.retry}
}

func startWorkerProcess(t *testing.T, s *stack) *workerProcess {
	t.Helper()
	logFile := filepath.Join(s.Options.DataDir, "logs", fmt.Sprintf("worker-%d.log", time.Now().UnixNano()))
	f, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	port, err := devstack.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", port)
	cmd := exec.Command(claimflowBinary(t), "worker")
	cmd.Env = append(os.Environ(),
		"DATABASE_URL="+s.Config.DatabaseURL,
		"TEMPORAL_ADDRESS="+s.Config.TemporalAddress,
		"TEMPORAL_NAMESPACE="+s.Config.Namespace,
		"KAFKA_BROKERS="+strings.Join(s.Config.KafkaBrokers, ","),
		"KAFKA_VERSION="+s.Config.KafkaVersion,
		"METRICS_ADDR="+metricsAddr,
		"EVENT_SIGNING_KEY="+s.Config.EventSigningKey,
		"LOG_LEVEL=warn",
	)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	w := &workerProcess{t: t, cmd: cmd, log: logFile, metrics: "http://" + metricsAddr}
	t.Cleanup(func() { w.kill() })
	return w
}

func (w *workerProcess) kill() {
	if w.cmd.ProcessState == nil {
		w.attempts = w.activityAttempts()
		_ = w.cmd.Process.Kill()
		_ = w.cmd.Wait()
	}
}

// activityAttempts reads the activity attempts of a running worker; the
// retries are activities that a fault made run again.
func (w *workerProcess) activityAttempts() activityAttempts {
	if w.cmd.ProcessState != nil {
		return w.attempts
	}
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(w.metrics + "/metrics")
	if err != nil {
		return w.attempts
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return w.attempts
	}
	var a activityAttempts
	for line := range strings.Lines(string(b)) {
		if !strings.HasPrefix(line, "claimflow_activity_attempts_total{") {
			continue
		}
		fields := strings.Fields(line)
		v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		if err != nil {
			continue
		}
		if strings.Contains(line, `attempt="retry"`) {
			a.retry += v
		} else {
			a.first += v
		}
	}
	return a
}

// load drives enrollments at a modest rate into a few courses that fill up,
// recording every accepted enrollment with when it was asked and answered.
type load struct {
	t        *testing.T
	c        *apiClient
	courses  []string
	capacity int

	mu       sync.Mutex
	accepted map[string]claim // enrollment ID → its request
	answers  map[int]int      // HTTP status → count
	errs     int
	// inFlight holds the send time of each worker's request in progress
	// (zero when idle); failedAt the times of transport errors and 5xx.
	inFlight []time.Time
	failedAt []time.Time
	next     atomic.Int64
	stop     chan struct{}
	wg       sync.WaitGroup
}

// claim is one accepted enrollment as the client saw it.
type claim struct {
	course             string
	sentAt, acceptedAt time.Time
}

func startLoad(t *testing.T, c *apiClient, prefix string, courses, capacity, workers int) *load {
	t.Helper()
	l := &load{t: t, c: c, capacity: capacity, accepted: map[string]claim{}, answers: map[int]int{},
		inFlight: make([]time.Time, workers), stop: make(chan struct{})}
	for i := range courses {
		id := fmt.Sprintf("%s-%d", prefix, i)
		c.must("POST", "/v1/courses", map[string]any{"id": id, "title": id, "capacity": capacity}, http.StatusCreated)
		l.courses = append(l.courses, id)
	}
	for i := range workers {
		l.wg.Go(func() { l.run(i) })
	}
	return l
}

// addCourse opens one more course to the running load.
func (l *load) addCourse(id string) {
	l.t.Helper()
	l.c.must("POST", "/v1/courses", map[string]any{"id": id, "title": id, "capacity": l.capacity}, http.StatusCreated)
	l.mu.Lock()
	l.courses = append(l.courses, id)
	l.mu.Unlock()
}

func (l *load) run(worker int) {
	for {
		select {
		case <-l.stop:
			return
		default:
		}
		n := l.next.Add(1)
		sent := time.Now()
		l.mu.Lock()
		course := l.courses[rand.IntN(len(l.courses))]
		l.inFlight[worker] = sent
		l.mu.Unlock()
		st, body, err := l.c.do("POST", "/v1/courses/"+course+"/enrollments", map[string]any{"student_id": fmt.Sprintf("f-%06d", n)})
		l.mu.Lock()
		l.inFlight[worker] = time.Time{}
		switch {
		case err != nil:
			l.errs++
			l.failedAt = append(l.failedAt, time.Now())
		case st == http.StatusCreated:
			l.accepted[body["id"].(string)] = claim{course: course, sentAt: sent, acceptedAt: time.Now()}
			l.answers[st]++
		default:
			l.answers[st]++
			if st >= 500 {
				l.failedAt = append(l.failedAt, time.Now())
			}
		}
		l.mu.Unlock()
		if err != nil || st >= 500 {
			time.Sleep(200 * time.Millisecond) // a client backing off, not hammering a dead part
		} else {
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// acceptedSince counts the enrollments accepted after t0.
func (l *load) acceptedSince(t0 time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, c := range l.accepted {
		if c.acceptedAt.After(t0) {
			n++
		}
	}
	return n
}

// waitStalled waits until the fault begun at since holds up the load: a
// request sent after it has waited longer than stall, or failed. Faults that
// are "down, then up again" restart their part once this holds rather than
// after a guessed pause, so the fault is known to have caught work in flight.
func (l *load) waitStalled(t *testing.T, since time.Time, stall time.Duration) {
	t.Helper()
	waitFor(t, time.Minute, "the load to stall on the fault", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, sent := range l.inFlight {
			if !sent.IsZero() && !sent.Before(since) && time.Since(sent) >= stall {
				return true
			}
		}
		for _, at := range l.failedAt {
			if at.After(since) {
				return true
			}
		}
		return false
	})
	t.Logf("load stalled %s after the fault began", time.Since(since).Round(time.Millisecond))
}

func (l *load) finish() {
	close(l.stop)
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.t.Logf("load: %d accepted, answers %v, %d transport errors", len(l.accepted), l.answers, l.errs)
}

func faultLoadDuration() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("CLAIMFLOW_FAULT_LOAD")); err == nil && d > 0 {
		return d
	}
	return 20 * time.Second
}

// minAccepted is the fewest accepted claims a fault run may audit: with
// fewer, a run that accepted nothing (the fault took the API down for good)
// would pass.
const minAccepted = 50

// faultWindow is when the fault began and when the part was back.
type faultWindow struct{ start, end time.Time }

// drainAndAudit waits until every enrollment is terminal, retrying dead
// letters left by the fault, then checks the delivery guarantee
// (docs/testing.md): copies of an event on the topic share its ID and
// payload and are only reported; every effect of a claim (seat, event,
// notification, webhook effect) happens exactly once; every claim answered
// 201 ends confirmed (or failed only through an operator's compensation);
// and the fault caught work in flight.
func drainAndAudit(t *testing.T, s *stack, c *apiClient, l *load, fw faultWindow, activities activityAttempts) {
	t.Helper()
	ctx := context.Background()
	retried := map[string]bool{}
	waitFor(t, 4*time.Minute, "every enrollment terminal and every run closed", heldFor(3*time.Second, func() bool {
		_, body, err := c.do("GET", "/v1/dead-letters?status=open&limit=1000", nil)
		if err == nil {
			items, _ := body["dead_letters"].([]any)
			for _, it := range items {
				d := it.(map[string]any)
				id := fmt.Sprint(d["id"])
				st, _, err := c.do("POST", "/v1/dead-letters/"+id+"/retry", nil)
				if err == nil && st == http.StatusAccepted {
					retried[id] = true
				}
			}
		}
		var pending int
		err = s.Pool.QueryRow(ctx, `SELECT count(*) FROM enrollments WHERE course_id = ANY($1) AND status NOT IN ('confirmed', 'cancelled', 'failed')`,
			l.courses).Scan(&pending)
		return err == nil && pending == 0 && openRunsOf(t, s, l.courses...) == 0
	}))

	type enrollment struct {
		course, student, status string
		confirmedAt             time.Time // confirmed_at, else published_at; zero if neither
	}
	rows, err := s.Pool.Query(ctx, `
		SELECT id, course_id, student_id, status, coalesce(confirmed_at, published_at)
		FROM enrollments WHERE course_id = ANY($1)`, l.courses)
	if err != nil {
		t.Fatal(err)
	}
	enrollments := map[string]enrollment{}
	perCourse := map[string]int{}
	seats := map[string]int{} // course and student → confirmed enrollments
	for rows.Next() {
		var id string
		var e enrollment
		var at *time.Time
		if err := rows.Scan(&id, &e.course, &e.student, &e.status, &at); err != nil {
			t.Fatal(err)
		}
		if at != nil {
			e.confirmedAt = *at
		}
		enrollments[id] = e
		if e.status == "confirmed" {
			perCourse[e.course]++
			seats[e.course+"/"+e.student]++
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	compensated := map[string]bool{}
	rows, err = s.Pool.Query(ctx, `SELECT enrollment_id FROM dead_letters WHERE status = 'compensated' AND enrollment_id = ANY($1)`,
		slices.Collect(maps.Keys(enrollments)))
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		compensated[id] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}

	l.mu.Lock()
	accepted := maps.Clone(l.accepted)
	l.mu.Unlock()
	if len(accepted) < minAccepted {
		t.Errorf("only %d claims accepted, want at least %d: the run proves nothing about claims", len(accepted), minAccepted)
	}

	// A claim answered 201 ends confirmed; failed only if an operator
	// compensated its dead letter (this test never does).
	unkept := 0
	for id := range accepted {
		e := enrollments[id]
		if e.status == "confirmed" || (e.status == "failed" && compensated[id]) {
			continue
		}
		unkept++
		t.Errorf("accepted enrollment %s ended %q", id, e.status)
	}

	// A seat is taken once per claim, and never beyond capacity.
	oversold, duplicateSeats := 0, 0
	for _, course := range l.courses {
		var enrolled, capacity int
		if err := s.Pool.QueryRow(ctx, `SELECT enrolled, capacity FROM courses WHERE id = $1`, course).Scan(&enrolled, &capacity); err != nil {
			t.Fatal(err)
		}
		if enrolled > capacity || perCourse[course] > capacity || enrolled != perCourse[course] {
			oversold++
			t.Errorf("course %s: enrolled %d, confirmed %d, capacity %d", course, enrolled, perCourse[course], capacity)
		}
	}
	for k, n := range seats {
		if n > 1 {
			duplicateSeats += n - 1
			t.Errorf("student %s holds %d confirmed enrollments of one course", k, n)
		}
	}

	// The topic: at-least-once. Copies of an event share its ID and payload
	// and are counted as redelivered; anything else is a fault.
	topic := readEnrollmentCopies(t, s, workflows.EnrollmentTopic, l.courses)
	for _, id := range topic.mismatched {
		t.Errorf("copies of event %s differ in payload", id)
	}
	for _, d := range topic.claimDuplicates {
		t.Errorf("one claim published under two event IDs: %s", d)
	}
	for _, id := range topic.badIDs {
		t.Errorf("event %s: its ID is not the one derived from its enrollment", id)
	}
	missingEvents, unconfirmedWithEvent, stray := 0, 0, 0
	for id, e := range enrollments {
		if e.status == "confirmed" && topic.confirmed[id] == 0 {
			missingEvents++
			t.Errorf("confirmed enrollment %s has no enrollment.confirmed event", id)
		}
	}
	for id := range topic.confirmed {
		e, ok := enrollments[id]
		switch {
		case !ok:
			stray++
			t.Errorf("enrollment.confirmed event for unknown enrollment %q", id)
		case e.status != "confirmed":
			unconfirmedWithEvent++
			t.Errorf("enrollment %s ended %q but its enrollment.confirmed event is out", id, e.status)
		}
	}

	// The notification of each event: exactly one row, no row without an
	// event, and at the webhook one effect per key, re-sends under the
	// same key and body.
	waitCaughtUp(t, s, workflows.EnrollmentTopic, s.Config.ConsumerGroup, 2*time.Minute)
	rows, err = s.Pool.Query(ctx, `
		SELECT event_id, event_type, payload::text FROM notifications
		WHERE topic = $1 AND payload->'data'->>'course_id' = ANY($2)`, workflows.EnrollmentTopic, l.courses)
	if err != nil {
		t.Fatal(err)
	}
	notified := map[string]bool{}
	notesPerClaim := map[string]int{}
	for rows.Next() {
		var id, eventType, payload string
		if err := rows.Scan(&id, &eventType, &payload); err != nil {
			t.Fatal(err)
		}
		notified[id] = true
		notesPerClaim[audit.ClaimOf(eventType, []byte(payload))]++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	missingNotes, orphanNotes, duplicateNotes := 0, 0, 0
	for id := range topic.ids {
		if !notified[id] {
			missingNotes++
			t.Errorf("event %s has no notification", id)
		}
	}
	for id := range notified {
		if !topic.ids[id] {
			orphanNotes++
			t.Errorf("notification %s names no event on the topic", id)
		}
	}
	for claim, n := range notesPerClaim {
		if n > 1 {
			duplicateNotes += n - 1
			t.Errorf("%d notifications of one claim: %s", n, claim)
		}
	}
	var webhook notifysim.Ledger
	if s.Notify != nil {
		var ours []notifysim.Delivery
		for _, d := range s.Notify.Deliveries(workflows.EnrollmentTopic) {
			if topic.ids[d.Key] {
				ours = append(ours, d)
			}
		}
		webhook = notifysim.Summarize(ours)
		if webhook.Effects != len(notified) || !webhook.OK() {
			t.Errorf("webhook: %d effects for %d notifications; keys taking effect twice %v, keys with another body %v",
				webhook.Effects, len(notified), webhook.DoubleEffects, webhook.BodyChanged)
		}
	}

	// The fault hit work in flight: claims accepted before it began and
	// confirmed after, or claims asked before it ended and confirmed only
	// after the part was back, or activities it made run again.
	acceptedBefore, heldOver := 0, 0
	for id, cl := range accepted {
		at := enrollments[id].confirmedAt
		if at.IsZero() {
			continue
		}
		if cl.acceptedAt.Before(fw.start) && at.After(fw.start) {
			acceptedBefore++
		}
		if cl.sentAt.Before(fw.end) && at.After(fw.end) {
			heldOver++
		}
	}
	if acceptedBefore == 0 && heldOver == 0 && activities.retry == 0 {
		t.Errorf("the fault (%s to %s) hit no work in flight: no claim confirmed across it, no activity retried",
			fw.start.Format(time.StampMilli), fw.end.Format(time.StampMilli))
	}

	t.Logf("audit: %d accepted, %d enrollments (%d confirmed); unkept=%d oversold=%d duplicate_seats=%d "+
		"missing_events=%d confirmed_events_of_unconfirmed=%d stray_events=%d payload_mismatches=%d claim_duplicates=%d bad_event_ids=%d "+
		"missing_notifications=%d notifications_without_event=%d duplicate_notifications=%d "+
		"webhook_double_effects=%d webhook_body_changed=%d; "+
		"redelivered=%d (copies with the same event_id and payload), webhook_resent=%d, %d dead letters retried; "+
		"fault hit: %d accepted before it and confirmed after, %d asked before recovery and confirmed after, "+
		"%.0f activity retries (of %.0f attempts in the worker processes)",
		len(accepted), len(enrollments), sum(perCourse), unkept, oversold, duplicateSeats,
		missingEvents, unconfirmedWithEvent, stray, len(topic.mismatched), len(topic.claimDuplicates), len(topic.badIDs),
		missingNotes, orphanNotes, duplicateNotes, len(webhook.DoubleEffects), len(webhook.BodyChanged),
		topic.redelivered, webhook.Resent, len(retried), acceptedBefore, heldOver, activities.retry, activities.first+activities.retry)
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

type fault struct {
	name  string
	skip  func() string // reason to skip, or ""
	stack func(o *stackOptions)
	// inject breaks a part and brings it back; l tells when the load
	// stalled on it.
	inject func(t *testing.T, s *stack, l *load, w **workerProcess)
}

func TestFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("fault tests start the real stack; skipped with -short")
	}
	realKafkaDir := os.Getenv("CLAIMFLOW_FAULT_KAFKA_DIR")
	clusterDir := os.Getenv("CLAIMFLOW_FAULT_KAFKA_CLUSTER_DIR")
	clusterBrokers := os.Getenv("CLAIMFLOW_FAULT_KAFKA_CLUSTER_BROKERS")

	faults := []fault{
		{
			name: "worker killed with SIGKILL and restarted",
			inject: func(t *testing.T, s *stack, l *load, w **workerProcess) {
				killed := time.Now()
				(*w).kill()
				l.waitStalled(t, killed, time.Second)
				*w = startWorkerProcess(t, s)
			},
		},
		{
			name: "Kafka broker down for 20s",
			skip: func() string {
				if os.Getenv("CLAIMFLOW_TEST_KAFKA_BROKERS") != "" && realKafkaDir == "" {
					return "real broker given without CLAIMFLOW_FAULT_KAFKA_DIR to stop it"
				}
				return ""
			},
			inject: func(t *testing.T, s *stack, l *load, w **workerProcess) {
				// The 20 s are the fault: the broker stays down that long.
				if realKafkaDir != "" {
					kafkaScript(t, "kill-node", "0", "--dir", realKafkaDir)
					time.Sleep(20 * time.Second)
					kafkaScript(t, "start-node", "0", "--dir", realKafkaDir)
					return
				}
				port := s.Options.KafkaPort
				s.Kafka.Close()
				time.Sleep(20 * time.Second)
				k, err := devstack.StartKafka(context.Background(), devstack.KafkaOptions{
					DataDir: filepath.Join(s.Options.DataDir, "kafka"), Port: port, Topics: services.Topics,
				})
				if err != nil {
					t.Fatalf("restart kfake: %v", err)
				}
				s.Kafka = k
			},
		},
		{
			name: "PostgreSQL restarted",
			stack: func(o *stackOptions) {
				o.DatabaseURL = "" // the test needs its own cluster to restart
			},
			inject: func(t *testing.T, s *stack, l *load, w **workerProcess) {
				ctx := context.Background()
				stopped := time.Now()
				if err := s.Postgres.Stop(ctx); err != nil {
					t.Fatalf("stop postgres: %v", err)
				}
				l.waitStalled(t, stopped, time.Second)
				pg, err := devstack.StartPostgres(ctx, devstack.PostgresOptions{
					DataDir: filepath.Join(s.Options.DataDir, "pg"), Port: s.Options.PGPort,
					LogFile: filepath.Join(s.Options.DataDir, "logs", "postgres.log"),
				})
				if err != nil {
					t.Fatalf("restart postgres: %v", err)
				}
				s.Postgres = pg
			},
		},
		{
			name: "Temporal server killed and restarted",
			inject: func(t *testing.T, s *stack, l *load, w **workerProcess) {
				killed := time.Now()
				if err := s.Temporal.Kill(); err != nil {
					t.Fatal(err)
				}
				l.waitStalled(t, killed, time.Second)
				bin, err := devstack.TemporalCLI(context.Background(), testWriter{t})
				if err != nil {
					t.Fatal(err)
				}
				ts, err := devstack.StartTemporal(context.Background(), devstack.TemporalOptions{
					Binary: bin, DBFile: filepath.Join(s.Options.DataDir, "temporal.db"),
					Port: s.Options.TemporalPort, UIPort: s.Options.UIPort, Namespace: s.Config.Namespace,
					SearchAttributes: workflows.SearchAttributeTypes, Headless: true,
					DynamicConfig: services.TemporalDynamicConfig,
					LogFile:       filepath.Join(s.Options.DataDir, "logs", "temporal.log"),
				})
				if err != nil {
					t.Fatalf("restart temporal: %v", err)
				}
				s.Temporal = ts
			},
		},
		{
			name: "partition leader killed in a 3-broker cluster",
			skip: func() string {
				if clusterDir == "" || clusterBrokers == "" {
					return "needs CLAIMFLOW_FAULT_KAFKA_CLUSTER_DIR and _BROKERS (a 3-node cluster from deploy/kafka/kafka.sh)"
				}
				return ""
			},
			stack: func(o *stackOptions) {
				o.KafkaBrokers = strings.Split(clusterBrokers, ",")
				o.KafkaReplicas = 3
			},
			inject: func(t *testing.T, s *stack, l *load, w **workerProcess) {
				leader := partitionLeader(t, s.Config.KafkaBrokers, workflows.EnrollmentTopic)
				t.Logf("killing broker %d, leader of %s/0", leader, workflows.EnrollmentTopic)
				kafkaScript(t, "kill-node", fmt.Sprint(leader), "--dir", clusterDir)
				time.Sleep(15 * time.Second) // the fault: the old leader stays down that long
				kafkaScript(t, "start-node", fmt.Sprint(leader), "--dir", clusterDir)
			},
		},
	}

	for i, f := range faults {
		t.Run(f.name, func(t *testing.T) {
			if f.skip != nil {
				if why := f.skip(); why != "" {
					t.Skip(why)
				}
			}
			o := testStackOptions(t, dataDir(t))
			o.NoWorker = true
			if f.stack != nil {
				f.stack(&o)
			}
			s := startTestStack(t, o)
			w := startWorkerProcess(t, s)
			t.Cleanup(func() {
				if !t.Failed() {
					return
				}
				if b, err := os.ReadFile(w.log); err == nil {
					t.Logf("worker log tail:\n%s", tail(b, 40))
				}
				rows, err := s.Pool.Query(context.Background(), `SELECT status, count(*) FROM enrollments GROUP BY status`)
				if err == nil {
					for rows.Next() {
						var st string
						var n int
						_ = rows.Scan(&st, &n)
						t.Logf("enrollments %s: %d", st, n)
					}
					rows.Close()
				}
			})
			c := newAPIClient(t, s)
			c.http.Timeout = 20 * time.Second

			loadFor := faultLoadDuration()
			// Courses fill up before the load ends, so refusals race with the fault.
			// about 100 seats a second for the whole load: seats run out
			// around the middle, after the fault, under a client that
			// manages 100–200 requests a second.
			// Course IDs new to this run: a real broker kept between runs
			// still holds the events of earlier runs' courses, which the
			// audit would count as events of enrollments it never made.
			prefix := fmt.Sprintf("fault%d-%x", i, time.Now().UnixNano())
			l := startLoad(t, c, prefix, 4, 25*int(loadFor/time.Second), 4)
			loadBegan := time.Now()
			// The fault comes a third into the load, once claims flow, so
			// there is work in flight for it to hit.
			waitFor(t, loadFor+time.Minute, "the load flowing for a third of its time", func() bool {
				return time.Since(loadBegan) >= loadFor/3 && l.acceptedSince(loadBegan) >= 10
			})
			var fw faultWindow
			fw.start = time.Now()
			killed := w
			f.inject(t, s, l, &w)
			fw.end = time.Now()
			t.Logf("fault injected and recovered in %s", fw.end.Sub(fw.start).Round(time.Millisecond))
			// The rest of the load runs on the recovered stack, which must
			// accept claims again. A long outage (a real broker's restart)
			// can leave the first courses full by now, so one more course
			// opens: claims for it are only accepted after recovery.
			l.addCourse(prefix + "-after")
			waitFor(t, loadFor+2*time.Minute, "the rest of the load, with claims accepted after recovery", func() bool {
				return time.Since(fw.end) >= loadFor*2/3 && l.acceptedSince(fw.end) >= 1
			})
			l.finish()
			// The drain below may retry more; what the fault itself caused
			// is what the workers counted by now.
			attempts := w.activityAttempts()
			if killed != w {
				attempts = attempts.add(killed.attempts)
			}
			drainAndAudit(t, s, c, l, fw, attempts)
		})
	}
}

func tail(b []byte, n int) string {
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

func kafkaScript(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command("../../deploy/kafka/kafka.sh", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("kafka.sh %v: %v\n%s", args, err, out)
	}
}

func partitionLeader(t *testing.T, brokers []string, topic string) int32 {
	t.Helper()
	cfg := sarama.NewConfig()
	v, _ := sarama.ParseKafkaVersion(kafka.DefaultVersion)
	cfg.Version = v
	client, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	b, err := client.Leader(topic, 0)
	if err != nil {
		t.Fatal(err)
	}
	return b.ID()
}
