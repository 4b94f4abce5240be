package main

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/claimflow/claimflow/internal/tracing"
	"github.com/claimflow/claimflow/workflows"
)

// TestOneClaimsTrace follows one enrollment through the whole stack with
// tracing on: the HTTP request, its wait in the batcher, the batch (linked
// to the wait) and its update to the desk, the desk's workflow, ReserveSeats
// with its SQL, the Kafka produce, the record consumed (continuing the
// produce's trace through the traceparent header), and the consumer's
// batch (linked to the record) with the notification's insert and the
// webhook call. It prints the claim's span trees. Then a coupon's use, with
// its payout call, and a dead-lettered claim's retry.
func TestOneClaimsTrace(t *testing.T) {
	if testing.Short() {
		t.Skip("integration tests start the real stack; skipped with -short")
	}
	// Tracing on, spans to memory, for this test's stack alone.
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	restore := tracing.Use(tp)
	t.Cleanup(restore)

	s := testStack(t, dataDir(t))
	c := newAPIClient(t, s)
	c.must("POST", "/v1/courses", map[string]any{"id": "trace101", "title": "Traced", "capacity": 3}, http.StatusCreated)
	// A first claim starts the desk run; the traced one is a later batch of
	// that run, as almost every claim is.
	c.must("POST", "/v1/courses/trace101/enrollments?wait=confirmed", map[string]any{"student_id": "first"}, http.StatusCreated)
	e, header := c.mustHeader("POST", "/v1/courses/trace101/enrollments?wait=confirmed", map[string]any{"student_id": "tess"}, http.StatusCreated)
	enrollmentID := e["id"].(string)
	answered := header.Get("traceparent")
	eventID := workflows.EventID(enrollmentID, workflows.EventEnrollmentConfirmed)

	byID := map[trace.SpanID]tracetest.SpanStub{}
	var claim tracetest.SpanStub
	find := func(cond func(tracetest.SpanStub) bool) (tracetest.SpanStub, bool) {
		for _, sp := range byID {
			if cond(sp) {
				return sp, true
			}
		}
		return tracetest.SpanStub{}, false
	}
	attr := func(sp tracetest.SpanStub, key string) string {
		for _, a := range sp.Attributes {
			if string(a.Key) == key {
				return a.Value.String()
			}
		}
		return ""
	}
	linksTo := func(sp tracetest.SpanStub, target trace.SpanContext) bool {
		return slices.ContainsFunc(sp.Links, func(l sdktrace.Link) bool { return l.SpanContext.SpanID() == target.SpanID() })
	}
	var batch, consume, consumerBatch tracetest.SpanStub
	waitFor(t, 30*time.Second, "the claim's spans, through the consumer's batch", func() bool {
		_ = tp.ForceFlush(context.Background())
		for _, sp := range exp.GetSpans() {
			byID[sp.SpanContext.SpanID()] = sp
		}
		var ok bool
		if claim, ok = find(func(sp tracetest.SpanStub) bool {
			return sp.Name == "claim.wait" && attr(sp, "claimflow.enrollment_id") == enrollmentID
		}); !ok {
			return false
		}
		if batch, ok = find(func(sp tracetest.SpanStub) bool { return sp.Name == "claim.batch" && linksTo(sp, claim.SpanContext) }); !ok {
			return false
		}
		if consume, ok = find(func(sp tracetest.SpanStub) bool {
			return strings.HasPrefix(sp.Name, "kafka.consume") && attr(sp, "claimflow.event_id") == eventID
		}); !ok {
			return false
		}
		consumerBatch, ok = find(func(sp tracetest.SpanStub) bool {
			return sp.Name == "consumer.batch" && linksTo(sp, consume.SpanContext)
		})
		return ok
	})

	// The request's trace: the HTTP span, and the claim's wait under it.
	req, ok := byID[claim.Parent.SpanID()]
	if !ok || !strings.Contains(req.Name, "/v1/courses/:id/enrollments") {
		t.Errorf("the claim's wait has parent %q, want the HTTP request's span", req.Name)
	}
	// The answer names the request's trace, where an operator starts.
	if want := tracing.TraceParent(trace.ContextWithSpanContext(context.Background(), req.SpanContext)); answered != want {
		t.Errorf("the answer's traceparent header is %q, want the request span's %q", answered, want)
	}
	if got := attr(claim, "claimflow.batch_id"); got == "" || got != attr(batch, "claimflow.batch_id") {
		t.Errorf("the claim's wait names batch %q, the batch span %q", got, attr(batch, "claimflow.batch_id"))
	}
	if got := attr(claim, "claimflow.outcome"); got != string(workflows.StatusConfirmed) && got != string(workflows.StatusReserved) {
		t.Errorf("the claim's wait has outcome %q", got)
	}
	// The batch's trace runs through Temporal into the consumer.
	tree := func(root tracetest.SpanStub) []tracetest.SpanStub {
		var out []tracetest.SpanStub
		for _, sp := range byID {
			if sp.SpanContext.TraceID() == root.SpanContext.TraceID() {
				out = append(out, sp)
			}
		}
		return out
	}
	names := func(spans []tracetest.SpanStub) []string {
		var out []string
		for _, sp := range spans {
			out = append(out, sp.Name)
		}
		return out
	}
	// The desk is a long-running workflow: a batch is its update, sent
	// alone to a running desk and with Update-With-Start to one not yet
	// running. The desk decides the batches queued meanwhile together, in
	// its run's own trace, and ReserveSeats links to each claim's wait.
	batchTrace := names(tree(batch))
	for _, want := range [][]string{{"UpdateWorkflow:decide-batch", "UpdateWithStartWorkflow:decide-batch"}, {"HandleUpdate:decide-batch"}} {
		if !slices.ContainsFunc(batchTrace, func(n string) bool {
			return slices.ContainsFunc(want, func(w string) bool { return strings.HasPrefix(n, w) })
		}) {
			t.Errorf("the batch's trace has no span of %q; it has %v", want, batchTrace)
		}
	}
	reserve, ok := find(func(sp tracetest.SpanStub) bool {
		return strings.HasPrefix(sp.Name, "RunActivity:ReserveSeats") && linksTo(sp, claim.SpanContext)
	})
	if !ok {
		t.Fatalf("no ReserveSeats span links to the claim's wait")
	}
	deskTrace := names(tree(reserve))
	for _, want := range []string{"RunActivity:ReserveSeats", "RunActivity:PublishBatch", "kafka.produce " + workflows.EnrollmentTopic,
		"kafka.consume " + workflows.EnrollmentTopic} {
		if !slices.ContainsFunc(deskTrace, func(n string) bool { return strings.HasPrefix(n, want) }) {
			t.Errorf("the desk run's trace has no %q span; it has %v", want, deskTrace)
		}
	}
	if parent := byID[consume.Parent.SpanID()]; !strings.HasPrefix(parent.Name, "kafka.produce") {
		t.Errorf("the record's span has parent %q, want the produce", parent.Name)
	}
	sql := 0
	for _, sp := range tree(reserve) {
		if p := byID[sp.Parent.SpanID()]; p.SpanContext.SpanID() == reserve.SpanContext.SpanID() && sp.SpanKind == trace.SpanKindClient {
			sql++
		}
	}
	if sql == 0 {
		t.Errorf("ReserveSeats has no SQL spans under it")
	}
	consumerTrace := tree(consumerBatch)
	if !slices.ContainsFunc(consumerTrace, func(sp tracetest.SpanStub) bool {
		return sp.SpanKind == trace.SpanKindClient && strings.HasPrefix(sp.Name, "HTTP POST") || strings.HasPrefix(sp.Name, "POST")
	}) {
		t.Errorf("the consumer's batch has no webhook call; it has %v", names(consumerTrace))
	}
	if !slices.ContainsFunc(consumerTrace, func(sp tracetest.SpanStub) bool { return strings.Contains(strings.ToLower(sp.Name), "insert") }) {
		t.Errorf("the consumer's batch has no notification insert; it has %v", names(consumerTrace))
	}
	// The desk run's trace from ReserveSeats' parent down (the run's own
	// span ends only when the run does).
	deskRoot := reserve
	if p, ok := byID[reserve.Parent.SpanID()]; ok {
		deskRoot = p
	}
	for _, root := range []tracetest.SpanStub{req, batch, deskRoot, consumerBatch} {
		t.Logf("trace %s:\n%s", root.SpanContext.TraceID(), printTree(byID, root))
	}

	collect := func() {
		_ = tp.ForceFlush(context.Background())
		for _, sp := range exp.GetSpans() {
			byID[sp.SpanContext.SpanID()] = sp
		}
	}
	inTrace := func(id trace.TraceID, cond func(tracetest.SpanStub) bool) (tracetest.SpanStub, bool) {
		return find(func(sp tracetest.SpanStub) bool { return sp.SpanContext.TraceID() == id && cond(sp) })
	}
	named := func(prefix string) func(tracetest.SpanStub) bool {
		return func(sp tracetest.SpanStub) bool { return strings.HasPrefix(sp.Name, prefix) }
	}

	// A coupon's use: the request's trace holds the UseCoupon run, its
	// activities and, under one of them, the vendor's payout call.
	c.must("POST", "/v1/vendors", map[string]any{"id": "trace-vendor", "name": "Traced Coffee"}, http.StatusCreated)
	c.must("POST", "/v1/coupon-types", map[string]any{"id": "trace-type", "vendor_id": "trace-vendor", "name": "traced",
		"stock": 2, "payout_cents": 250}, http.StatusCreated)
	k := c.must("POST", "/v1/coupon-types/trace-type/coupons", map[string]any{"user_id": "u-trace"}, http.StatusCreated)
	_, header = c.mustHeader("POST", "/v1/coupons/"+k["id"].(string)+"/use", map[string]any{"user_id": "u-trace"}, http.StatusOK)
	use := traceOf(t, header.Get("traceparent"))
	var payout tracetest.SpanStub
	waitFor(t, 30*time.Second, "the coupon use's payout call in its request's trace", func() bool {
		collect()
		if _, ok := inTrace(use, named("RunWorkflow:UseCoupon")); !ok {
			return false
		}
		var ok bool
		payout, ok = inTrace(use, func(sp tracetest.SpanStub) bool {
			return sp.SpanKind == trace.SpanKindClient && strings.Contains(sp.Name, "POST") &&
				strings.HasPrefix(byID[sp.Parent.SpanID()].Name, "RunActivity:")
		})
		return ok
	})
	useReq, _ := inTrace(use, named("POST /v1/coupons/:id/use"))
	t.Logf("coupon use, trace %s (the payout call %s):\n%s", use, payout.Name, printTree(byID, useReq))

	// A dead-lettered claim: the operator's retry is a signal in the retry
	// request's trace, and the publish the run tries again is a new span
	// of the trace that holds its failed attempts.
	c.must("POST", "/v1/courses", map[string]any{"id": "trace102", "title": "Dead-lettered", "capacity": 2}, http.StatusCreated)
	removeFault := failProduces(t, s, workflows.EnrollmentTopic)
	d := c.must("POST", "/v1/courses/trace102/enrollments", map[string]any{"student_id": "dana"}, http.StatusCreated)
	dl := waitDeadLetter(t, c, d["id"].(string))
	removeFault()
	wf := dl["workflow_id"].(string)
	ofRun := func(sp tracetest.SpanStub) bool { return attr(sp, "temporalWorkflowID") == wf }
	retriedAt := time.Now()
	_, header = c.mustHeader("POST", fmt.Sprintf("/v1/dead-letters/%v/retry", dl["id"]), nil, http.StatusAccepted)
	retry := traceOf(t, header.Get("traceparent"))
	var again tracetest.SpanStub
	waitFor(t, 60*time.Second, "the retried publish in the trace of the failed ones", func() bool {
		collect()
		if _, ok := inTrace(retry, func(sp tracetest.SpanStub) bool { return named("HandleSignal:")(sp) && ofRun(sp) }); !ok {
			return false
		}
		var ok bool
		again, ok = find(func(sp tracetest.SpanStub) bool {
			if !named("RunActivity:"+workflows.Publish.Name)(sp) || !ofRun(sp) || sp.StartTime.Before(retriedAt) || sp.Status.Code == codes.Error {
				return false
			}
			_, failedBefore := inTrace(sp.SpanContext.TraceID(), func(f tracetest.SpanStub) bool {
				return named("RunActivity:"+workflows.Publish.Name)(f) && ofRun(f) && f.StartTime.Before(retriedAt) && f.Status.Code == codes.Error
			})
			return failedBefore
		})
		return ok
	})
	t.Logf("dead letter %v of run %s retried: %s (trace %s) after failed attempts in the same trace; the retry request's trace %s holds the signal",
		dl["id"], wf, again.Name, again.SpanContext.TraceID(), retry)
}

