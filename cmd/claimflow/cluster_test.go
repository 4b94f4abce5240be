package main

// The production shape (issue 41): `claimflow dev --shape cluster` run as a
// user runs it, a Temporal server of five processes on PostgreSQL, three
// Apache Kafka brokers, two APIs, two workers and a consumer, then the
// walk-through on it and faults under load. It needs a checkout with Java
// and Maven (deploy/kafka/kafka.sh) and builds the Temporal server once
// (deploy/temporal/server.sh fetch), so it runs only where
// CLAIMFLOW_CLUSTER_TEST=1: CI's "production shape" step.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"

	"github.com/claimflow/claimflow/bench"
	"github.com/claimflow/claimflow/cmd/internal/services"
	"github.com/claimflow/claimflow/dev/devstack"
	appconfig "github.com/claimflow/claimflow/internal/config"
	"github.com/claimflow/claimflow/workflows"
)

// clusterUnderTest is a running `claimflow dev --shape cluster`.
type clusterUnderTest struct {
	dir  string
	env  map[string]string // the last line it printed
	apis []string
	pool *pgxpool.Pool
	// temporal and kafka are the script handles for kill-node and
	// start-node.
	temporal, kafka *devstack.ScriptCluster
}

func startClusterUnderTest(t *testing.T) *clusterUnderTest {
	t.Helper()
	dir := dataDir(t)
	cmd := exec.Command(claimflowBinary(t), append([]string{"dev", "--shape", "cluster", "--data-dir", dir}, freeClusterPorts(t)...)...)
	cmd.Dir = "../.."
	logPath := filepath.Join(dir, "cluster.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = logFile
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(3 * time.Minute):
			_ = cmd.Process.Kill()
			t.Errorf("claimflow dev --shape cluster did not stop within 3 minutes")
		}
		if t.Failed() {
			logStackFiles(t, dir)
		}
		if !cmd.ProcessState.Success() {
			t.Errorf("claimflow dev --shape cluster stopped with %v", cmd.ProcessState)
		}
	})
	var last string
	timeout := time.After(15 * time.Minute) // a first fetch builds the Temporal server
	for last == "" {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatal("claimflow dev --shape cluster exited before it was ready; its logs follow")
			}
			if strings.Contains(line, "CLAIMFLOW_API_URLS=") {
				last = line
			}
		case <-timeout:
			t.Fatal("claimflow dev --shape cluster not ready in 15 minutes")
		}
	}
	c := &clusterUnderTest{dir: dir, env: parseShellLine(t, last)}
	c.apis = strings.Split(c.env["CLAIMFLOW_API_URLS"], ",")
	secret, err := os.ReadFile(filepath.Join(dir, appconfig.SecretFile))
	if err != nil {
		t.Fatal(err)
	}
	c.env["JWT_SECRET"] = strings.TrimSpace(string(secret))
	t.Logf("cluster up in %s: %s", time.Since(began).Round(time.Millisecond), last)
	if len(c.apis) != services.ClusterAPIs {
		t.Fatalf("CLAIMFLOW_API_URLS = %v, want %d APIs", c.apis, services.ClusterAPIs)
	}
	script, err := devstack.RepoScript("deploy/temporal/server.sh")
	if err != nil {
		t.Fatal(err)
	}
	c.temporal = &devstack.ScriptCluster{Script: script, Dir: filepath.Join(dir, "temporal-cluster"), LogFile: filepath.Join(dir, "logs", "temporal-cluster.log")}
	script, err = devstack.RepoScript("deploy/kafka/kafka.sh")
	if err != nil {
		t.Fatal(err)
	}
	c.kafka = &devstack.ScriptCluster{Script: script, Dir: filepath.Join(dir, "kafka-cluster"), LogFile: filepath.Join(dir, "logs", "kafka-cluster.log")}
	c.pool, err = pgxpool.New(context.Background(), c.env["DATABASE_URL"])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.pool.Close)
	return c
}

