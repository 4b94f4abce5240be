package main

// The flags alone, with no stack: that each subcommand answers -h, and that
// --quick builds the options cmd/claimflow's TestBenchQuick runs against the
// real stack, so the two cannot drift apart unnoticed.

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/claimflow/claimflow/bench"
)

func TestHelpIsNotAFailure(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"--help"}, {"help"}, {"burst", "-h"}, {"peer", "-h"}, {"compare", "-h"}, {"floor", "-h"}, {"disk", "-h"}, {"capacity", "-h"}, {"reads", "-h"}} {
		var out, errOut strings.Builder
		err := run(context.Background(), args, &out, &errOut)
		if !errors.Is(err, flag.ErrHelp) {
			t.Errorf("%v: %v, want flag.ErrHelp (exit 0)", args, err)
		}
		if !strings.Contains(out.String()+errOut.String(), "-") {
			t.Errorf("%v printed no usage", args)
		}
	}
	for _, args := range [][]string{nil, {"nosuch"}} {
		if err := run(context.Background(), args, io.Discard, io.Discard); !errors.Is(err, errUsage) {
			t.Errorf("%v: %v, want the usage error (exit 2)", args, err)
		}
	}
}

func TestQuickFlags(t *testing.T) {
	env := benchEnv{HTTPAddr: "127.0.0.1:8080", KafkaBrokers: []string{"127.0.0.1:9092"}}
	parse := func(mode string, args ...string) loadRun {
		t.Helper()
		r, err := parseLoad(env, mode, args, io.Discard)
		if err != nil {
			t.Fatalf("%s %v: %v", mode, args, err)
		}
		return r
	}

	r := parse("burst", "--quick", "--pid", "42")
	if !reflect.DeepEqual(r.opts.Scenario, bench.QuickScenario()) {
		t.Errorf("burst --quick scenario = %+v, want %+v", r.opts.Scenario, bench.QuickScenario())
	}
	o := r.opts
	if o.Courses != 5 || o.Seats != 40 || o.Students != 1_000_000 || o.DrainTimeout != time.Minute ||
		o.Timeout != 60*time.Second || o.MaxRetries != 3 {
		t.Errorf("burst --quick options = %+v", o)
	}
	if r.arm.URL != "http://127.0.0.1:8080" || !reflect.DeepEqual(r.arm.PIDs, []int{42}) || r.arm.RSSScope != "pids 42" {
		t.Errorf("burst arm = %+v", r.arm)
	}

	want := bench.ShapedScenario(20, 0, 2*time.Second, 0)
	want.MaxVUs = 200
	if got := parse("compare", "--quick", "--rate", "20", "--hold", "2s").opts.Scenario; !reflect.DeepEqual(got, want) {
		t.Errorf("compare --quick --rate 20 --hold 2s scenario = %+v, want %+v", got, want)
	}

	user := parse("burst").opts
	if !reflect.DeepEqual(user.Scenario, bench.UserScenario()) || user.Courses != 100 || user.Seats != 5000 {
		t.Errorf("burst without flags = %+v, want the user's scenario", user)
	}

	if _, err := parseLoad(env, "burst", []string{"extra"}, io.Discard); err == nil {
		t.Error("a stray argument was accepted")
	}
}

// The stage table reads the API's /metrics: where 'claimflow dev' and the
// services serve it, unless --metrics says; where that cannot be known,
// the arm says why instead.
func TestMetricsURLs(t *testing.T) {
	internal := benchEnv{HTTPAddr: "127.0.0.1:8080", InternalHTTPAddr: ":9466"}
	tests := []struct {
		name     string
		env      benchEnv
		args     []string
		want     []string
		wantNote string
	}{
		{"the public address serves /metrics", benchEnv{HTTPAddr: "127.0.0.1:8080"}, nil,
			[]string{"http://127.0.0.1:8080/metrics"}, ""},
		{"so does another target's", benchEnv{HTTPAddr: "127.0.0.1:8080"}, []string{"--target", "http://api.test:9000/"},
			[]string{"http://api.test:9000/metrics"}, ""},
		{"INTERNAL_HTTP_ADDR moves it", internal, nil, []string{"http://127.0.0.1:9466/metrics"}, ""},
		{"INTERNAL_HTTP_ADDR is not another target's", internal, []string{"--target", "http://api.test:9000"},
			nil, "pass --metrics"},
		{"--metrics wins", internal, []string{"--target", "http://api.test:9000", "--metrics", "http://api.test:9466/metrics",
			"--metrics", "http://worker.test:9464/metrics"},
			[]string{"http://api.test:9466/metrics", "http://worker.test:9464/metrics"}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := parseLoad(tc.env, "burst", tc.args, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(r.arm.Metrics, tc.want) || !strings.Contains(r.arm.NoMetrics, tc.wantNote) ||
				(tc.wantNote == "") != (r.arm.NoMetrics == "") {
				t.Errorf("metrics %v, note %q; want %v, a note with %q", r.arm.Metrics, r.arm.NoMetrics, tc.want, tc.wantNote)
			}
		})
	}
}

// TestDiskQuick runs the CI form of the disk floor on this machine's disk:
// it needs no stack, and its JSON holds what the table printed.
func TestDiskQuick(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(t.TempDir(), "disk.json")
	var stdout strings.Builder
	if err := run(context.Background(), []string{"disk", "--quick", "--dir", dir, "--rate", "50", "--json", out}, &stdout, io.Discard); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var r bench.DiskResult
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	if r.DurationS != 2 || r.Rate != 50 || r.Flushes+r.Missed != 100 || r.Flushes == 0 {
		t.Errorf("disk --quick --rate 50: %+v, want 2 s of 100 slots", r)
	}
	if !strings.Contains(stdout.String(), fmt.Sprintf("| %d | 50.0 | %d |", r.Flushes, r.Missed)) {
		t.Errorf("the table does not match the JSON:\n%s", stdout.String())
	}
}
