package devstack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"
)

// TemporalOptions configures StartTemporal. Zero values get the defaults
// noted on each field.
type TemporalOptions struct {
	// Binary is the temporal CLI; empty means TemporalCLI(ctx, os.Stderr).
	Binary string
	// DBFile is the SQLite file that holds the server's state across
	// restarts; empty keeps everything in memory.
	DBFile string
	// IP to bind gRPC and the UI to; default 127.0.0.1.
	IP string
	// Port for gRPC; default 7233.
	Port int
	// UIPort for the web UI; default 8233.
	UIPort int
	// Namespace to create if missing; default "default".
	Namespace string
	// SearchAttributes maps attribute name to type ("Keyword", "Text",
	// "Int", "Double", "Bool", "Datetime", "KeywordList").
	SearchAttributes map[string]string
	// Headless skips the web UI.
	Headless bool
	// DynamicConfig sets server dynamic config keys, each value in JSON
	// (e.g. "frontend.searchAttributesSizeOfValueLimit": "16384").
	DynamicConfig map[string]string
	// LogFile receives the server's stdout and stderr (appended) so they
	// stay off our terminal; default DBFile+".log", or a file in the temp
	// dir when DBFile is empty.
	LogFile string
}

// TemporalServer is a running `temporal server start-dev` process.
type TemporalServer struct {
	// Addr is the gRPC host:port for client.Options.HostPort.
	Addr string
	// UIURL is the web UI, e.g. http://127.0.0.1:8233; empty when headless.
	UIURL string
	// Namespace the server was started with.
	Namespace string
	// LogFile holds the server's output.
	LogFile string

	cmd     *exec.Cmd
	done    chan struct{}
	waitErr error // set before done is closed
	stopMu  sync.Mutex
}

// StartTemporal starts a Temporal dev server and returns once it serves
// gRPC, answers an SDK health check, has the requested search attributes and
// (unless headless) serves the UI. The server runs in its own process group
// and outlives ctx; call Stop (or Kill) to end it.
func StartTemporal(ctx context.Context, o TemporalOptions) (*TemporalServer, error) {
	started := time.Now()
	if err := o.defaults(ctx); err != nil {
		return nil, err
	}
	attrs, err := parseSearchAttributes(o.SearchAttributes)
	if err != nil {
		return nil, err
	}
	addr := net.JoinHostPort(o.IP, strconv.Itoa(o.Port))
	// A leftover server from an earlier run (e.g. killed where Pdeathsig
	// does not exist) would answer our readiness checks while our own
	// process fails to bind, so refuse up front with a clear message.
	if err := portFree(addr); err != nil {
		return nil, fmt.Errorf("temporal gRPC port: %w (is an earlier `temporal server start-dev` still running? stop it or choose another port)", err)
	}
	if !o.Headless {
		if err := portFree(net.JoinHostPort(o.IP, strconv.Itoa(o.UIPort))); err != nil {
			return nil, fmt.Errorf("temporal UI port: %w (stop whatever uses it, pick another UIPort, or run headless)", err)
		}
	}
	if o.DBFile != "" {
		if err := os.MkdirAll(filepath.Dir(o.DBFile), 0o755); err != nil {
			return nil, fmt.Errorf("create directory for the temporal DB file: %w", err)
		}
	}
	logf, err := openAppend(o.LogFile)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(logf, "\n=== %s devstack: starting temporal dev server on %s ===\n", time.Now().Format(time.RFC3339), addr)

	cmd := exec.Command(o.Binary, o.args(attrs)...)
	// The server reads OTEL_* too, and refuses to start on an exporter it
	// does not know: the application's tracing settings are not its own.
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "OTEL_") })
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = groupAttr()
	err = cmd.Start()
	// The child has its own descriptor; ours is no longer needed.
	logf.Close()
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", o.Binary, err)
	}
	s := &TemporalServer{
		Addr:      addr,
		Namespace: o.Namespace,
		LogFile:   o.LogFile,
		cmd:       cmd,
		done:      make(chan struct{}),
	}
	if !o.Headless {
		s.UIURL = "http://" + net.JoinHostPort(o.IP, strconv.Itoa(o.UIPort))
	}
	go func() {
		s.waitErr = cmd.Wait()
		close(s.done)
	}()

	if err := s.waitReady(ctx, attrs); err != nil {
		_ = s.Kill()
		if errors.Is(err, errExited) {
			err = fmt.Errorf("temporal dev server exited during startup (%v): %w", s.waitErr, err)
		}
		return nil, withTail(fmt.Errorf("start temporal dev server on %s: %w", addr, err), o.LogFile)
	}
	slog.InfoContext(ctx, "temporal dev server ready", "addr", addr, "ui", s.UIURL, "namespace", o.Namespace,
		"db", o.DBFile, "log", o.LogFile, "pid", cmd.Process.Pid, "took", time.Since(started).Round(time.Millisecond))
	return s, nil
}