// parseShellLine reads NAME=value and NAME='value' pairs; a $(cat FILE)
// value is left as written.
func parseShellLine(t *testing.T, line string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for rest := strings.TrimSpace(line); rest != ""; rest = strings.TrimSpace(rest) {
		name, after, ok := strings.Cut(rest, "=")
		if !ok {
			t.Fatalf("not NAME=value: %q", rest)
		}
		var value string
		switch {
		case strings.HasPrefix(after, "'"):
			end := strings.Index(after[1:], "'")
			value, rest = after[1:end+1], after[end+2:]
		case strings.HasPrefix(after, "$("):
			end := strings.Index(after, ")")
			value, rest = after[:end+1], after[end+1:]
		default:
			value, rest, _ = strings.Cut(after, " ")
		}
		out[name] = value
	}
	return out
}

// client speaks to API i as an admin.
func (c *clusterUnderTest) client(t *testing.T, i int) *apiClient {
	token, err := mintToken(c.env["JWT_SECRET"], "cluster-admin", "admin", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return &apiClient{t: t, base: c.apis[i%len(c.apis)], token: token, http: &http.Client{
		Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64},
	}}
}

// stack is what the stack helpers need of it: the addresses and a pool.
func (c *clusterUnderTest) stack() *stack {
	s := &stack{Pool: c.pool}
	s.Config.KafkaBrokers = strings.Split(c.env["KAFKA_BROKERS"], ",")
	s.Config.TemporalAddress = c.env["TEMPORAL_ADDRESS"]
	return s
}

// freeClusterPorts is no flags when every default port of the production
// shape is free. Otherwise it logs who holds them and moves every base by
// the first multiple of 1,000 whose ports are all free: a machine may run
// something on the defaults, and the test is about the shape, not them.
func freeClusterPorts(t *testing.T) []string {
	t.Helper()
	r := services.Replicas{APIs: services.ClusterAPIs, Workers: services.ClusterWorkers}
	for shift := 0; shift <= 4000; shift += 1000 {
		o := clusterOptions(t)
		for _, p := range []*int{&o.TemporalPort, &o.KafkaPort, &o.PGPort, &o.PayoutPort, &o.NotifyPort, &o.MetricsPort} {
			*p += shift
		}
		api := services.ClusterPorts.API + shift
		o.HTTPAddr = fmt.Sprintf("127.0.0.1:%d", api)
		ports, err := services.ClusterPortList(o, r)
		if err != nil {
			t.Fatal(err)
		}
		var busy []string
		for _, p := range ports {
			if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p.Port)); err != nil {
				out, _ := exec.Command("ss", "-ltnpH", fmt.Sprintf("sport = :%d", p.Port)).CombinedOutput()
				busy = append(busy, fmt.Sprintf("%d (%s): %s", p.Port, p.What, strings.TrimSpace(string(out))))
			} else {
				_ = l.Close()
			}
		}
		if len(busy) == 0 {
			if shift == 0 {
				return nil
			}
			return []string{"--temporal-port", strconv.Itoa(o.TemporalPort), "--kafka-port", strconv.Itoa(o.KafkaPort),
				"--pg-port", strconv.Itoa(o.PGPort), "--payout-port", strconv.Itoa(o.PayoutPort), "--notify-port", strconv.Itoa(o.NotifyPort),
				"--metrics-port", strconv.Itoa(o.MetricsPort), "--http-addr", o.HTTPAddr}
		}
		t.Logf("ports in use with the bases moved by %d, so moving them further:\n  %s", shift, strings.Join(busy, "\n  "))
	}
	t.Fatal("no set of the production shape's ports is free")
	return nil
}

// logStackFiles logs the tails of the stack's own logs, one test line per
// log line and each cut short: CI keeps a test's last lines at 400
// characters each, and an error that quotes a log in one line loses it.
func logStackFiles(t *testing.T, dir string) {
	t.Helper()
	files := []string{filepath.Join(dir, "cluster.log"), filepath.Join(dir, "logs", "temporal-cluster.log"),
		filepath.Join(dir, "temporal-cluster", "schema.log"), filepath.Join(dir, "logs", "kafka-cluster.log")}
	nodes, _ := filepath.Glob(filepath.Join(dir, "temporal-cluster", "nodes", "*", "server.log"))
	for _, f := range append(files, nodes...) {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		t.Logf("--- last lines of %s", f)
		for line := range strings.SplitSeq(tail(b, 40), "\n") {
			if len(line) > 300 {
				line = line[:300] + "…"
			}
			t.Log(logLine + line)
		}
	}
}

