package bench

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
)

// WriteSummary prints one arm the way k6 prints its end-of-test summary,
// then the stage latencies and the audit.
func WriteSummary(w io.Writer, r *Result) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	p("\n== %s  (%s, run %s)\n", r.Name, r.Target, r.RunID)
	p("  scenario ..............: %s\n", r.Scenario)
	it := r.Iterations
	p("  iterations ............: %d scheduled, %d started, %d dropped, %d late (>50ms behind schedule), max %d VUs busy\n",
		it.Scheduled, it.Started, it.Dropped, it.Late, it.MaxInFlight)
	p("  http_reqs .............: %d  %.1f/s  (201/409 answers: %.1f/s)\n", r.Requests, r.AchievedRPS, r.OKRPS)
	p("  http_req_status .......: %s\n", statusLine(r.Status))
	f := r.Failures
	p("  http_req_failed .......: %.2f%%  (%d: 5xx=%d timeout=%d conn=%d other=%d)\n",
		100*r.FailureRate, f.Total(), f.Server, f.Timeout, f.Conn, f.Other)
	l := r.Latency
	p("  http_req_duration .....: avg=%s p50=%s p90=%s p95=%s p99=%s max=%s\n",
		fmtMS(l.Avg), fmtMS(l.P50), fmtMS(l.P90), fmtMS(l.P95), fmtMS(l.P99), fmtMS(l.Max))
	p("  retries after Retry-After: %d\n", r.Retries)
	p("  stage latencies from the database (ms):   count       avg       p50       p95\n")
	stage := func(name string, s StageLatency) {
		p("    %-36s %9d %9.1f %9.1f %9.1f\n", name, s.Count, s.Avg, s.P50, s.P95)
	}
	stage("requested → recorded", r.Stages.RequestedToRecorded)
	stage("recorded → published", r.Stages.RecordedToPublished)
	stage("requested → confirmed", r.Stages.RequestedToConfirmed)
	stage("published → confirmed", r.Stages.PublishedToConfirmed)
	p("  confirmed/s ...........: %.1f (first request → last confirmation), %.1f at the best 10 s\n", r.ConfirmedPerS, r.ConfirmedPerSPeak)
	a := r.Audit
	drained := fmt.Sprintf("drained in %.1fs", a.DrainS)
	if !a.Drained {
		drained = fmt.Sprintf("NOT drained after %.1fs", a.DrainS)
	}
	verdict := "OK"
	switch {
	case !a.OK():
		verdict = "FAILED"
	case !a.Drained && a.Holders != nil && a.Holders.Orphaned > 0:
		verdict = fmt.Sprintf("OK so far: %d claims held by a live run, %d orphaned (no run holds them; the oldest %.0fs, the recovery finishes them within %.0fs): %s",
			a.Holders.InFlight, a.Holders.Orphaned, a.Holders.OldestOrphan, a.Holders.BoundS, strings.Join(a.Holders.OrphanIDs, " "))
	case !a.Drained && a.Holders != nil:
		verdict = fmt.Sprintf("OK so far: %d claims still in flight, each held by a live run; raise --drain-timeout for a final answer", a.Holders.InFlight)
	case !a.Drained:
		verdict = fmt.Sprintf("OK so far: %d claims not yet settled; raise --drain-timeout for a final answer", a.Pending)
	}
	if h := a.Holders; h != nil && h.Overdue > 0 {
		verdict = fmt.Sprintf("FAILED: %d reservations orphaned for longer than the recovery bound (%.0fs): %s", h.Overdue, h.BoundS, strings.Join(h.OrphanIDs, " "))
	}
	p("  audit (%s): %s\n", drained, verdict)
	p("    accepted %d, enrollments in db %d (confirmed %d, not terminal %d, never told to a client: %d)\n",
		a.Accepted, a.Enrollments, a.Confirmed, a.Pending, a.UnansweredInDB)
	p("    lost %d, duplicate events %d, missing events %d, unexpected events %d, oversold courses %d (%d confirmed events on the topic, %d of them redelivered copies)\n",
		a.Lost, a.DuplicateEvents, a.MissingEvents, a.UnexpectedEvents, a.OversoldCourses, a.Events, a.Redelivered)
	if w := r.Waitlist; w != nil {
		v := "OK"
		if !w.OK() {
			v = "FAILED"
		}
		au := w.Audit
		p("  churn and waitlist ....: %d cancelled, %d waitlisted, %d promoted; freed seat → promoted confirmed p50 %.1f ms, p95 %.1f ms (%d)\n",
			w.Cancelled, w.Waitlisted, w.Promoted, w.PromotionMS.P50, w.PromotionMS.P95, w.PromotionMS.Count)
		p("    waitlist audit: %s — free seats while someone waits %d, oversold %d, counters off %d, promoted twice %d, FIFO violations %d, waitlisted and enrolled %d; still waiting %d\n",
			v, len(au.FreeSeatsWhileWaiting), len(au.Oversold), len(au.CounterMismatches), au.DoublePromotions, au.OutOfOrder, au.WaitlistedAndEnrolled, au.Waiting)
	}
	if r.RSSMB != nil {
		p("  peak RSS ..............: %.1f MiB (%s)\n", *r.RSSMB, r.RSSScope)
	} else {
		p("  peak RSS ..............: not measured (pass --pid)\n")
	}
	switch {
	case r.StageTable != nil:
		writeStageTable(w, r.StageTable)
	case r.NoStageTable != "":
		p("  stage table ...........: none: %s\n", r.NoStageTable)
	}
	if r.Growth != nil {
		writeGrowth(w, r.Growth)
	}
}

