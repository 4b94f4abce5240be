package main

// Crash tests: `claimflow dev` (API, worker, consumer, Temporal dev server,
// Kafka, PostgreSQL) as the processes an operator runs, killed with SIGKILL
// all at once, Temporal server included, and restarted on the same data
// dir. They prove that every effect committed in PostgreSQL has a run that
// finishes it (docs/architecture.md, "When a run is lost"):
//
//   - TestCrashBetweenReservationAndAnswer hits the one window where a
//     commit has no durable owner, every time: the worker dies the moment a
//     desk's ReserveSeats returns (a binary built with -tags crashtest,
//     CLAIMFLOW_CRASH_AFTER), the Temporal server with it, so the update
//     carrying the claims is lost. The recovery must finish the orphan.
//   - TestCommittedEffectsHaveARun does the same after each ordinary
//     activity that commits: coupon issue and use (the payout included),
//     cancellation and promotion.
//   - TestKillEverythingUnderLoad kills everything (and in some rounds
//     PostgreSQL) mid-burst at varied offsets, five times.

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/client"

	"github.com/claimflow/claimflow/dev/audit"
	"github.com/claimflow/claimflow/dev/devstack"
	"github.com/claimflow/claimflow/dev/payoutsim"
	"github.com/claimflow/claimflow/internal/store"
	"github.com/claimflow/claimflow/workflows"
)

// The crash tests' recovery settings: the least RECOVERY_AFTER allowed,
// and a schedule that comes round every two seconds.
const (
	crashRecoveryAfter = 30 * time.Second
	crashRecoveryEvery = 2 * time.Second
	crashRecoveryBound = crashRecoveryAfter + 2*crashRecoveryEvery
)

var (
	crashBuildOnce sync.Once
	crashBinary    string
	crashBuildErr  error
)

// crashClaimflow builds this command with -tags crashtest once per run.
func crashClaimflow(t *testing.T) string {
	t.Helper()
	crashBuildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "claimflow-crashtest-")
		if err != nil {
			crashBuildErr = err
			return
		}
		crashBinary = filepath.Join(dir, "claimflow")
		out, err := exec.Command("go", "build", "-tags", "crashtest", "-o", crashBinary, ".").CombinedOutput()
		if err != nil {
			crashBuildErr = fmt.Errorf("go build -tags crashtest: %v\n%s", err, out)
		}
	})
	if crashBuildErr != nil {
		t.Fatal(crashBuildErr)
	}
	return crashBinary
}

// devStack is `claimflow dev` run as its own process group on a data dir
// of the test's, on ports of its own.
type devStack struct {
	t                                 *testing.T
	bin, dir                          string
	httpPort, temporalPort, kafkaPort int
	pgPort, uiPort, notifyPort        int
	env                               []string // the environment of every start
	cwd                               string   // the working directory (default: the test's)

	cmd      *exec.Cmd
	exited   chan struct{}
	database string // the runtime role's URL, from the ready line
	api      *apiClient
	starts   int
}

func newDevStack(t *testing.T, env ...string) *devStack {
	t.Helper()
	s := &devStack{t: t, bin: crashClaimflow(t), dir: dataDir(t)}
	for _, p := range []*int{&s.httpPort, &s.temporalPort, &s.kafkaPort, &s.pgPort, &s.uiPort, &s.notifyPort} {
		port, err := devstack.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		*p = port
	}
	s.env = append([]string{
		"RECOVERY_AFTER=" + crashRecoveryAfter.String(),
		"RECOVERY_EVERY=" + crashRecoveryEvery.String(),
		"LOG_LEVEL=warn",
	}, env...)
	t.Cleanup(func() { s.kill(true) })
	return s
}

var readyDatabase = regexp.MustCompile(`database=(\S+)`)