// cmdEnv is the environment of a claimflow command against the cluster.
func (c *clusterUnderTest) cmdEnv() []string {
	env := os.Environ()
	for k, v := range c.env {
		env = append(env, k+"="+v)
	}
	return env
}

func TestProductionShape(t *testing.T) {
	if os.Getenv("CLAIMFLOW_CLUSTER_TEST") == "" {
		t.Skip("set CLAIMFLOW_CLUSTER_TEST=1 to start the production shape (Java, Maven and a Temporal server build; CI's production-shape step)")
	}
	c := startClusterUnderTest(t)
	t.Run("walk-through", func(t *testing.T) { clusterWalkthrough(t, c) })
	t.Run("history process killed under load", func(t *testing.T) {
		clusterFault(t, c, "history", func(t *testing.T) time.Time {
			ctx := context.Background()
			// The node that owns the first desk's shard: its claims are
			// the ones in flight there.
			node := c.historyNodeOf(t, "enrollment-desk:0")
			t.Logf("killing %s, owner of enrollment-desk:0's shard", node)
			at := time.Now()
			if err := c.temporal.KillNode(ctx, node); err != nil {
				t.Fatal(err)
			}
			time.Sleep(5 * time.Second) // the fault: down that long
			if err := c.temporal.StartNode(ctx, node); err != nil {
				t.Fatal(err)
			}
			return at
		})
	})
	t.Run("worker killed under load", func(t *testing.T) {
		clusterFault(t, c, "worker", func(t *testing.T) time.Time {
			// The worker that holds the first desk (its sticky queue),
			// frozen first, so that the tasks matching hands it in the
			// meantime are in its hands when it dies, as with a crash
			// mid-task; a worker killed between two tasks leaves nothing
			// to recover.
			pid, pidFile, at := c.freezeDeskWorker(t, "enrollment-desk:0")
			t.Logf("killing %s (pid %d), frozen with enrollment-desk:0's workflow task", filepath.Base(pidFile), pid)
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			// No operator: the stack starts it again, as a Deployment does.
			waitFor(t, time.Minute, "the worker started again", func() bool { return readPID(t, pidFile) != pid })
			return at
		})
	})
	t.Run("API killed under load", func(t *testing.T) {
		clusterFault(t, c, "api", func(t *testing.T) time.Time {
			// Its clients' connections break; new requests go to the
			// other API (the bench's clients try the next on a refused
			// connection, as behind a load balancer).
			pidFile := filepath.Join(c.dir, "run", "api-1.pid")
			pid := readPID(t, pidFile)
			at := time.Now()
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			waitFor(t, time.Minute, "api-1 started again", func() bool { return readPID(t, pidFile) != pid })
			return at
		})
	})
	t.Run("PostgreSQL restarted under load", func(t *testing.T) {
		clusterFault(t, c, "postgres", func(t *testing.T) time.Time {
			at := time.Now()
			restartPostgres(t, filepath.Join(c.dir, "pg"))
			return at
		})
	})
	t.Run("Kafka partition leader killed under load", func(t *testing.T) {
		clusterFault(t, c, "kafka", func(t *testing.T) time.Time {
			ctx := context.Background()
			leader := partitionLeader(t, c.stack().Config.KafkaBrokers, workflows.EnrollmentTopic)
			t.Logf("killing broker %d, leader of %s/0", leader, workflows.EnrollmentTopic)
			at := time.Now()
			if err := c.kafka.KillNode(ctx, strconv.Itoa(int(leader))); err != nil {
				t.Fatal(err)
			}
			time.Sleep(15 * time.Second) // the fault: the old leader stays down that long
			if err := c.kafka.StartNode(ctx, strconv.Itoa(int(leader))); err != nil {
				t.Fatal(err)
			}
			return at
		})
	})
}

