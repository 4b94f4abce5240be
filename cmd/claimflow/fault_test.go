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
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/claimflow/claimflow/activities"
	"github.com/claimflow/claimflow/deploy/devstack"
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
	t   *testing.T
	cmd *exec.Cmd
	log string
}

func startWorkerProcess(t *testing.T, s *stack) *workerProcess {
	t.Helper()
	logFile := filepath.Join(s.opts.DataDir, "logs", fmt.Sprintf("worker-%d.log", time.Now().UnixNano()))
	f, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(claimflowBinary(t), "worker")
	cmd.Env = append(os.Environ(),
		"DATABASE_URL="+s.Config.DatabaseURL,
		"TEMPORAL_ADDRESS="+s.Config.TemporalAddress,
		"TEMPORAL_NAMESPACE="+s.Config.Namespace,
		"KAFKA_BROKERS="+strings.Join(s.Config.KafkaBrokers, ","),
		"KAFKA_VERSION="+s.Config.KafkaVersion,
		"METRICS_ADDR=127.0.0.1:0",
		"LOG_LEVEL=warn",
	)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	w := &workerProcess{t: t, cmd: cmd, log: logFile}
	t.Cleanup(func() { w.kill() })
	return w
}

func (w *workerProcess) kill() {
	if w.cmd.ProcessState == nil {
		_ = w.cmd.Process.Kill()
		_ = w.cmd.Wait()
	}
}

// load drives enrollments at a modest rate into a few courses that fill up,
// recording every accepted enrollment.
type load struct {
	t        *testing.T
	c        *apiClient
	courses  []string
	capacity int

	mu       sync.Mutex
	accepted map[string]string // enrollment ID → course
	answers  map[int]int       // HTTP status → count
	errs     int
	next     atomic.Int64
	stop     chan struct{}
	wg       sync.WaitGroup
}

func startLoad(t *testing.T, c *apiClient, prefix string, courses, capacity, workers int) *load {
	t.Helper()
	l := &load{t: t, c: c, capacity: capacity, accepted: map[string]string{}, answers: map[int]int{}, stop: make(chan struct{})}
	for i := range courses {
		id := fmt.Sprintf("%s-%d", prefix, i)
		c.must("POST", "/v1/courses", map[string]any{"id": id, "title": id, "capacity": capacity}, http.StatusCreated)
		l.courses = append(l.courses, id)
	}
	for range workers {
		l.wg.Go(l.run)
	}
	return l
}

