package main

import (
	"io"
	"os"
	"strings"
	"testing"
)

// The sitting runs the targets table's rows: the same commands, judged by
// the same goals.
func TestSittingMatchesTheTargetsTable(t *testing.T) {
	doc, err := os.ReadFile("../../docs/performance.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(doc), "## The targets\n")
	if !ok {
		t.Fatal("docs/performance.md has no '## The targets' section")
	}
	table, _, _ = strings.Cut(table, "\n## ")
	rows := func(s string) []string {
		var out []string
		for line := range strings.SplitSeq(table, "\n") {
			if strings.HasPrefix(line, "| ") && strings.Contains(line, s) {
				out = append(out, line)
			}
		}
		return out
	}
	for _, tg := range sittingTargets {
		command := "`" + strings.Join(append([]string{tg.cmd}, tg.args...), " ") + "`"
		found := rows(command)
		if len(found) != 1 {
			t.Errorf("target %s: %d rows of the targets table name %s, want 1", tg.name, len(found), command)
			continue
		}
		if !strings.Contains(found[0], "| "+tg.goal+" |") {
			t.Errorf("target %s: its row's goal is not %q: %s", tg.name, tg.goal, found[0][:min(len(found[0]), 160)])
		}
	}
	if len(rows("| "+peakRSSGoal+" |")) == 0 {
		t.Errorf("no row of the targets table has the goal %q", peakRSSGoal)
	}
}

func TestSittingJudgesByTheMedian(t *testing.T) {
	yes, no := true, false
	burst := func(p50, p95 float64, flat *bool) sittingFigures {
		return sittingFigures{p50: p50, p95: p95, flat: flat}
	}
	ratio := func(r float64) sittingFigures { return sittingFigures{ratio: r} }
	target := func(name string) sittingTarget {
		for _, tg := range sittingTargets {
			if tg.name == name {
				return tg
			}
		}
		t.Fatalf("no target %s", name)
		return sittingTarget{}
	}
	for _, tc := range []struct {
		name, target string
		runs         []sittingFigures
		met          bool
	}{
		{"2000/s, median under the goal", "2000", []sittingFigures{burst(19, 0, nil), burst(35, 0, nil), burst(18, 0, nil)}, true},
		{"2000/s, median over it", "2000", []sittingFigures{burst(19, 0, nil), burst(35, 0, nil), burst(21, 0, nil)}, false},
		{"20/s at the goal", "20", []sittingFigures{burst(10, 0, nil)}, true},
		{"20/s over it", "20", []sittingFigures{burst(10.1, 0, nil)}, false},
		{"full, flat and fast", "full", []sittingFigures{burst(20, 55, &yes), burst(20, 61, &yes), burst(20, 58, &yes)}, true},
		{"full, one run not flat", "full", []sittingFigures{burst(20, 55, &yes), burst(20, 50, &no), burst(20, 58, &yes)}, false},
		{"full, flat but slow", "full", []sittingFigures{burst(30, 65, &yes), burst(30, 61, &yes), burst(30, 58, &yes)}, false},
		{"full without a check", "full", []sittingFigures{burst(20, 50, nil)}, false},
		{"capacity at 2.0, none under 1.5", "capacity", []sittingFigures{ratio(2.0), ratio(1.5), ratio(2.6)}, true},
		{"capacity, one run under 1.5", "capacity", []sittingFigures{ratio(2.0), ratio(1.43), ratio(2.6)}, false},
		{"capacity, median under 2", "capacity", []sittingFigures{ratio(1.86), ratio(1.67), ratio(2.8)}, false},
		{"idle, every run under the goal", "idle", []sittingFigures{{idleRSSMiB: 127}, {idleRSSMiB: 256}, {idleRSSMiB: 130}}, true},
		{"idle, one run over it", "idle", []sittingFigures{{idleRSSMiB: 127}, {idleRSSMiB: 257}, {idleRSSMiB: 130}}, false},
		{"idle, one run unread", "idle", []sittingFigures{{idleRSSMiB: 127}, {}, {idleRSSMiB: 130}}, false},
		{"no runs", "2000", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := judge(target(tc.target), tc.runs); got != tc.met {
				t.Errorf("judge = %v, want %v", got, tc.met)
			}
		})
	}
	if got := medianRange([]float64{41, 27.2, 41}, "%.1f"); got != "41.0 (27.2–41.0)" {
		t.Errorf("medianRange = %q", got)
	}
}