// restartPostgres restarts the cluster in dataDir with pg_ctl, fast mode
// (open connections are cut), as the user that owns it.
func restartPostgres(t *testing.T, dataDir string) {
	t.Helper()
	pidLine, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, _, _ := strings.Cut(string(pidLine), "\n")
	exe, err := os.Readlink("/proc/" + pid + "/exe")
	if err != nil {
		t.Fatal(err)
	}
	argv := []string{filepath.Join(filepath.Dir(exe), "pg_ctl"), "restart", "-D", dataDir, "-m", "fast", "-w", "-t", "60", "-l", filepath.Join(dataDir, "restart.log")}
	var st syscall.Stat_t
	if err := syscall.Stat(dataDir, &st); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 && st.Uid != 0 {
		argv = append([]string{"setpriv", "--reuid", strconv.Itoa(int(st.Uid)), "--regid", strconv.Itoa(int(st.Gid)), "--clear-groups", "--"}, argv...)
	}
	if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%v: %v\n%s", argv, err, out)
	}
}

// historyNodeOf is the history process (history-1 or history-2) that owns
// the shard of workflowID's run, read from the server's own tables: the
// shard of the run in current_executions, and the owner's address in that
// shard's record (server.sh gives history-1 the gRPC port base+1 and
// history-2 base+3).
func (c *clusterUnderTest) historyNodeOf(t *testing.T, workflowID string) string {
	t.Helper()
	u, err := url.Parse(c.env["DATABASE_URL"])
	if err != nil {
		t.Fatal(err)
	}
	u.User, u.Path = url.User(devstack.Superuser), "/temporal"
	ctx := context.Background()
	db, err := pgxpool.New(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	host, port, _ := strings.Cut(c.env["TEMPORAL_ADDRESS"], ":")
	base, _ := strconv.Atoi(port)
	var shard int
	if err := db.QueryRow(ctx, `SELECT shard_id FROM current_executions WHERE workflow_id = $1 LIMIT 1`, workflowID).Scan(&shard); err != nil {
		t.Fatalf("the shard of %s: %v", workflowID, err)
	}
	for _, n := range []struct {
		node string
		port int
	}{{"history-1", base + 1}, {"history-2", base + 3}} {
		var owns bool
		if err := db.QueryRow(ctx, `SELECT position(convert_to($2, 'UTF8') in data) > 0 FROM shards WHERE shard_id = $1`,
			shard, fmt.Sprintf("%s:%d", host, n.port)).Scan(&owns); err != nil {
			t.Fatalf("the owner of shard %d: %v", shard, err)
		}
		if owns {
			return n.node
		}
	}
	t.Fatalf("no history node named as the owner of shard %d", shard)
	return ""
}

// lastTaskWorker is the PID of the worker process that completed the last
// workflow task of workflowID's current run (the SDK's identity of a worker
// starts with its PID), and the path of its PID file; 0 and "" when the run
// has completed none yet.
func (c *clusterUnderTest) lastTaskWorker(t *testing.T, tc client.Client, workflowID string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	identity := ""
	it := tc.GetWorkflowHistory(ctx, workflowID, "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for it.HasNext() {
		e, err := it.Next()
		if err != nil {
			t.Fatal(err)
		}
		if a := e.GetWorkflowTaskCompletedEventAttributes(); a != nil {
			identity = a.GetIdentity()
		}
	}
	if identity == "" {
		return 0, ""
	}
	pid, _, _ := strings.Cut(identity, "@")
	for i := 1; i <= services.ClusterWorkers; i++ {
		f := filepath.Join(c.dir, "run", fmt.Sprintf("worker-%d.pid", i))
		if p := readPID(t, f); strconv.Itoa(p) == pid {
			return p, f
		}
	}
	t.Fatalf("no worker process has the identity %q of %s's last workflow task", identity, workflowID)
	return 0, ""
}

// freezeDeskWorker stops (SIGSTOP) the worker that holds workflowID, a
// desk, and returns its PID, its PID file and when it was frozen, once the
// desk is seen waiting on it. A desk continues as new every few seconds
// and its new run's first task may go to the other worker, so a worker
// frozen just as that happens holds no desk: it is let go and the next one
// tried. A run that completes no task in a second while claims keep coming
// waits on the frozen worker.
func (c *clusterUnderTest) freezeDeskWorker(t *testing.T, workflowID string) (int, string, time.Time) {
	t.Helper()
	tc, err := client.Dial(client.Options{HostPort: c.env["TEMPORAL_ADDRESS"], Logger: quietLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	for try := 1; try <= 10; try++ {
		pid, pidFile := c.lastTaskWorker(t, tc, workflowID)
		if pid == 0 {
			time.Sleep(200 * time.Millisecond)
			continue
		}
		at := time.Now()
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		if now, _ := c.lastTaskWorker(t, tc, workflowID); now == pid || now == 0 {
			return pid, pidFile, at
		}
		t.Logf("%s moved off %s (pid %d) while it was frozen; letting it go", workflowID, filepath.Base(pidFile), pid)
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)
	}
	t.Fatalf("%s moved off every worker frozen in 10 tries", workflowID)
	return 0, "", time.Time{}
}

func readPID(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

func clusterWalkthrough(t *testing.T, c *clusterUnderTest) {
	a, b := c.client(t, 0), c.client(t, 1)
	id := func(m map[string]any) string { s, _ := m["id"].(string); return s }
	status := func(m map[string]any) string { s, _ := m["status"].(string); return s }
	p := fmt.Sprintf("wt%x", time.Now().UnixNano()%1e8)

	// Enroll, with and without wait=confirmed, on either API.
	a.must("POST", "/v1/courses", map[string]any{"id": p + "-a", "title": "A", "capacity": 5}, http.StatusCreated)
	e1 := a.must("POST", "/v1/courses/"+p+"-a/enrollments", map[string]any{"student_id": "s1"}, http.StatusCreated)
	if st := status(e1); st != "reserved" && st != "confirmed" {
		t.Errorf("enroll: status %q", st)
	}
	e2 := b.must("POST", "/v1/courses/"+p+"-a/enrollments?wait=confirmed", map[string]any{"student_id": "s2"}, http.StatusCreated)
	if st := status(e2); st != "confirmed" {
		t.Errorf("enroll with wait=confirmed: status %q", st)
	}
	waitFor(t, time.Minute, "s1's enrollment confirmed", func() bool {
		return status(a.must("GET", "/v1/enrollments/"+id(e1), nil, http.StatusOK)) == "confirmed"
	})

	// A hot course: 60 students at once through both APIs, 10 seats.
	const seats, students = 10, 60
	hot := p + "-hot"
	a.must("POST", "/v1/courses", map[string]any{"id": hot, "title": "Hot", "capacity": seats}, http.StatusCreated)
	codes := make([]int, students)
	var wg sync.WaitGroup
	for i := range students {
		wg.Go(func() {
			cl := []*apiClient{a, b}[i%2]
			st, body, err := cl.do("POST", "/v1/courses/"+hot+"/enrollments", map[string]any{"student_id": fmt.Sprintf("h%d", i)})
			if err != nil {
				t.Errorf("hot course: %v", err)
			}
			if st == http.StatusConflict && errorCode(body) != "course_full" {
				t.Errorf("hot course: 409 %v", body)
			}
			codes[i] = st
		})
	}
	wg.Wait()
	got := map[int]int{}
	for _, st := range codes {
		got[st]++
	}
	if got[http.StatusCreated] != seats || got[http.StatusConflict] != students-seats {
		t.Errorf("hot course answers %v, want %d×201 and %d×409", got, seats, students-seats)
	}

	// The waitlist: a full course, a student waiting, a cancellation, a
	// promotion on the topic.
	wl := p + "-wl"
	a.must("POST", "/v1/courses", map[string]any{"id": wl, "title": "WL", "capacity": 1}, http.StatusCreated)
	holder := a.must("POST", "/v1/courses/"+wl+"/enrollments?wait=confirmed", map[string]any{"student_id": "w1"}, http.StatusCreated)
	waiting := b.must("POST", "/v1/courses/"+wl+"/enrollments", map[string]any{"student_id": "w2", "waitlist": true}, http.StatusAccepted)
	if st := status(waiting); st != "waitlisted" {
		t.Errorf("waitlist join: status %q", st)
	}
	a.must("DELETE", "/v1/enrollments/"+id(holder), nil, http.StatusOK)
	waitFor(t, time.Minute, "w2 promoted and confirmed", func() bool {
		return status(b.must("GET", "/v1/enrollments/"+id(waiting), nil, http.StatusOK)) == "confirmed"
	})
	waitFor(t, time.Minute, "w2's promotion and confirmation on the topic", func() bool {
		events := readTopic(t, c.stack().Config.KafkaBrokers, workflows.EnrollmentTopic, "course_id")
		return eventsFor(events, workflows.EventEnrollmentPromoted)[id(waiting)] == 1 &&
			eventsFor(events, workflows.EventEnrollmentConfirmed)[id(waiting)] == 1
	})

	// A coupon issued and used; the vendor is paid once.
	vendor, typ := p+"-v", p+"-t"
	a.must("POST", "/v1/vendors", map[string]any{"id": vendor, "name": "V"}, http.StatusCreated)
	a.must("POST", "/v1/coupon-types", map[string]any{"id": typ, "vendor_id": vendor, "name": "10%", "stock": 5, "payout_cents": 250}, http.StatusCreated)
	coupon := b.must("POST", "/v1/coupon-types/"+typ+"/coupons", map[string]any{"user_id": "u1"}, http.StatusCreated)
	used := a.must("POST", "/v1/coupons/"+id(coupon)+"/use", map[string]any{"user_id": "u1", "order_id": "o1"}, http.StatusOK)
	if st := status(used); st != "used" {
		t.Errorf("coupon use: status %q", st)
	}
	if bal := b.must("GET", "/v1/vendors/"+vendor, nil, http.StatusOK)["balance_cents"]; bal != float64(250) {
		t.Errorf("vendor balance %v, want 250", bal)
	}
	if n := queryInt(t, c.stack(), `SELECT count(*) FROM payouts WHERE vendor_id = $1`, vendor); n != 1 {
		t.Errorf("%d payouts recorded, want 1", n)
	}

	// A dead letter: the broker refuses the topic, then a bulk re-drive.
	dl := p + "-dl"
	a.must("POST", "/v1/courses", map[string]any{"id": dl, "title": "DL", "capacity": 5}, http.StatusCreated)
	restore := failProduces(t, c.stack(), workflows.EnrollmentTopic)
	stuck := a.must("POST", "/v1/courses/"+dl+"/enrollments", map[string]any{"student_id": "d1"}, http.StatusCreated)
	waitFor(t, 3*time.Minute, "d1's enrollment dead-lettered", func() bool {
		return status(a.must("GET", "/v1/enrollments/"+id(stuck), nil, http.StatusOK)) == "dead_lettered"
	})
	restore()
	redrive := b.must("POST", "/v1/dead-letters/retry", map[string]any{"course_id": dl}, http.StatusAccepted)
	t.Logf("bulk re-drive: %v", redrive)
	waitFor(t, 2*time.Minute, "d1's enrollment confirmed after the re-drive", func() bool {
		return status(a.must("GET", "/v1/enrollments/"+id(stuck), nil, http.StatusOK)) == "confirmed"
	})

	// Visibility on the SQL store, through the temporal CLI.
	cli, err := devstack.TemporalCLI(context.Background(), testWriter{t})
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		fmt.Sprintf("CourseId='%s'", wl),
		fmt.Sprintf("CourseId='%s' AND ClaimStatus='confirmed'", dl),
	} {
		waitFor(t, time.Minute, "a run listed for "+q, func() bool {
			out, err := exec.Command(cli, "workflow", "list", "--address", c.env["TEMPORAL_ADDRESS"], "--query", q, "--output", "json").Output()
			return err == nil && (strings.Contains(string(out), `"workflowId"`) || strings.Contains(string(out), `"execution"`))
		})
	}

	// claimflow replay of the runs this server holds for these courses.
	replay := exec.Command(claimflowBinary(t), "replay", "-query", fmt.Sprintf("CourseId IN ('%s', '%s') AND ExecutionStatus != 'Running'", wl, dl))
	replay.Env = c.cmdEnv()
	out, err := replay.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "ok ") || strings.Contains(string(out), "FAIL ") {
		t.Errorf("claimflow replay: %v\n%s", err, out)
	}
	t.Logf("claimflow replay:\n%s", tail(out, 10))
}

// benchBinary builds claimflow-bench once.
var benchBinary = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "claimflow-bench-bin-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "claimflow-bench")
	if out, err := exec.Command("go", "build", "-o", bin, "../claimflow-bench").CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build claimflow-bench: %v\n%s", err, out)
	}
	return bin, nil
})