// start runs `claimflow dev` with the stack's environment and extra, and
// waits for its ready line.
func (s *devStack) start(extra ...string) {
	s.t.Helper()
	s.starts++
	log, err := os.Create(filepath.Join(s.dir, fmt.Sprintf("dev-%d.log", s.starts)))
	if err != nil {
		s.t.Fatal(err)
	}
	cmd := exec.Command(s.bin, "dev", "--data-dir", s.dir, "--http-addr", fmt.Sprintf("127.0.0.1:%d", s.httpPort),
		"--temporal-port", strconv.Itoa(s.temporalPort), "--ui-port", strconv.Itoa(s.uiPort),
		"--kafka-port", strconv.Itoa(s.kafkaPort), "--pg-port", strconv.Itoa(s.pgPort),
		"--notify-port", strconv.Itoa(s.notifyPort))
	cmd.Env = append(append(os.Environ(), s.env...), extra...)
	cmd.Dir = s.cwd
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		s.t.Fatal(err)
	}
	cmd.Stderr = log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	s.cmd, s.exited = cmd, make(chan struct{})
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if line := sc.Text(); strings.HasPrefix(line, "claimflow ready:") {
				ready <- line
			}
		}
		_ = cmd.Wait()
		_ = log.Close()
		close(s.exited)
	}()
	select {
	case line := <-ready:
		m := readyDatabase.FindStringSubmatch(line)
		if m == nil {
			s.t.Fatalf("no database in the ready line %q", line)
		}
		s.database = m[1]
	case <-s.exited:
		b, _ := os.ReadFile(log.Name())
		s.t.Fatalf("claimflow dev exited before it was ready:\n%s", tail(b, 40))
	case <-time.After(3 * time.Minute):
		s.t.Fatal("claimflow dev not ready within 3 minutes")
	}
	if s.api == nil {
		out, err := exec.Command(s.bin, "token", "--data-dir", s.dir, "--sub", "test-admin", "--role", "admin", "--ttl", "2h").Output()
		if err != nil {
			s.t.Fatalf("claimflow token: %v", err)
		}
		s.api = &apiClient{t: s.t, base: fmt.Sprintf("http://127.0.0.1:%d", s.httpPort), token: strings.TrimSpace(string(out)),
			http: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256}}}
	}
}

// temporalPID is the dev server's process: the one whose command line
// names this stack's database file.
func (s *devStack) temporalPID() int {
	dbFile := filepath.Join(s.dir, "temporal.db")
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), dbFile) && strings.Contains(string(b), "start-dev") {
			return pid
		}
	}
	return 0
}

