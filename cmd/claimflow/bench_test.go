package main

// The benchmark harness against the real stack, in its --quick form, so the
// harness cannot rot: every subcommand runs end to end, writes the JSON keys
// the issue names, and its audit finds nothing lost, duplicated or oversold.

import (
	"bytes"
	"context"
	"encoding/json"
	"image/png"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestBenchQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("the bench runs against the real stack; skipped with -short")
	}
	s := startTestStack(t, testStackOptions(t, dataDir(t)))
	out := t.TempDir()
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	target := "http://" + s.API.Addr
	run := func(t *testing.T, args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		var stdout bytes.Buffer
		err := runBench(ctx, s.Config, log, args, &stdout, testWriter{t})
		t.Logf("claimflow bench %s:\n%s", strings.Join(args, " "), stdout.String())
		if err != nil {
			t.Fatalf("bench %v: %v", args, err)
		}
		return stdout.String()
	}

	t.Run("burst", func(t *testing.T) {
		jsonFile, plotFile := filepath.Join(out, "burst.json"), filepath.Join(out, "burst.png")
		summary := run(t, "burst", "--quick", "--target", target, "--pid", strconv.Itoa(os.Getpid()),
			"--progress", "1s", "--json", jsonFile, "--plot", plotFile)
		for _, want := range []string{"http_reqs", "http_req_duration", "requested → recorded", "audit"} {
			if !strings.Contains(summary, want) {
				t.Errorf("summary lacks %q", want)
			}
		}
		arm := readJSON(t, jsonFile)
		checkArm(t, "burst", arm, 250)
		if arm["rss_mb"] == nil {
			t.Error("rss_mb is null although --pid was given")
		}
		checkPNG(t, plotFile)
	})

	t.Run("peer", func(t *testing.T) {
		jsonFile := filepath.Join(out, "peer.json")
		run(t, "peer", "--quick", "--json", jsonFile)
		checkArm(t, "peer", readJSON(t, jsonFile), 250)
	})

	t.Run("compare", func(t *testing.T) {
		jsonFile, plotFile := filepath.Join(out, "compare.json"), filepath.Join(out, "compare.png")
		table := run(t, "compare", "--quick", "--rate", "20", "--hold", "2s", "--target", target,
			"--json", jsonFile, "--plot", plotFile)
		if !strings.Contains(table, "| claimflow | peer (outbox) | claimflow ÷ peer |") {
			t.Error("compare printed no comparison table")
		}
		c := readJSON(t, jsonFile)
		for _, arm := range []string{"claimflow", "peer"} {
			a, _ := c[arm].(map[string]any)
			checkArm(t, arm, a, 40)
		}
		ratio, _ := c["ratio"].(map[string]any)
		for _, k := range []string{"throughput", "p50", "p95"} {
			if v, ok := ratio[k].(float64); !ok || v <= 0 {
				t.Errorf("ratio.%s = %v", k, ratio[k])
			}
		}
		checkPNG(t, plotFile)
	})

	t.Run("floor", func(t *testing.T) {
		jsonFile := filepath.Join(out, "floor.json")
		run(t, "floor", "--quick", "--json", jsonFile)
		f := readJSON(t, jsonFile)
		if f["completed"] != float64(100) || f["errors"] != float64(0) {
			t.Errorf("floor: %v", f)
		}
		if v, _ := f["wf_per_s"].(float64); v <= 0 {
			t.Errorf("floor wf_per_s = %v", f["wf_per_s"])
		}
	})
}

func readJSON(t *testing.T, path string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]any{}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return m
}

// checkArm checks one arm's JSON: every key the issue lists, a clean audit,
// and answers that add up. scheduled is the number of iterations.
func checkArm(t *testing.T, name string, arm map[string]any, scheduled int) {
	t.Helper()
	obj := func(m map[string]any, key string) map[string]any {
		v, ok := m[key].(map[string]any)
		if !ok {
			t.Fatalf("%s: %q is %v, want an object", name, key, m[key])
		}
		return v
	}
	num := func(m map[string]any, key string) float64 {
		v, ok := m[key].(float64)
		if !ok {
			t.Fatalf("%s: %q is %v, want a number", name, key, m[key])
		}
		return v
	}
	for _, k := range []string{"requests", "achieved_rps", "confirmed_per_s", "failure_rate"} {
		num(arm, k)
	}
	if _, ok := arm["rss_mb"]; !ok {
		t.Errorf("%s: no rss_mb key", name)
	}
	// A loaded CI machine may make claimflow answer 503 + Retry-After
	// (Temporal slower than the API's decision timeout): that is a
	// measurement. A connection error or an unexpected status is a bug.
	failures := obj(arm, "failures")
	num(failures, "5xx")
	num(failures, "timeout")
	for _, k := range []string{"conn", "other"} {
		if n := num(failures, k); n != 0 {
			t.Errorf("%s: %v failures of kind %s", name, n, k)
		}
	}
	lat := obj(arm, "latency_ms")
	for _, k := range []string{"avg", "p50", "p90", "p95", "p99", "max"} {
		num(lat, k)
	}
	if num(lat, "p50") > num(lat, "p95") || num(lat, "p95") > num(lat, "max") {
		t.Errorf("%s: latency percentiles out of order: %v", name, lat)
	}
	stages := obj(arm, "stages_ms")
	for _, s := range []string{"requested_to_recorded", "recorded_to_published", "requested_to_confirmed"} {
		st := obj(stages, s)
		for _, k := range []string{"avg", "p50", "p95"} {
			if num(st, k) < 0 {
				t.Errorf("%s: %s.%s is negative", name, s, k)
			}
		}
	}
	a := obj(arm, "audit")
	for _, k := range []string{"lost", "duplicate_events", "missing_events", "oversold_courses"} {
		if n := num(a, k); n != 0 {
			t.Errorf("%s: audit %s = %v, want 0 (audit %v)", name, k, n, a)
		}
	}
	if a["drained"] != true {
		t.Errorf("%s: the run did not drain: %v", name, a)
	}
	status := obj(arm, "status")
	var answered float64
	for _, code := range []string{"201", "409", "503", "timeout"} {
		n, _ := status[code].(float64)
		answered += n
	}
	if n, _ := status["201"].(float64); n < 1 {
		t.Errorf("%s: no enrollment accepted: %v", name, status)
	}
	if requests := num(arm, "requests"); answered != requests {
		t.Errorf("%s: %v requests but only %v answered 201/409/503/timeout: %v", name, requests, answered, status)
	}
	it := obj(arm, "iterations")
	if num(it, "scheduled") != float64(scheduled) || num(it, "started")+num(it, "dropped") != float64(scheduled) {
		t.Errorf("%s: iterations %v, want %d scheduled", name, it, scheduled)
	}
	if num(a, "confirmed") != num(a, "enrollments") || num(a, "events") != num(a, "confirmed") ||
		num(a, "accepted") > num(a, "confirmed") {
		t.Errorf("%s: audit %v: every enrollment should be confirmed with one event", name, a)
	}
}

func checkPNG(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("%s is not a PNG: %v", path, err)
	}
	if img.Bounds().Dx() < 100 || img.Bounds().Dy() < 100 {
		t.Fatalf("%s is only %v", path, img.Bounds())
	}
}