// traceOf is the trace ID of a traceparent header.
func traceOf(t *testing.T, traceparent string) trace.TraceID {
	t.Helper()
	sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": traceparent}))
	if !sc.IsValid() {
		t.Fatalf("the answer carries no valid traceparent: %q", traceparent)
	}
	return sc.TraceID()
}

// printTree renders root and its descendants, one span a line, indented,
// with their duration and links.
func printTree(byID map[trace.SpanID]tracetest.SpanStub, root tracetest.SpanStub) string {
	children := map[trace.SpanID][]tracetest.SpanStub{}
	for _, sp := range byID {
		if sp.SpanContext.TraceID() == root.SpanContext.TraceID() && sp.Parent.IsValid() {
			children[sp.Parent.SpanID()] = append(children[sp.Parent.SpanID()], sp)
		}
	}
	var b strings.Builder
	// Spans whose parent was not exported (a workflow task's, say) are
	// roots of their own, after root.
	roots := []tracetest.SpanStub{root}
	for _, sp := range byID {
		if sp.SpanContext.TraceID() == root.SpanContext.TraceID() && sp.SpanContext.SpanID() != root.SpanContext.SpanID() {
			if _, ok := byID[sp.Parent.SpanID()]; !ok {
				roots = append(roots, sp)
			}
		}
	}
	sort.SliceStable(roots[1:], func(i, j int) bool { return roots[1+i].StartTime.Before(roots[1+j].StartTime) })
	var walk func(sp tracetest.SpanStub, depth int)
	walk = func(sp tracetest.SpanStub, depth int) {
		links := ""
		if n := len(sp.Links); n > 0 {
			links = fmt.Sprintf(" (links: %d)", n)
		}
		fmt.Fprintf(&b, "%s%s %s%s\n", strings.Repeat("  ", depth), sp.Name, sp.EndTime.Sub(sp.StartTime).Round(10*time.Microsecond), links)
		kids := children[sp.SpanContext.SpanID()]
		sort.Slice(kids, func(i, j int) bool { return kids[i].StartTime.Before(kids[j].StartTime) })
		for _, k := range kids {
			walk(k, depth+1)
		}
	}
	for i, r := range roots {
		if i > 0 {
			fmt.Fprintf(&b, "(parent %s not exported)\n", r.Parent.SpanID())
		}
		walk(r, 0)
	}
	return b.String()
}