// postmasterPID is the private cluster's postmaster.
func (s *devStack) postmasterPID() int {
	b, err := os.ReadFile(filepath.Join(s.dir, "pg", "postmaster.pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	return pid
}

// kill SIGKILLs the dev process group and the Temporal server at once, and
// with pg the PostgreSQL server too, then waits for the dev process.
func (s *devStack) kill(pg bool) {
	temporal, postmaster := s.temporalPID(), 0
	if pg {
		postmaster = s.postmasterPID()
	}
	if s.cmd != nil && s.cmd.Process != nil {
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	}
	for _, pid := range []int{temporal, postmaster} {
		if pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	if s.exited != nil {
		<-s.exited
	}
	// Until the Temporal server is gone its port and database are taken.
	for _, pid := range []int{temporal, postmaster} {
		for pid > 0 && syscall.Kill(pid, 0) == nil {
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// crashed waits for the dev process to kill itself (CLAIMFLOW_CRASH_AFTER),
// then kills the Temporal server at once: the server loses what only its
// memory held.
func (s *devStack) crashed(within time.Duration) {
	s.t.Helper()
	select {
	case <-s.exited:
	case <-time.After(within):
		s.t.Fatalf("claimflow dev did not crash within %s", within)
	}
	s.kill(false)
}

func (s *devStack) pool() *pgxpool.Pool {
	s.t.Helper()
	pool, err := pgxpool.New(context.Background(), s.database)
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(pool.Close)
	return pool
}

func (s *devStack) temporal() client.Client {
	s.t.Helper()
	c, err := client.Dial(client.Options{HostPort: fmt.Sprintf("127.0.0.1:%d", s.temporalPort), Logger: quietLogger{}})
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(c.Close)
	return c
}

func (s *devStack) brokers() []string { return []string{fmt.Sprintf("127.0.0.1:%d", s.kafkaPort)} }

// quietLogger drops the SDK's logs of a client that meets restarts.
type quietLogger struct{}

func (quietLogger) Debug(string, ...any) {}
func (quietLogger) Info(string, ...any)  {}
func (quietLogger) Warn(string, ...any)  {}
func (quietLogger) Error(string, ...any) {}

// eventsOf counts the events of each type on topic whose data's field is id.
func eventsOf(t *testing.T, brokers []string, topic, field, id string) map[string]int {
	t.Helper()
	key := map[string]string{workflows.EnrollmentTopic: "course_id", workflows.CouponTopic: "coupon_type_id"}[topic]
	n := map[string]int{}
	for _, e := range readTopic(t, brokers, topic, key) {
		if fmt.Sprint(e.Data[field]) == id {
			n[e.Type]++
		}
	}
	return n
}

// The worker dies the moment a desk's ReserveSeats has committed, the
// Temporal server with it (the update that carried the claim is lost), and
// the API that sent it: the claim's seat is taken and nobody holds it.
// After the restart the audit sees it orphaned; within the recovery bound
// its batch's run publishes and confirms it, once; the student's retry
// hears already_enrolled with its ID.
func TestCrashBetweenReservationAndAnswer(t *testing.T) {
	if testing.Short() {
		t.Skip("real stack")
	}
	s := newDevStack(t)
	s.start("CLAIMFLOW_CRASH_AFTER=ReserveSeats")
	s.api.must("POST", "/v1/courses", map[string]any{"id": "crash101", "title": "Crash", "capacity": 5}, http.StatusCreated)
	if status, body, err := s.api.do("POST", "/v1/courses/crash101/enrollments", map[string]any{"student_id": "s-1"}); err == nil {
		t.Fatalf("the claim was answered %d %v; the worker should have died before the answer", status, body)
	}
	s.crashed(30 * time.Second)

	restarted := time.Now()
	s.start()
	pool, tc := s.pool(), s.temporal()
	ctx := context.Background()
	held, err := store.Reservations(ctx, pool, "crash101")
	if err != nil || len(held) != 1 {
		t.Fatalf("after the crash: reservations %+v, %v; want the claim's one", held, err)
	}
	id := held[0].ID
	before, err := audit.CheckReservations(ctx, pool, tc, "default", "crash101", crashRecoveryBound)
	if err != nil {
		t.Fatal(err)
	}
	if len(before.Orphaned) != 1 || before.Orphaned[0].EnrollmentID != id {
		t.Fatalf("after the restart the audit says %+v; want %s orphaned", before, id)
	}
	t.Logf("after the restart: %s orphaned, %s old, batch %s", id, before.Orphaned[0].Age.Round(time.Millisecond), before.Orphaned[0].BatchID)

	waitFor(t, crashRecoveryBound+30*time.Second, "the orphan confirmed", func() bool {
		_, got, _ := s.api.do("GET", "/v1/enrollments/"+id, nil)
		return got["status"] == "confirmed"
	})
	took := time.Since(restarted)
	after, err := audit.CheckReservations(ctx, pool, tc, "default", "crash101", crashRecoveryBound)
	if err != nil || after.Reserved != 0 || !after.OK() {
		t.Fatalf("after the recovery: %+v, %v; want nothing reserved", after, err)
	}
	t.Logf("recovered %s in %s after the restart (bound %s)", id, took.Round(time.Millisecond), crashRecoveryBound)
	if n := eventsOf(t, s.brokers(), workflows.EnrollmentTopic, "enrollment_id", id); n[workflows.EventEnrollmentConfirmed] != 1 || len(n) != 1 {
		t.Errorf("events of %s: %v; want one enrollment.confirmed", id, n)
	}
	course := s.api.must("GET", "/v1/courses/crash101", nil, http.StatusOK)
	if course["enrolled"] != float64(1) {
		t.Errorf("the course counts %v enrolled, want 1", course["enrolled"])
	}
	again := s.api.must("POST", "/v1/courses/crash101/enrollments", map[string]any{"student_id": "s-1"}, http.StatusConflict)
	if errorCode(again) != "already_enrolled" || again["enrollment_id"] != id {
		t.Errorf("the student's retry answered %v; want already_enrolled naming %s", again, id)
	}
}

// After each ordinary activity that commits an effect, the worker dies (and
// with it the API) and so does the Temporal server; once restarted, the run
// that owned the step retries it (each is idempotent) and finishes the
// claim: nothing is left half done, nothing happens twice.
func TestCommittedEffectsHaveARun(t *testing.T) {
	if testing.Short() {
		t.Skip("real stack")
	}
	type scenario struct {
		activity string
		// prepare sets the scene without running the activity; act runs
		// it (its answer is lost); check proves the claim finished, once.
		prepare func(s *devStack) (ids map[string]string)
		act     func(s *devStack, ids map[string]string)
		check   func(t *testing.T, s *devStack, ids map[string]string)
	}
	couponSetup := func(s *devStack, issue bool) map[string]string {
		s.api.must("POST", "/v1/vendors", map[string]any{"id": "acme", "name": "Acme"}, http.StatusCreated)
		s.api.must("POST", "/v1/coupon-types", map[string]any{"id": "spring", "vendor_id": "acme", "name": "10% off", "stock": 10, "payout_cents": 250}, http.StatusCreated)
		ids := map[string]string{}
		if issue {
			k := s.api.must("POST", "/v1/coupon-types/spring/coupons", map[string]any{"user_id": "u-1"}, http.StatusCreated)
			ids["coupon"] = k["id"].(string)
		}
		return ids
	}
	var payout *payoutsim.Server // each scenario's; it outlives the crash, as a provider does
	usedOnce := func(t *testing.T, s *devStack, ids map[string]string) {
		var k map[string]any
		waitFor(t, 2*time.Minute, "the coupon used", func() bool {
			_, k, _ = s.api.do("GET", "/v1/coupons/"+ids["coupon"], nil)
			return k["status"] == "used"
		})
		v := s.api.must("GET", "/v1/vendors/acme", nil, http.StatusOK)
		if v["balance_cents"] != float64(250) || v["payout_count"] != float64(1) {
			t.Errorf("vendor after the use: %v; want one payout of 250", v)
		}
		if n := len(payout.Payouts()); n != 1 {
			t.Errorf("the provider made %d payouts, want 1", n)
		}
		waitFor(t, time.Minute, "coupon.used on the topic", func() bool {
			return eventsOf(t, s.brokers(), workflows.CouponTopic, "coupon_id", ids["coupon"])[workflows.EventCouponUsed] == 1
		})
	}
	use := func(s *devStack, ids map[string]string) {
		_, _, _ = s.api.do("POST", "/v1/coupons/"+ids["coupon"]+"/use", map[string]any{"user_id": "u-1", "order_id": "o-1"})
	}
	enrolled := func(s *devStack, course string, capacity int, students ...string) map[string]string {
		s.api.must("POST", "/v1/courses", map[string]any{"id": course, "title": course, "capacity": capacity}, http.StatusCreated)
		ids := map[string]string{}
		for _, st := range students {
			status, e, err := s.api.do("POST", "/v1/courses/"+course+"/enrollments?wait=confirmed", map[string]any{"student_id": st, "waitlist": true})
			if err != nil || (status != http.StatusCreated && e["status"] != "waitlisted") {
				s.t.Fatalf("enroll %s: %d %v %v", st, status, e, err)
			}
			ids[st] = e["id"].(string)
		}
		return ids
	}
	scenarios := []scenario{
		{activity: "ReserveCoupon",
			prepare: func(s *devStack) map[string]string { return couponSetup(s, false) },
			act: func(s *devStack, _ map[string]string) {
				_, _, _ = s.api.do("POST", "/v1/coupon-types/spring/coupons", map[string]any{"user_id": "u-1"})
			},
			check: func(t *testing.T, s *devStack, _ map[string]string) {
				var list map[string]any
				waitFor(t, 2*time.Minute, "the coupon issued", func() bool {
					_, list, _ = s.api.do("GET", "/v1/users/u-1/coupons", nil)
					items, _ := list["coupons"].([]any)
					return len(items) == 1 && items[0].(map[string]any)["status"] == "issued"
				})
				id := list["coupons"].([]any)[0].(map[string]any)["id"].(string)
				typ := s.api.must("GET", "/v1/coupon-types/spring", nil, http.StatusOK)
				if typ["issued"] != float64(1) {
					t.Errorf("the type counts %v issued, want 1", typ["issued"])
				}
				waitFor(t, time.Minute, "coupon.issued on the topic", func() bool {
					return eventsOf(t, s.brokers(), workflows.CouponTopic, "coupon_id", id)[workflows.EventCouponIssued] == 1
				})
			}},
		{activity: "MarkCouponUsed", prepare: func(s *devStack) map[string]string { return couponSetup(s, true) }, act: use, check: usedOnce},
		{activity: "PayVendor", prepare: func(s *devStack) map[string]string { return couponSetup(s, true) }, act: use, check: usedOnce},
		{activity: "RecordPayout", prepare: func(s *devStack) map[string]string { return couponSetup(s, true) }, act: use, check: usedOnce},
		{activity: "CancelEnrollment",
			prepare: func(s *devStack) map[string]string { return enrolled(s, "cx101", 5, "s-1") },
			act: func(s *devStack, ids map[string]string) {
				_, _, _ = s.api.do("DELETE", "/v1/enrollments/"+ids["s-1"], nil)
			},
			check: func(t *testing.T, s *devStack, ids map[string]string) {
				waitFor(t, 2*time.Minute, "the enrollment cancelled and told", func() bool {
					_, e, _ := s.api.do("GET", "/v1/enrollments/"+ids["s-1"], nil)
					return e["status"] == "cancelled" &&
						eventsOf(t, s.brokers(), workflows.EnrollmentTopic, "enrollment_id", ids["s-1"])[workflows.EventEnrollmentCancelled] == 1
				})
				if c := s.api.must("GET", "/v1/courses/cx101", nil, http.StatusOK); c["enrolled"] != float64(0) {
					t.Errorf("course after the cancellation: %v; want its seat free", c)
				}
			}},
		{activity: "PromoteWaitlist",
			prepare: func(s *devStack) map[string]string { return enrolled(s, "px101", 1, "s-1", "s-2") },
			act: func(s *devStack, ids map[string]string) {
				_, _, _ = s.api.do("DELETE", "/v1/enrollments/"+ids["s-1"], nil)
			},
			check: func(t *testing.T, s *devStack, ids map[string]string) {
				waitFor(t, 2*time.Minute, "the promoted enrollment confirmed", func() bool {
					_, e, _ := s.api.do("GET", "/v1/enrollments/"+ids["s-2"], nil)
					return e["status"] == "confirmed"
				})
				n := eventsOf(t, s.brokers(), workflows.EnrollmentTopic, "enrollment_id", ids["s-2"])
				if n[workflows.EventEnrollmentPromoted] != 1 || n[workflows.EventEnrollmentConfirmed] != 1 {
					t.Errorf("events of the promoted enrollment: %v; want one promoted and one confirmed", n)
				}
				if c := s.api.must("GET", "/v1/courses/px101", nil, http.StatusOK); c["enrolled"] != float64(1) || c["waitlisted"] != float64(0) {
					t.Errorf("course after the promotion: %v; want 1 enrolled, none waiting", c)
				}
			}},
	}
	for _, sc := range scenarios {
		t.Run(sc.activity, func(t *testing.T) {
			var err error
			if payout, err = payoutsim.Start("127.0.0.1:0"); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = payout.Close(context.Background()) })
			s := newDevStack(t, "VENDOR_PAYOUT_URL="+payout.PayoutsURL())
			s.t = t
			s.start("CLAIMFLOW_CRASH_AFTER=" + sc.activity) // armed: prepare does not run the activity
			ids := sc.prepare(s)
			sc.act(s, ids)
			s.crashed(time.Minute)
			restarted := time.Now()
			s.start()
			sc.check(t, s, ids)
			t.Logf("%s: finished %s after the restart", sc.activity, time.Since(restarted).Round(time.Millisecond))
		})
	}
}

// crashLoad sends enrollments from 32 clients at about rate a second until
// stop, each a new student on one of courses; every third asks for the
// waitlist. It records the enrollment IDs answered 201 and 202 waitlisted.
type crashLoad struct {
	accepted, waitlisted sync.Map
	sent, errors         atomic.Int64
	stop                 chan struct{}
	done                 sync.WaitGroup
}

func startCrashLoad(s *devStack, courses []string, rate float64) *crashLoad {
	l := &crashLoad{stop: make(chan struct{})}
	var next atomic.Int64
	tick := time.Duration(float64(32) / rate * float64(time.Second))
	for range 32 {
		l.done.Go(func() {
			for {
				select {
				case <-l.stop:
					return
				case <-time.After(tick):
				}
				n := next.Add(1)
				course := courses[n%int64(len(courses))]
				st, body, err := s.api.do("POST", "/v1/courses/"+course+"/enrollments",
					map[string]any{"student_id": fmt.Sprintf("k-%06d", n), "waitlist": n%3 == 0})
				l.sent.Add(1)
				switch {
				case err != nil || st >= 500:
					l.errors.Add(1)
				case st == http.StatusCreated:
					l.accepted.Store(body["id"].(string), course)
				case st == http.StatusAccepted && body["status"] == "waitlisted":
					l.waitlisted.Store(body["id"].(string), course)
				}
			}
		})
	}
	return l
}

func (l *crashLoad) halt() { close(l.stop); l.done.Wait() }

func count(m *sync.Map) int {
	n := 0
	m.Range(func(any, any) bool { n++; return true })
	return n
}

// Five times, mid-burst and at a different moment each time, the API,
// worker and consumer (one process), the Temporal server and, in two of
// the rounds, PostgreSQL die together with SIGKILL, and everything is
// started again on the same data dir. Afterwards, within the recovery
// bound: no reservation is orphaned or left reserved, every claim answered
// 201 is confirmed with one event, no course is oversold, and the waitlist
// audit holds.
func TestKillEverythingUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("real stack")
	}
	s := newDevStack(t)
	s.start()
	// Six roomy courses that never fill, two small ones that fill at once
	// and then queue every third claim on their waitlists.
	var courses []string
	for i := range 8 {
		id, capacity := fmt.Sprintf("kill%d", i), 5000
		if i >= 6 {
			capacity = 40
		}
		courses = append(courses, id)
		s.api.must("POST", "/v1/courses", map[string]any{"id": id, "title": id, "capacity": capacity}, http.StatusCreated)
	}
	rate := 300.0
	if v, err := strconv.ParseFloat(os.Getenv("CLAIMFLOW_CRASH_RATE"), 64); err == nil && v > 0 {
		rate = v
	}
	rounds := []struct {
		offset time.Duration
		pg     bool
	}{{3 * time.Second, false}, {5500 * time.Millisecond, true}, {2 * time.Second, false}, {7 * time.Second, false}, {4 * time.Second, true}}
	type roundReport struct {
		accepted, orphanedBefore int
		recovered                time.Duration
	}
	var reports []roundReport
	load := startCrashLoad(s, courses, rate)
	for i, r := range rounds {
		jitter := time.Duration(rand.Int64N(int64(500 * time.Millisecond)))
		time.Sleep(r.offset + jitter)
		acceptedAtKill := count(&load.accepted)
		s.kill(r.pg)
		s.start()
		restarted := time.Now()
		pool, tc := s.pool(), s.temporal()
		rep, err := audit.CheckReservations(context.Background(), pool, tc, "default", "kill", crashRecoveryBound)
		if err != nil {
			t.Fatal(err)
		}
		reports = append(reports, roundReport{accepted: acceptedAtKill, orphanedBefore: len(rep.Orphaned)})
		t.Logf("round %d: killed after %s (PostgreSQL too: %v) with %d accepted; after the restart %d reserved, %d held by a live run, %d orphaned",
			i+1, r.offset+jitter, r.pg, acceptedAtKill, rep.Reserved, rep.InFlight, len(rep.Orphaned))
		// Watch this round's orphans until they are recovered, while the
		// load goes on.
		if len(rep.Orphaned) > 0 {
			waiting := map[string]bool{}
			for _, o := range rep.Orphaned {
				waiting[o.EnrollmentID] = true
			}
			waitFor(t, crashRecoveryBound+30*time.Second, "round "+strconv.Itoa(i+1)+"'s orphans finished", func() bool {
				held, err := store.Reservations(context.Background(), pool, "kill")
				if err != nil {
					return false
				}
				for _, h := range held {
					if waiting[h.ID] {
						return false
					}
				}
				return true
			})
			reports[i].recovered = time.Since(restarted)
		}
	}
	time.Sleep(3 * time.Second) // a last stretch of load on the restarted stack
	load.halt()

	pool, tc := s.pool(), s.temporal()
	ctx := context.Background()
	waitFor(t, crashRecoveryBound+time.Minute, "no reservation left", heldFor(2*time.Second, func() bool {
		held, err := store.Reservations(ctx, pool, "kill")
		return err == nil && len(held) == 0
	}))
	final, err := audit.CheckReservations(ctx, pool, tc, "default", "kill", crashRecoveryBound)
	if err != nil || final.Reserved != 0 || len(final.Orphaned) != 0 {
		t.Errorf("after the recovery bound: %+v, %v; want nothing reserved or orphaned", final, err)
	}
	confirmed := map[string]bool{}
	rows, err := pool.Query(ctx, `SELECT id FROM enrollments WHERE starts_with(course_id, 'kill') AND status = 'confirmed'`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		confirmed[id] = true
	}
	rows.Close()
	load.accepted.Range(func(id, _ any) bool {
		if !confirmed[id.(string)] {
			t.Errorf("enrollment %s was answered 201 and is not confirmed", id)
		}
		return true
	})
	events := map[string]int{}
	for _, e := range readTopic(t, s.brokers(), workflows.EnrollmentTopic, "course_id") {
		if e.Type == workflows.EventEnrollmentConfirmed && strings.HasPrefix(fmt.Sprint(e.Data["course_id"]), "kill") {
			events[fmt.Sprint(e.Data["enrollment_id"])]++
		}
	}
	for id := range confirmed {
		if events[id] == 0 {
			t.Errorf("confirmed enrollment %s has no enrollment.confirmed event", id)
		}
	}
	for id := range events {
		if !confirmed[id] {
			t.Errorf("enrollment.confirmed of %s, which is not confirmed", id)
		}
	}
	wl, err := store.AuditWaitlist(ctx, pool, "kill")
	if err != nil || !wl.OK() {
		t.Errorf("waitlist audit: %+v, %v", wl, err)
	}
	t.Logf("load: %d sent, %d answered 201, %d waitlisted, %d errors (a dead API); %d confirmed, %d with events; waitlist: %d waiting, oversold %v",
		load.sent.Load(), count(&load.accepted), count(&load.waitlisted), load.errors.Load(), len(confirmed), len(events), wl.Waiting, wl.Oversold)
	for i, r := range reports {
		t.Logf("round %d: accepted by the kill %d, orphaned after the restart %d, recovered in %s", i+1, r.accepted, r.orphanedBefore, r.recovered.Round(time.Millisecond))
	}
}