func TestSittingFlags(t *testing.T) {
	r, err := parseSitting([]string{"--targets", "20,capacity", "--rounds", "2"}, io.Discard)
	if err != nil || r.rounds != 2 || len(r.targets) != 2 || r.targets[0].name != "20" || r.targets[1].cmd != "capacity" {
		t.Errorf("parseSitting = %+v, %v", r, err)
	}
	for _, args := range [][]string{{"--targets", "2000,fast"}, {"--rounds", "0"}, {"extra"}} {
		if _, err := parseSitting(args, io.Discard); err == nil {
			t.Errorf("parseSitting(%v) accepted", args)
		}
	}
}

// The table says what each row's runs gave and whether the goal is met; a
// --quick sitting is not judged.
func TestSittingTable(t *testing.T) {
	yes := true
	results := map[string][]sittingFigures{
		"20":       {{p50: 9.6, p95: 12.8, p99: 20, busy: 0.14, rssMiB: 180, auditOK: true}, {p50: 10.2, p95: 14, p99: 22, busy: 0.15, rssMiB: 190, auditOK: true}, {p50: 10.0, p95: 13.7, p99: 21, busy: 0.14, rssMiB: 185, auditOK: true}},
		"full":     {{p50: 30, p95: 58, p99: 80, busy: 0.75, rssMiB: 260, auditOK: true, flat: &yes}},
		"capacity": {{cf: 3500, peer: 1750, ratio: 2}},
		"idle":     {{p50: 30, p95: 60, p99: 90, rssMiB: 400, idleRSSMiB: 127, auditOK: true}, {p50: 30, p95: 60, p99: 90, rssMiB: 410, idleRSSMiB: 131, auditOK: true}},
	}
	targets := []sittingTarget{sittingTargets[1], sittingTargets[2], sittingTargets[3], sittingTargets[4]}
	var b strings.Builder
	writeSitting(&b, targets, results, false)
	for _, want := range []string{
		"20/s (burst --rate 20 --ramp 10s --hold 30s --rampdown 5s), goal p50 ≤ 10 ms; runs: 3\n  p50 / p95 / p99: 10.0 (9.6–10.2) / 13.7 (12.8–14.0) / 21.0 (20.0–22.0) ms; busy 14.0 (14.0–15.0) %, steal at most 0.0 %\n  audits clean: 3 of 3\n  met: yes\n",
		"audits clean: 1 of 1; flat: 1 of 1\n  met: yes\n",
		"capacity (capacity), goal ≥ 2.0×, no run under 1.5; runs: 1\n  claimflow 3500/s, peer 1750/s, ratio 2.00\n  met: yes\n",
		"idle RSS after 1 M events (burst --rate 2000 --ramp 10s --hold 560s --rampdown 5s --seats 20000 --students 2000000), goal ≤ 256 MiB; runs: 2\n",
		"  idle RSS 3m0s after the command, the dev process: 129 (127–131) MiB\n  met: yes\n",
		// The idle runs' ten-minute peaks are not the peak RSS row's.
		"goal ≤ 256 MiB: 188 (180–260) MiB; met: no\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the table lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	writeSitting(&b, targets, results, true)
	if strings.Contains(b.String(), "met: yes") || strings.Contains(b.String(), "met: no\n") ||
		!strings.Contains(b.String(), "20/s (burst --quick)") || !strings.Contains(b.String(), "idle RSS 5s after the command") {
		t.Errorf("a --quick sitting is judged, or names the targets' commands:\n%s", b.String())
	}
}