func (l *load) run() {
	for {
		select {
		case <-l.stop:
			return
		default:
		}
		n := l.next.Add(1)
		course := l.courses[rand.IntN(len(l.courses))]
		st, body, err := l.c.do("POST", "/v1/courses/"+course+"/enrollments", map[string]any{"student_id": fmt.Sprintf("f-%06d", n)})
		l.mu.Lock()
		switch {
		case err != nil:
			l.errs++
		case st == http.StatusCreated:
			l.accepted[body["id"].(string)] = course
			fallthrough
		default:
			l.answers[st]++
		}
		l.mu.Unlock()
		if err != nil || st >= 500 {
			time.Sleep(200 * time.Millisecond) // a client backing off, not hammering a dead part
		} else {
			time.Sleep(20 * time.Millisecond)
		}
	}
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

// drainAndAudit waits until every enrollment is terminal, retrying dead
// letters left by the fault, then checks the guarantees.
func drainAndAudit(t *testing.T, s *stack, c *apiClient, l *load) {
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

	rows, err := s.Pool.Query(ctx, `SELECT id, course_id, status FROM enrollments WHERE course_id = ANY($1)`, l.courses)
	if err != nil {
		t.Fatal(err)
	}
	status := map[string]string{}
	perCourse := map[string]int{}
	for rows.Next() {
		var id, course, st string
		if err := rows.Scan(&id, &course, &st); err != nil {
			t.Fatal(err)
		}
		status[id] = st
		if st == "confirmed" {
			perCourse[course]++
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}

	lost := 0
	for id := range l.accepted {
		if st := status[id]; st != "confirmed" && st != "failed" {
			lost++
			t.Errorf("accepted enrollment %s ended %q", id, st)
		}
	}
	oversold := 0
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

	inCourses := map[string]bool{}
	for _, c := range l.courses {
		inCourses[c] = true
	}
	var events []workflows.Event
	for _, e := range topicEvents(t, s, workflows.EnrollmentTopic) {
		if course, _ := e.Data["course_id"].(string); inCourses[course] {
			events = append(events, e)
		}
	}
	confirmedEvents := eventsFor(events, workflows.EventEnrollmentConfirmed)
	missing, redelivered, stray := 0, 0, 0
	for id, st := range status {
		n := confirmedEvents[id]
		switch {
		case st == "confirmed" && n == 0:
			missing++
			t.Errorf("confirmed enrollment %s has no enrollment.confirmed event", id)
		case n > 1:
			// Same event ID again: an ack the killed part never recorded.
			redelivered += n - 1
		}
	}
	for id := range confirmedEvents {
		if _, ok := status[id]; !ok {
			stray++
			t.Errorf("event for unknown enrollment %q (a bad event ID shows up here too)", id)
		}
	}
	t.Logf("audit: %d accepted, %d enrollments (%d confirmed), lost=%d missing_events=%d duplicate_events=%d oversold=%d; "+
		"%d redelivered copies with the same event_id (dedupable), %d dead letters retried",
		len(l.accepted), len(status), sum(perCourse), lost, missing, stray, oversold, redelivered, len(retried))
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

type fault struct {
	name   string
	skip   func() string // reason to skip, or ""
	stack  func(o *stackOptions)
	inject func(t *testing.T, s *stack, w **workerProcess)
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
			inject: func(t *testing.T, s *stack, w **workerProcess) {
				(*w).kill()
				time.Sleep(3 * time.Second)
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
			inject: func(t *testing.T, s *stack, w **workerProcess) {
				if realKafkaDir != "" {
					kafkaScript(t, "kill-node", "0", "--dir", realKafkaDir)
					time.Sleep(20 * time.Second)
					kafkaScript(t, "start-node", "0", "--dir", realKafkaDir)
					return
				}
				port := s.opts.KafkaPort
				s.Kafka.Close()
				time.Sleep(20 * time.Second)
				k, err := devstack.StartKafka(context.Background(), devstack.KafkaOptions{
					DataDir: filepath.Join(s.opts.DataDir, "kafka"), Port: port, Topics: topics,
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
			inject: func(t *testing.T, s *stack, w **workerProcess) {
				ctx := context.Background()
				if err := s.Postgres.Stop(ctx); err != nil {
					t.Fatalf("stop postgres: %v", err)
				}
				time.Sleep(2 * time.Second)
				pg, err := devstack.StartPostgres(ctx, devstack.PostgresOptions{
					DataDir: filepath.Join(s.opts.DataDir, "pg"), Port: s.opts.PGPort,
					LogFile: filepath.Join(s.opts.DataDir, "logs", "postgres.log"),
				})
				if err != nil {
					t.Fatalf("restart postgres: %v", err)
				}
				s.Postgres = pg
			},
		},
		{
			name: "Temporal server killed and restarted",
			inject: func(t *testing.T, s *stack, w **workerProcess) {
				if err := s.Temporal.Kill(); err != nil {
					t.Fatal(err)
				}
				time.Sleep(2 * time.Second)
				bin, err := devstack.TemporalCLI(context.Background(), testWriter{t})
				if err != nil {
					t.Fatal(err)
				}
				ts, err := devstack.StartTemporal(context.Background(), devstack.TemporalOptions{
					Binary: bin, DBFile: filepath.Join(s.opts.DataDir, "temporal.db"),
					Port: s.opts.TemporalPort, UIPort: s.opts.UIPort, Namespace: s.Config.Namespace,
					SearchAttributes: workflows.SearchAttributeTypes, Headless: true,
					DynamicConfig: temporalDynamicConfig,
					LogFile:       filepath.Join(s.opts.DataDir, "logs", "temporal.log"),
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
			inject: func(t *testing.T, s *stack, w **workerProcess) {
				leader := partitionLeader(t, s.Config.KafkaBrokers, workflows.EnrollmentTopic)
				t.Logf("killing broker %d, leader of %s/0", leader, workflows.EnrollmentTopic)
				kafkaScript(t, "kill-node", fmt.Sprint(leader), "--dir", clusterDir)
				time.Sleep(15 * time.Second)
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
			l := startLoad(t, c, fmt.Sprintf("fault%d", i), 4, 25*int(loadFor/time.Second), 4)
			time.Sleep(loadFor / 3)
			began := time.Now()
			f.inject(t, s, &w)
			t.Logf("fault injected and recovered in %s", time.Since(began).Round(time.Millisecond))
			time.Sleep(loadFor * 2 / 3)
			l.finish()
			drainAndAudit(t, s, c, l)
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
	v, _ := sarama.ParseKafkaVersion(activities.DefaultKafkaVersion)
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
