package worker

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/testsuite"

	"github.com/claimflow/claimflow/activities"
	claimconsumer "github.com/claimflow/claimflow/consumer"
	"github.com/claimflow/claimflow/workflows"
)

// recorder is a Registrar that keeps what was registered.
type recorder struct {
	fns map[string]any
}

func (r *recorder) RegisterActivityWithOptions(a any, o activity.RegisterOptions) {
	if r.fns == nil {
		r.fns = map[string]any{}
	}
	if _, dup := r.fns[o.Name]; dup {
		panic("activity registered twice: " + o.Name)
	}
	r.fns[o.Name] = a
}

// consumer stands for a struct other than activities.Activities that
// implements the delivery activities, as the event consumer may own them.
type consumer struct{ calls []string }

func (c *consumer) DeliverNotification(context.Context, workflows.DeliverNotificationInput) (workflows.DeliverNotificationResult, error) {
	c.calls = append(c.calls, "DeliverNotification")
	return workflows.DeliverNotificationResult{}, nil
}

func (c *consumer) RecordConsumeDeadLetter(context.Context, workflows.ConsumeDeadLetterInput) (workflows.DeadLetterRecord, error) {
	c.calls = append(c.calls, "RecordConsumeDeadLetter")
	return workflows.DeadLetterRecord{ID: 7}, nil
}

// recordedNames are the activity names the recorded histories (and runs in
// flight) carry. A change here breaks their replay, so it must be deliberate.
var recordedNames = []string{
	"CancelEnrollment", "ConfirmBatch", "DeliverNotification", "FindStrandedReservations", "MarkConfirmed", "MarkCouponUsed",
	"PayVendor", "PromoteWaitlist", "Publish", "PublishBatch", "RecordConsumeDeadLetter", "RecordDeadLetter", "RecordPayout",
	"ReleaseSeat", "ReleaseSeats", "ReserveCoupon", "ReserveSeats", "ResolveDeadLetter",
	"RevokeCoupon", "UnmarkCouponUsed",
}

func TestRegisterActivities(t *testing.T) {
	sagas := &activities.Activities{}
	tests := []struct {
		name     string
		delivery DeliveryActivities
	}{
		{name: "the consumer package's activities", delivery: &claimconsumer.Activities{}},
		{name: "any struct with the delivery methods", delivery: &consumer{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var r recorder
			RegisterActivities(&r, sagas, tc.delivery)

			var got []string
			for name, fn := range r.fns {
				got = append(got, name)
				if fn == nil || reflect.ValueOf(fn).Kind() != reflect.Func {
					t.Errorf("%s: registered %T, want a function", name, fn)
				}
			}
			slices.Sort(got)
			if !slices.Equal(got, recordedNames) {
				t.Errorf("registered names\n got %v\nwant %v", got, recordedNames)
			}
			if !slices.Equal(got, declaredReferences(t)) {
				t.Errorf("registered %v, but package workflows declares references %v", got, declaredReferences(t))
			}

			// The delivery group is registered from the struct given for it.
			deliver, ok := r.fns[workflows.DeliverNotification.Name].(func(context.Context, workflows.DeliverNotificationInput) (workflows.DeliverNotificationResult, error))
			if !ok {
				t.Fatalf("DeliverNotification registered as %T", r.fns[workflows.DeliverNotification.Name])
			}
			if c, isConsumer := tc.delivery.(*consumer); isConsumer {
				if _, err := deliver(context.Background(), workflows.DeliverNotificationInput{}); err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(c.calls, []string{"DeliverNotification"}) {
					t.Errorf("the consumer's method was not the one registered: calls %v", c.calls)
				}
			}
		})
	}
}

// declaredReferences lists the Name of every Activity and ActivityNoResult
// reference declared in package workflows, read from its source, so that a
// reference added without a registration fails the test above instead of a
// run in production.
func declaredReferences(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir("../workflows")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var names []string
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, filepath.Join("../workflows", e.Name()), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			lit, ok := n.(*ast.CompositeLit)
			if !ok {
				return true
			}
			var typ ast.Expr = lit.Type
			switch x := typ.(type) {
			case *ast.IndexExpr:
				typ = x.X
			case *ast.IndexListExpr:
				typ = x.X
			}
			id, ok := typ.(*ast.Ident)
			if !ok || (id.Name != "Activity" && id.Name != "ActivityNoResult") {
				return true
			}
			for _, el := range lit.Elts {
				kv, ok := el.(*ast.KeyValueExpr)
				if !ok {
					continue
				}
				if key, ok := kv.Key.(*ast.Ident); ok && key.Name == "Name" {
					if v, ok := kv.Value.(*ast.BasicLit); ok {
						s, err := strconv.Unquote(v.Value)
						if err != nil {
							t.Fatal(err)
						}
						names = append(names, s)
					}
				}
			}
			return true
		})
	}
	slices.Sort(names)
	return names
}

// The SDK runs what RegisterActivities registered: DeliverEvent reaches the
// consumer's method through the reference's name.
func TestRegisteredActivitiesRunInAWorkflow(t *testing.T) {
	var s testsuite.WorkflowTestSuite
	s.SetLogger(log.NewStructuredLogger(slog.New(slog.DiscardHandler)))
	env := s.NewTestWorkflowEnvironment()
	RegisterWorkflows(env)
	c := &consumer{}
	RegisterActivities(env, &activities.Activities{}, c)

	env.ExecuteWorkflow(workflows.DeliverEvent, workflows.DeliverEventInput{
		Event: workflows.ConsumedEvent{Topic: workflows.EnrollmentTopic, EventID: "enr-1/enrollment.confirmed"}})

	if !env.IsWorkflowCompleted() {
		t.Fatal("DeliverEvent did not complete")
	}
	if err := env.GetWorkflowError(); err != nil {
		t.Fatal(err)
	}
	var state workflows.DeliveryState
	if err := env.GetWorkflowResult(&state); err != nil {
		t.Fatal(err)
	}
	if state.Status != workflows.DeliveryDelivered || !slices.Equal(c.calls, []string{"DeliverNotification"}) {
		t.Errorf("state %+v, consumer calls %v; want delivered through the consumer's method", state, c.calls)
	}
}