func statusLine(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + strconv.Itoa(m[k])
	}
	return strings.Join(parts, " ")
}

func fmtMS(v float64) string {
	if v >= 1000 {
		return fmt.Sprintf("%.2fs", v/1000)
	}
	return fmt.Sprintf("%.1fms", v)
}

// WriteCompareTable prints both arms side by side as a Markdown table.
func WriteCompareTable(w io.Writer, c *Comparison) {
	cf, pe := c.Claimflow, c.Peer
	rows := [][4]string{
		{"requests", itoa(cf.Requests), itoa(pe.Requests), ""},
		{"achieved req/s (all answers, incl. 503 and retries)", f1(cf.AchievedRPS), f1(pe.AchievedRPS), fx(c.Ratio.AchievedRPS)},
		{"201/409 answers/s", f1(cf.OKRPS), f1(pe.OKRPS), fx(c.Ratio.OKRPS)},
		{"dropped iterations", itoa(cf.DroppedIterations), itoa(pe.DroppedIterations), ""},
		{"status", statusLine(cf.Status), statusLine(pe.Status), ""},
		{"failed (5xx/timeout/conn)", fmt.Sprintf("%.2f%% (%d/%d/%d)", 100*cf.FailureRate, cf.Failures.Server, cf.Failures.Timeout, cf.Failures.Conn),
			fmt.Sprintf("%.2f%% (%d/%d/%d)", 100*pe.FailureRate, pe.Failures.Server, pe.Failures.Timeout, pe.Failures.Conn), ""},
		{"latency p50", fmtMS(cf.Latency.P50), fmtMS(pe.Latency.P50), fx(c.Ratio.P50)},
		{"latency p95", fmtMS(cf.Latency.P95), fmtMS(pe.Latency.P95), fx(c.Ratio.P95)},
		{"latency p99 / max", fmtMS(cf.Latency.P99) + " / " + fmtMS(cf.Latency.Max), fmtMS(pe.Latency.P99) + " / " + fmtMS(pe.Latency.Max), ""},
		{"requested → recorded p50 / p95", stagePair(cf.Stages.RequestedToRecorded), stagePair(pe.Stages.RequestedToRecorded), ""},
		{"recorded → published p50 / p95", stagePair(cf.Stages.RecordedToPublished), stagePair(pe.Stages.RecordedToPublished), ""},
		{"requested → confirmed p50 / p95", stagePair(cf.Stages.RequestedToConfirmed), stagePair(pe.Stages.RequestedToConfirmed), ""},
		{"**throughput**: confirmed/s (first request → last confirmation)", f1(cf.ConfirmedPerS), f1(pe.ConfirmedPerS), fx(c.Ratio.Throughput)},
		{"confirmed/s held for 10 s (peak)", f1(cf.ConfirmedPerSPeak), f1(pe.ConfirmedPerSPeak), fx(ratio(cf.ConfirmedPerSPeak, pe.ConfirmedPerSPeak))},
		{"lost / duplicate / missing / oversold", auditLine(cf.Audit), auditLine(pe.Audit), ""},
		{"peak RSS", rssText(cf.RSSMB), rssText(pe.RSSMB), ""},
	}
	fmt.Fprintln(w, "| | claimflow | peer (outbox) | claimflow ÷ peer |")
	fmt.Fprintln(w, "|---|---|---|---|")
	for _, r := range rows {
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", r[0], r[1], r[2], r[3])
	}
}

// WriteFloorTable prints the floor as a Markdown table.
func WriteFloorTable(w io.Writer, f FloorResult) {
	answer := "start→done"
	switch f.Mode {
	case floorModeUpdateStart:
		answer = "update answered"
	case floorModeUpdateStarted:
		answer = "update to the waiting run answered"
	case floorModeLongLived:
		// Each row counts updates: the runs stay.
		fmt.Fprintf(w, "| updates to %d long-lived run(s), continued as new every %d | concurrency | completed | errors | wall | updates/s | update answered p50 / p95 / p99 |\n", f.Runs, f.UpdatesPerRun)
		fmt.Fprintln(w, "|---|---|---|---|---|---|---|")
		writeFloorRow(w, f)
		return
	}
	fmt.Fprintln(w, "| empty workflows | concurrency | completed | errors | wall | wf/s | "+answer+" p50 / p95 / p99 |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|")
	writeFloorRow(w, f)
}

func writeFloorRow(w io.Writer, f FloorResult) {
	fmt.Fprintf(w, "| %d | %d | %d | %d | %.1fs | %.1f | %s / %s / %s |\n", f.Workflows, f.Concurrency, f.Completed, f.Errors,
		f.DurationS, f.WFPerS, fmtMS(f.Latency.P50), fmtMS(f.Latency.P95), fmtMS(f.Latency.P99))
	if f.FirstError != "" {
		fmt.Fprintf(w, "\nfirst error: %s\n", f.FirstError)
	}
}

func itoa(n int) string   { return strconv.Itoa(n) }
func f1(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }
func fx(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) + "×" }
func stagePair(s StageLatency) string {
	if s.Count == 0 {
		return "—"
	}
	return fmtMS(s.P50) + " / " + fmtMS(s.P95)
}

func auditLine(a Audit) string {
	s := fmt.Sprintf("%d / %d / %d / %d", a.Lost, a.DuplicateEvents, a.MissingEvents, a.OversoldCourses)
	if !a.Drained {
		s += " (not drained)"
	}
	return s
}

func rssText(v *float64) string {
	if v == nil {
		return "n/a"
	}
	return fmt.Sprintf("%.0f MiB", *v)
}
