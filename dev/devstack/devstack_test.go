package devstack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/sdk/client"
)

func freePort(t *testing.T) int {
	t.Helper()
	p, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// tWriter sends build progress to the test log.
type tWriter struct{ t *testing.T }

func (w tWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

func TestPostgresRestartKeepsData(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// Deeper than a unix socket path allows, so the short socket dir
	// fallback is exercised too.
	dir := filepath.Join(t.TempDir(), strings.Repeat("d", 40), strings.Repeat("e", 40), "pg")
	opts := PostgresOptions{DataDir: dir, Port: freePort(t)}

	start := time.Now()
	pg, err := StartPostgres(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("postgres cold start (initdb + start + create database): %s", time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() {
		if err := pg.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	})
	if want := "postgres://claimflow@127.0.0.1:"; !strings.HasPrefix(pg.URL, want) || !strings.HasSuffix(pg.URL, "/claimflow?sslmode=disable") {
		t.Fatalf("URL = %q", pg.URL)
	}

	exec := func(sql string, args ...any) {
		t.Helper()
		conn, err := pgx.Connect(ctx, pg.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
	}
	count := func() int {
		t.Helper()
		conn, err := pgx.Connect(ctx, pg.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		var n int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM claims WHERE id = $1", "c-1").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	exec("CREATE TABLE claims (id text PRIMARY KEY, amount numeric NOT NULL)")
	exec("INSERT INTO claims (id, amount) VALUES ($1, $2)", "c-1", 120.5)

	// A second start while the server runs is what happens after a
	// crashed `claimflow dev`: it must adopt the server, not fail.
	again, err := StartPostgres(ctx, opts)
	if err != nil {
		t.Fatalf("start while already running: %v", err)
	}
	if !again.Reused {
		t.Error("second start on a running data dir did not report Reused")
	}

	// Crash: the postmaster dies without a shutdown checkpoint; the next
	// start must run recovery and keep the committed row.
	pid := postmasterPID(t, dir)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitGone(t, pid)
	start = time.Now()
	if _, err := StartPostgres(ctx, opts); err != nil {
		t.Fatalf("start after postmaster SIGKILL: %v", err)
	}
	t.Logf("postgres start after SIGKILL (crash recovery): %s", time.Since(start).Round(time.Millisecond))
	if n := count(); n != 1 {
		t.Fatalf("after crash recovery: %d rows for c-1, want 1", n)
	}

	if err := pg.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	pg2, err := StartPostgres(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("postgres warm start (existing cluster): %s", time.Since(start).Round(time.Millisecond))
	if pg2.Reused {
		t.Error("start after Stop reported Reused")
	}
	if n := count(); n != 1 {
		t.Fatalf("after restart: %d rows for c-1, want 1", n)
	}

	// After a reboot the pid in a stale postmaster.pid may belong to an
	// unrelated live process (here: the test binary itself).
	if err := pg2.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	pidFile := filepath.Join(dir, "postmaster.pid")
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(os.Getpid())+"\n"+dir+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := StartPostgres(ctx, opts); err != nil {
		t.Fatalf("start with a postmaster.pid naming an unrelated live process: %v", err)
	}
	if n := count(); n != 1 {
		t.Fatalf("after stale pid file: %d rows for c-1, want 1", n)
	}
}

func postmasterPID(t *testing.T, dataDir string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// waitGone waits until pid has exited (a zombie counts: it holds nothing).
func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			return
		}
		if stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil && procIsZombie(stat) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("pid %d still alive 10s after SIGKILL", pid)
}

func TestKafkaRestartKeepsMessages(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := filepath.Join(t.TempDir(), "kafka")
	const topic = "claims.events"
	opts := KafkaOptions{DataDir: dir, Port: freePort(t), Topics: []Topic{{Name: topic, Partitions: 3}}}

	start := time.Now()
	k, err := StartKafka(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kafka (kfake) cold start: %s", time.Since(start).Round(time.Millisecond))
	t.Cleanup(k.Close)

	cfg := sarama.NewConfig()
	cfg.Version = sarama.V2_8_0_0
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Idempotent = true
	cfg.Producer.Retry.Max = 3
	cfg.Producer.Return.Successes = true
	cfg.Net.MaxOpenRequests = 1
	prod, err := sarama.NewSyncProducer(k.Brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	const value = `{"claimId":"c-1","type":"ClaimSubmitted"}`
	part, off, err := prod.SendMessage(&sarama.ProducerMessage{
		Topic: topic, Key: sarama.StringEncoder("c-1"), Value: sarama.StringEncoder(value),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := prod.Close(); err != nil {
		t.Fatal(err)
	}
	k.Close()

	start = time.Now()
	k2, err := StartKafka(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kafka (kfake) warm start (existing data dir): %s", time.Since(start).Round(time.Millisecond))
	t.Cleanup(k2.Close)
	if n := len(k2.Cluster.PartitionInfos(topic)); n != 3 {
		t.Fatalf("after restart topic has %d partitions, want 3", n)
	}

	consumer, err := sarama.NewConsumer(k2.Brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	pc, err := consumer.ConsumePartition(topic, part, sarama.OffsetOldest)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	select {
	case m := <-pc.Messages():
		if m.Offset != off || string(m.Value) != value || string(m.Key) != "c-1" {
			t.Fatalf("got offset %d key %q value %q; want offset %d key c-1 value %s", m.Offset, m.Key, m.Value, off, value)
		}
	case err := <-pc.Errors():
		t.Fatal(err)
	case <-ctx.Done():
		t.Fatal("message produced before the restart never came back")
	}
}

// TestTemporalRestartKeepsSearchAttributes needs the temporal CLI; when it
// is not in the user cache yet it is built, which takes minutes.
func TestTemporalRestartKeepsSearchAttributes(t *testing.T) {
	bin := temporalBinary(t)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	ports, err := FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	opts := TemporalOptions{
		Binary:    bin,
		DBFile:    filepath.Join(dir, "temporal.db"),
		Port:      ports[0],
		UIPort:    ports[1],
		Namespace: "claimflow",
		SearchAttributes: map[string]string{
			"ClaimId":     "Keyword",
			"ClaimStatus": "Keyword",
			"ClaimAmount": "Double",
		},
	}
	want := map[string]enumspb.IndexedValueType{
		"ClaimId":     enumspb.INDEXED_VALUE_TYPE_KEYWORD,
		"ClaimStatus": enumspb.INDEXED_VALUE_TYPE_KEYWORD,
		"ClaimAmount": enumspb.INDEXED_VALUE_TYPE_DOUBLE,
	}

	startServer := func(label string, o TemporalOptions) *TemporalServer {
		t.Helper()
		start := time.Now()
		s, err := StartTemporal(ctx, o)
		if err != nil {
			t.Fatalf("%s: %v", label, err)
		}
		t.Logf("temporal %s: %s", label, time.Since(start).Round(time.Millisecond))
		t.Cleanup(func() {
			if err := s.Stop(context.Background()); err != nil {
				t.Error(err)
			}
		})
		return s
	}
	check := func(s *TemporalServer) {
		t.Helper()
		c, err := client.DialContext(ctx, client.Options{HostPort: s.Addr, Namespace: s.Namespace})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.CheckHealth(ctx, &client.CheckHealthRequest{}); err != nil {
			t.Fatal(err)
		}
		resp, err := c.OperatorService().ListSearchAttributes(ctx, &operatorservice.ListSearchAttributesRequest{Namespace: s.Namespace})
		if err != nil {
			t.Fatal(err)
		}
		for name, typ := range want {
			if got, ok := resp.GetCustomAttributes()[name]; !ok || got != typ {
				t.Errorf("search attribute %s: got %v (present %v), want %v", name, got, ok, typ)
			}
		}
	}

	s := startServer("cold start (new DB file)", opts)
	check(s)
	if s.UIURL == "" {
		t.Error("UIURL empty although not headless")
	}
	if err := s.Stop(ctx); err != nil {
		t.Fatal(err)
	}

	// Same DB file, search attributes already persisted.
	s = startServer("warm start (existing DB file)", opts)
	check(s)

	// A crash must not corrupt the DB file nor leave the ports taken.
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	headless := opts
	headless.Headless = true
	s = startServer("start after SIGKILL (headless)", headless)
	check(s)
	if s.UIURL != "" {
		t.Errorf("UIURL = %q for a headless server", s.UIURL)
	}

	// Changing an attribute's type on an existing DB cannot work; it
	// must fail loudly at startup, not at the first query.
	if err := s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	clash := headless
	clash.SearchAttributes = map[string]string{"ClaimAmount": "Int"}
	if s, err := StartTemporal(ctx, clash); err == nil {
		_ = s.Stop(ctx)
		t.Fatal("start with a changed search attribute type succeeded")
	} else if !strings.Contains(err.Error(), "ClaimAmount") {
		t.Errorf("error does not name the clashing attribute: %v", err)
	} else {
		t.Logf("type clash error (expected): %v", firstLine(err))
	}
}

func TestTemporalRejectsUnknownSearchAttributeType(t *testing.T) {
	_, err := StartTemporal(context.Background(), TemporalOptions{
		Binary:           "/nonexistent/temporal",
		SearchAttributes: map[string]string{"ClaimId": "String"},
	})
	if err == nil || !strings.Contains(err.Error(), "unknown type") {
		t.Fatalf("err = %v, want an unknown type error", err)
	}
}

func TestTemporalCLIUsesEnv(t *testing.T) {
	fake := filepath.Join(t.TempDir(), "temporal")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TEMPORAL_CLI", fake)
	got, err := TemporalCLI(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got != fake {
		t.Fatalf("TemporalCLI = %q, want %q", got, fake)
	}
}

func firstLine(err error) string {
	s, _, _ := strings.Cut(err.Error(), "\n")
	return s
}

// TestTemporalDiesWithParent checks that a crash of the process that
// started the dev server (here a child copy of this test binary that exits
// without calling Stop) takes the server down with it.
func TestTemporalDiesWithParent(t *testing.T) {
	if os.Getenv("DEVSTACK_ORPHAN_HELPER") == "1" {
		s, err := StartTemporal(context.Background(), TemporalOptions{
			Binary: os.Getenv("TEMPORAL_CLI"), Port: freePort(t), Headless: true,
			LogFile: filepath.Join(os.Getenv("DEVSTACK_ORPHAN_DIR"), "temporal.log"),
		})
		if err != nil {
			fmt.Println("ERR", err)
			os.Exit(2)
		}
		fmt.Printf("PID %d\n", s.cmd.Process.Pid)
		os.Exit(0) // no Stop: simulate a crash
	}
	bin := temporalBinary(t)
	cmd := osexec.Command(os.Args[0], "-test.run=^TestTemporalDiesWithParent$", "-test.count=1")
	cmd.Env = append(os.Environ(), "DEVSTACK_ORPHAN_HELPER=1", "TEMPORAL_CLI="+bin, "DEVSTACK_ORPHAN_DIR="+t.TempDir())
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	var pid int
	for _, line := range strings.Split(string(out), "\n") {
		if p, ok := strings.CutPrefix(line, "PID "); ok {
			pid, _ = strconv.Atoi(p)
		}
	}
	if pid == 0 {
		t.Fatalf("helper printed no pid:\n%s", out)
	}
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) || isZombie(pid) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	t.Fatalf("temporal dev server (pid %d) still running 15s after its parent exited", pid)
}

// TestTemporalCLIBuild builds the CLI from a copy of tools/ into a scratch
// user cache. Opt-in (DEVSTACK_TEST_BUILD=1): cold it takes minutes and
// ~1.8 GB of RAM; with the Go build cache warm from an earlier build of the
// same tools/go.mod (as in CI, right after building the CLI) only the link
// step runs.
func TestTemporalCLIBuild(t *testing.T) {
	if os.Getenv("DEVSTACK_TEST_BUILD") != "1" {
		t.Skip("set DEVSTACK_TEST_BUILD=1 to build the temporal CLI from tools/go.mod")
	}
	// Outside any checkout: the pins travel in the binary.
	t.Chdir(t.TempDir())
	// The go command keeps its own caches under GOCACHE/GOMODCACHE, which
	// default to the user cache too: pin them so that moving the user
	// cache does not make this a cold build.
	for _, v := range []string{"GOCACHE", "GOMODCACHE"} {
		out, err := osexec.Command("go", "env", v).Output()
		if err != nil {
			t.Fatalf("go env %s: %v", v, err)
		}
		t.Setenv(v, strings.TrimSpace(string(out)))
	}
	cache := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", cache)
	t.Setenv("TEMPORAL_CLI", "")

	want, err := TemporalCLIPath()
	if err != nil {
		t.Fatal(err)
	}
	version, err := temporalCLIVersion(toolsGoMod)
	if err != nil {
		t.Fatal(err)
	}
	if exp := filepath.Join(cache, "claimflow", "temporal-cli", version, "temporal"); want != exp {
		t.Fatalf("TemporalCLIPath = %q, want %q", want, exp)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// Two concurrent callers: one builds, the other waits on the lock
	// and then finds the binary.
	type result struct {
		path string
		err  error
	}
	results := make(chan result, 2)
	began := time.Now()
	for range 2 {
		go func() {
			p, err := TemporalCLI(ctx, tWriter{t})
			results <- result{p, err}
		}()
	}
	for range 2 {
		r := <-results
		if r.err != nil {
			t.Fatal(r.err)
		}
		if r.path != want {
			t.Errorf("TemporalCLI = %q, want %q", r.path, want)
		}
	}
	t.Logf("built in %s", time.Since(began).Round(time.Second))
	out, err := osexec.Command(want, "--version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Server") {
		t.Fatalf("%s --version: %v\n%s", want, err, out)
	}
	leftovers, _ := filepath.Glob(filepath.Join(filepath.Dir(want), "temporal.tmp-*"))
	if len(leftovers) > 0 {
		t.Errorf("temp build outputs left behind: %v", leftovers)
	}

	// The next caller, anywhere, finds the cached binary at once.
	t.Chdir(t.TempDir())
	began = time.Now()
	p, err := TemporalCLI(ctx, tWriter{t})
	if err != nil || p != want {
		t.Fatalf("second call: TemporalCLI = %q, %v; want %q", p, err, want)
	}
	if took := time.Since(began); took > 5*time.Second {
		t.Errorf("the second call took %s to find the cached CLI", took)
	}
}

// TestPinsAreTheToolsModule: the pins the binary carries are tools/go.mod
// and tools/go.sum, byte for byte (.ci/run builds the CLI from tools/).
func TestPinsAreTheToolsModule(t *testing.T) {
	for _, tc := range []struct {
		file string
		copy []byte
	}{{"go.mod", toolsGoMod}, {"go.sum", toolsGoSum}} {
		b, err := os.ReadFile(filepath.Join("..", "..", "tools", tc.file))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b, tc.copy) {
			t.Errorf("dev/devstack/tools.%s differs from tools/%s: cp tools/%s dev/devstack/tools.%s", tc.file, tc.file, tc.file, tc.file)
		}
	}
}

func TestTemporalCLIVersionFromGoMod(t *testing.T) {
	for _, tc := range []struct{ mod, want string }{
		{"module x\n\nrequire (\n\tgithub.com/temporalio/cli v1.5.1 // indirect\n\tgithub.com/temporalio/cli/cliext v0.1.0\n)\n", "v1.5.1"},
		{"module x\nrequire github.com/temporalio/cli v1.9.9\n", "v1.9.9"},
	} {
		got, err := temporalCLIVersion([]byte(tc.mod))
		if err != nil || got != tc.want {
			t.Errorf("temporalCLIVersion(%q) = %q, %v; want %q", tc.mod, got, err, tc.want)
		}
	}
	if _, err := temporalCLIVersion([]byte("module x\n")); err == nil {
		t.Error("a go.mod without the CLI gave no error")
	}
}

// temporalBinary returns the CLI, skipping under -short when it would have
// to be built first.
func temporalBinary(t *testing.T) string {
	t.Helper()
	if os.Getenv("TEMPORAL_CLI") == "" && testing.Short() {
		if bin, err := TemporalCLIPath(); err == nil && !isExecutable(bin) {
			t.Skip("the Temporal CLI is not built yet (" + bin + ") and -short is set")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	bin, err := TemporalCLI(ctx, tWriter{t})
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

func TestFreePortsAreDifferent(t *testing.T) {
	ports, err := FreePorts(50)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if seen[p] {
			t.Fatalf("port %d handed out twice in %v", p, ports)
		}
		seen[p] = true
	}
	// The picker offers the same port again: it must be passed over, since
	// the first is still held, not released and handed out a second time.
	base, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	offers := []int{base, base, base, base + 1, base + 2}
	i := 0
	got, err := pickPorts(2, func() int { i++; return offers[(i-1)%len(offers)] })
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] == got[1] || got[0] != base {
		t.Fatalf("picked %v from offers %v: want %d then another port", got, offers, base)
	}
}

func TestFreePortIsOutsideTheEphemeralRange(t *testing.T) {
	lo, hi := belowEphemeralRange()
	for range 20 {
		p, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if p < lo || p >= hi {
			t.Fatalf("port %d outside [%d, %d): outgoing connections could take it", p, lo, hi)
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			t.Fatalf("port %d is not free: %v", p, err)
		}
		l.Close()
	}
}