func (o *TemporalOptions) defaults(ctx context.Context) error {
	if o.Binary == "" {
		bin, err := TemporalCLI(ctx, os.Stderr)
		if err != nil {
			return err
		}
		o.Binary = bin
	}
	if o.IP == "" {
		o.IP = "127.0.0.1"
	}
	if o.Port == 0 {
		o.Port = 7233
	}
	if o.UIPort == 0 {
		o.UIPort = 8233
	}
	if o.Namespace == "" {
		o.Namespace = "default"
	}
	if o.LogFile == "" {
		if o.DBFile != "" {
			o.LogFile = o.DBFile + ".log"
		} else {
			o.LogFile = filepath.Join(os.TempDir(), fmt.Sprintf("claimflow-temporal-%d.log", o.Port))
		}
	}
	return nil
}

func (o *TemporalOptions) args(attrs map[string]enumspb.IndexedValueType) []string {
	args := []string{"server", "start-dev",
		"--ip", o.IP,
		"--port", strconv.Itoa(o.Port),
		"--ui-port", strconv.Itoa(o.UIPort),
		"--namespace", o.Namespace,
		"--log-level", "warn",
	}
	if o.DBFile != "" {
		// WAL with synchronous=normal syncs far less often than the
		// defaults and still survives a process crash (only an OS crash
		// can lose the last transactions, which is fine for dev data).
		args = append(args, "--db-filename", o.DBFile,
			"--sqlite-pragma", "journal_mode=wal",
			"--sqlite-pragma", "synchronous=normal")
	}
	for _, name := range sortedKeys(attrs) {
		args = append(args, "--search-attribute", name+"="+shortTypeName(attrs[name]))
	}
	for _, key := range sortedKeys(o.DynamicConfig) {
		args = append(args, "--dynamic-config-value", key+"="+o.DynamicConfig[key])
	}
	if o.Headless {
		args = append(args, "--headless")
	}
	return args
}

func (s *TemporalServer) waitReady(ctx context.Context, attrs map[string]enumspb.IndexedValueType) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	var d net.Dialer
	err := pollUntilExit(ctx, 50*time.Millisecond, s.done, func(ctx context.Context) error {
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		c, err := d.DialContext(dctx, "tcp", s.Addr)
		if err != nil {
			return err
		}
		return c.Close()
	})
	if err != nil {
		return fmt.Errorf("gRPC port never accepted connections: %w", err)
	}

	var c client.Client
	err = pollUntilExit(ctx, 100*time.Millisecond, s.done, func(ctx context.Context) error {
		if c == nil {
			dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			var err error
			c, err = client.DialContext(dctx, client.Options{
				HostPort:  s.Addr,
				Namespace: s.Namespace,
				// The probe's retries are expected; keep them off the terminal.
				Logger: sdklog.NewStructuredLogger(slog.New(slog.DiscardHandler)),
			})
			if err != nil {
				return err
			}
		}
		hctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := c.CheckHealth(hctx, &client.CheckHealthRequest{})
		return err
	})
	if c != nil {
		defer c.Close()
	}
	if err != nil {
		return fmt.Errorf("SDK health check never passed: %w", err)
	}
	if err := ensureSearchAttributes(ctx, c, s.Namespace, attrs); err != nil {
		return err
	}

	if s.UIURL != "" {
		hc := &http.Client{Timeout: 2 * time.Second}
		err := pollUntilExit(ctx, 100*time.Millisecond, s.done, func(ctx context.Context) error {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.UIURL, nil)
			if err != nil {
				return err
			}
			resp, err := hc.Do(req)
			if err != nil {
				return err
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("GET %s: %s", s.UIURL, resp.Status)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("web UI never answered 200: %w", err)
		}
	}
	select {
	case <-s.done:
		return fmt.Errorf("became ready, then: %w", errExited)
	default:
		return nil
	}
}

// ensureSearchAttributes checks that every wanted attribute exists with the
// wanted type and registers the missing ones. start-dev registers them from
// its flags too, but checking here makes a type clash with an attribute
// persisted by an earlier run an explicit error instead of a query failing
// much later.
func ensureSearchAttributes(ctx context.Context, c client.Client, namespace string, want map[string]enumspb.IndexedValueType) error {
	if len(want) == 0 {
		return nil
	}
	resp, err := c.OperatorService().ListSearchAttributes(ctx, &operatorservice.ListSearchAttributesRequest{Namespace: namespace})
	if err != nil {
		return fmt.Errorf("list search attributes of namespace %q: %w", namespace, err)
	}
	missing := map[string]enumspb.IndexedValueType{}
	for name, typ := range want {
		have, ok := resp.GetCustomAttributes()[name]
		if !ok {
			missing[name] = typ
			continue
		}
		if have != typ {
			return fmt.Errorf("search attribute %q already exists in namespace %q as %s, want %s: use a new DB file or rename the attribute (a search attribute's type cannot change)",
				name, namespace, shortTypeName(have), shortTypeName(typ))
		}
	}
	if len(missing) == 0 {
		return nil
	}
	slog.InfoContext(ctx, "registering temporal search attributes", "namespace", namespace, "attributes", sortedKeys(missing))
	_, err = c.OperatorService().AddSearchAttributes(ctx, &operatorservice.AddSearchAttributesRequest{
		Namespace:        namespace,
		SearchAttributes: missing,
	})
	if err != nil {
		return fmt.Errorf("register search attributes %v in namespace %q: %w", sortedKeys(missing), namespace, err)
	}
	return nil
}

