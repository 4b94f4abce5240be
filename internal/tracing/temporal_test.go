package tracing

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.temporal.io/sdk/interceptor"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
)

func step(context.Context) error { return nil }

// A run that continues as new has not failed; one that fails has. Both
// runs' activities are children of the run's span.
func TestTemporalInterceptorContinueAsNew(t *testing.T) {
	for _, tc := range []struct {
		name   string
		end    func(workflow.Context) error
		status codes.Code
	}{
		{"continues as new", func(ctx workflow.Context) error {
			return workflow.NewContinueAsNewError(ctx, "next")
		}, codes.Unset},
		{"fails", func(workflow.Context) error {
			return temporal.NewNonRetryableApplicationError("refused", "Refused", nil)
		}, codes.Error},
		{"completes", func(workflow.Context) error { return nil }, codes.Unset},
	} {
		t.Run(tc.name, func(t *testing.T) {
			exp := tracetest.NewInMemoryExporter()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
			t.Cleanup(Use(tp))
			ti, err := TemporalInterceptor()
			if err != nil {
				t.Fatal(err)
			}
			var s testsuite.WorkflowTestSuite
			env := s.NewTestWorkflowEnvironment()
			env.SetWorkerOptions(worker.Options{Interceptors: []interceptor.WorkerInterceptor{ti}})
			env.RegisterActivity(step)
			env.RegisterWorkflowWithOptions(func(ctx workflow.Context) error {
				ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute})
				if err := workflow.ExecuteActivity(ctx, step).Get(ctx, nil); err != nil {
					return err
				}
				return tc.end(ctx)
			}, workflow.RegisterOptions{Name: "next"})
			env.ExecuteWorkflow("next")
			var run, act tracetest.SpanStub
			for _, sp := range exp.GetSpans() {
				switch {
				case strings.HasPrefix(sp.Name, "RunWorkflow:"):
					run = sp
				case strings.HasPrefix(sp.Name, "StartActivity:"):
					act = sp
				}
			}
			if run.Name == "" || act.Name == "" {
				t.Fatalf("spans: want RunWorkflow and StartActivity, have %v", exp.GetSpans())
			}
			if run.Status.Code != tc.status {
				t.Errorf("the run's span has status %v (%q), want %v", run.Status.Code, run.Status.Description, tc.status)
			}
			if act.Parent.SpanID() != run.SpanContext.SpanID() {
				t.Errorf("the activity's span is not a child of the run's")
			}
		})
	}
}