// clusterFaultRate is the load of a fault on the production shape: 300
// claims/s in CI, CLAIMFLOW_CLUSTER_FAULT_RATE (e.g. 2000) for the
// bench-sized run of docs/performance.md.
func clusterFaultRate(t *testing.T) int {
	if v := os.Getenv("CLAIMFLOW_CLUSTER_FAULT_RATE"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("CLAIMFLOW_CLUSTER_FAULT_RATE=%q", v)
		}
		return n
	}
	return 300
}

// clusterFault runs the bench at clusterFaultRate through both APIs for
// 45 s, injects the fault 15 s in, and checks from the rows and the topic
// (the bench's audit) that no claim was lost, duplicated or oversold, and
// that the fault delayed claims in flight or cut their requests. inject
// returns when the fault took hold.
func clusterFault(t *testing.T, c *clusterUnderTest, name string, inject func(t *testing.T) time.Time) {
	bin, err := benchBinary()
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(c.dir, "fault-"+name+".json")
	rate := clusterFaultRate(t)
	cmd := exec.Command(bin, "burst", "--target", strings.Join(c.apis, ","), "--rate", strconv.Itoa(rate),
		"--ramp", "2s", "--hold", "40s", "--rampdown", "3s", "--courses", "20", "--seats", strconv.Itoa(max(2000, 3*rate)),
		"--drain-timeout", "3m", "--progress", "5s", "--json", out)
	cmd.Env = c.cmdEnv()
	logPath := filepath.Join(c.dir, "fault-"+name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(15 * time.Second)
	// The fault's moment, as its injection says: the claims requested
	// before it and still in flight are the ones it can delay.
	killed := inject(t)
	t.Logf("%s fault injected and recovered in %s", name, time.Since(killed).Round(time.Millisecond))
	benchErr := cmd.Wait()
	b, _ := os.ReadFile(logPath)
	if benchErr != nil {
		t.Fatalf("claimflow-bench: %v\n%s", benchErr, tail(b, 40))
	}
	var summary []string
	for line := range strings.SplitSeq(string(b), "\n") {
		if strings.Contains(line, "http_req_duration") || strings.Contains(line, "audit") || strings.Contains(line, "lost ") {
			summary = append(summary, line)
		}
	}
	t.Logf("claimflow-bench:\n%s", strings.Join(summary, "\n"))
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var r bench.Result
	if err := json.Unmarshal(raw, &r); err != nil {
		t.Fatalf("bench JSON: %v", err)
	}
	au := r.Audit
	courses := r.RunID + "-c%"
	deadLettered := queryInt(t, c.stack(), `SELECT count(*) FROM enrollments WHERE course_id LIKE $1 AND status = 'dead_lettered'`, courses)
	delayed := queryInt(t, c.stack(), `SELECT count(*) FROM enrollments WHERE course_id LIKE $1 AND requested_at < $2 AND confirmed_at > $2::timestamptz + interval '1 second'`, courses, killed)
	f := r.Failures
	cut := f.Server + f.Timeout + f.Conn + f.Other
	t.Logf("%s fault: accepted %d, confirmed %d, lost %d, duplicate %d, oversold %d, dead-lettered %d, redelivered events %d; "+
		"in flight at the fault and delayed by it over 1 s: %d; requests it cut: %d (5xx %d, timeout %d, connection %d, other %d); unanswered claims in the database: %d; answers by status %v",
		name, au.Accepted, au.Confirmed, au.Lost, au.DuplicateEvents, au.OversoldCourses, deadLettered, au.Redelivered,
		delayed, cut, f.Server, f.Timeout, f.Conn, f.Other, au.UnansweredInDB, r.Status)
	if !au.OK() || au.Lost != 0 || au.DuplicateEvents != 0 || au.OversoldCourses != 0 || au.MissingEvents != 0 || au.UnexpectedEvents != 0 {
		t.Errorf("audit: %+v", au)
	}
	if au.Accepted < rate*30 {
		t.Errorf("accepted %d claims, want at least %d at %d/s", au.Accepted, rate*30, rate)
	}
	// A cut request whose claim went on shows as a claim in the database
	// no client was told about: the retry on the other API was answered
	// 409 already_enrolled, naming it.
	if delayed == 0 && cut == 0 && au.UnansweredInDB == 0 {
		t.Errorf("the %s fault delayed or cut no claim in flight: it did not hit the work", name)
	}
}