// parseSearchAttributes validates types up front: a typo would otherwise
// surface as the dev server exiting with a flag error in its log file.
func parseSearchAttributes(in map[string]string) (map[string]enumspb.IndexedValueType, error) {
	out := make(map[string]enumspb.IndexedValueType, len(in))
	for name, typ := range in {
		if name == "" || strings.ContainsAny(name, "= \t") {
			return nil, fmt.Errorf("invalid search attribute name %q", name)
		}
		v, ok := lookupIndexedValueType(typ)
		if !ok {
			return nil, fmt.Errorf("search attribute %q has unknown type %q: use one of Keyword, Text, Int, Double, Bool, Datetime, KeywordList", name, typ)
		}
		out[name] = v
	}
	return out, nil
}

func lookupIndexedValueType(s string) (enumspb.IndexedValueType, bool) {
	for v := range enumspb.IndexedValueType_name {
		t := enumspb.IndexedValueType(v)
		if t == enumspb.INDEXED_VALUE_TYPE_UNSPECIFIED {
			continue
		}
		if strings.EqualFold(s, shortTypeName(t)) || strings.EqualFold(s, t.String()) {
			return t, true
		}
	}
	return 0, false
}

// shortTypeName gives the form the CLI flag and humans use: "Keyword", not
// "INDEXED_VALUE_TYPE_KEYWORD".
func shortTypeName(t enumspb.IndexedValueType) string {
	switch t {
	case enumspb.INDEXED_VALUE_TYPE_TEXT:
		return "Text"
	case enumspb.INDEXED_VALUE_TYPE_KEYWORD:
		return "Keyword"
	case enumspb.INDEXED_VALUE_TYPE_INT:
		return "Int"
	case enumspb.INDEXED_VALUE_TYPE_DOUBLE:
		return "Double"
	case enumspb.INDEXED_VALUE_TYPE_BOOL:
		return "Bool"
	case enumspb.INDEXED_VALUE_TYPE_DATETIME:
		return "Datetime"
	case enumspb.INDEXED_VALUE_TYPE_KEYWORD_LIST:
		return "KeywordList"
	default:
		return t.String()
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// portFree reports an error if something already listens on addr.
func portFree(addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("%s is not available: %w", addr, err)
	}
	return l.Close()
}

// Done is closed when the server process has exited, for callers that want
// to notice a crash while they run.
func (s *TemporalServer) Done() <-chan struct{} { return s.done }

// Stop asks the server's process group to exit (SIGTERM), waits up to 10s,
// then kills it. Calling Stop again, or after Kill, is a no-op.
func (s *TemporalServer) Stop(ctx context.Context) error {
	if s == nil {
		return nil
	}
	s.stopMu.Lock()
	defer s.stopMu.Unlock()
	select {
	case <-s.done:
		return nil
	default:
	}
	pgid := s.cmd.Process.Pid
	if err := syscall.Kill(-pgid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("signal temporal dev server (pgid %d): %w", pgid, err)
	}
	t := time.NewTimer(10 * time.Second)
	defer t.Stop()
	select {
	case <-s.done:
		return nil
	case <-t.C:
		slog.WarnContext(ctx, "temporal dev server ignored SIGTERM for 10s; killing it", "pid", pgid)
	case <-ctx.Done():
	}
	err := s.killLocked()
	if ctx.Err() != nil {
		return fmt.Errorf("stop temporal dev server: %w (killed it)", ctx.Err())
	}
	return err
}

// Kill ends the server's process group with SIGKILL at once, as a crash
// would, and waits for the process to be reaped.
func (s *TemporalServer) Kill() error {
	if s == nil {
		return nil
	}
	s.stopMu.Lock()
	defer s.stopMu.Unlock()
	return s.killLocked()
}

func (s *TemporalServer) killLocked() error {
	select {
	case <-s.done:
		// Once reaped, the pid (and so the group id) may be reused by an
		// unrelated process: never signal it again.
		return nil
	default:
	}
	pgid := s.cmd.Process.Pid
	if err := syscall.Kill(-pgid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("kill temporal dev server (pgid %d): %w", pgid, err)
	}
	select {
	case <-s.done:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("temporal dev server (pid %d) still not reaped 10s after SIGKILL", pgid)
	}
}
