// Package worker hosts claimflow's workflows and activities on a Temporal
// task queue. Scale out by running more worker processes against the same
// Temporal cluster; the task queue balances them.
package worker

import (
	"fmt"
	"reflect"
	"slices"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/interceptor"
	sdkworker "go.temporal.io/sdk/worker"

	"github.com/claimflow/claimflow/activities"
	"github.com/claimflow/claimflow/consumer"
	"github.com/claimflow/claimflow/workflows"
)

// Options tunes one worker process.
type Options struct {
	// MaxConcurrentActivities bounds the activities in flight, and with it
	// the Postgres connections and Kafka sends this process holds.
	MaxConcurrentActivities int
	// Interceptors, e.g. NewAttemptMetrics.
	Interceptors []interceptor.WorkerInterceptor
}

// New builds a worker with every workflow and activity registered: the
// sagas' activities and the consumer's delivery activities (DeliverEvent's).
// Start it with Start, or Run to block until interrupted.
func New(c client.Client, acts *activities.Activities, delivery *consumer.Activities, o Options) sdkworker.Worker {
	w := sdkworker.New(c, workflows.TaskQueue, sdkworker.Options{
		MaxConcurrentActivityExecutionSize: o.MaxConcurrentActivities,
		// A batch run is one workflow task. With the SDK's default of two
		// pollers, at 500 req/s 2,924 of 2,996 tasks found no poller waiting,
		// went through matching's backlog and waited ~67 ms there.
		MaxConcurrentWorkflowTaskPollers: 16,
		// Let in-flight activities finish on SIGTERM before the process goes.
		WorkerStopTimeout: 20 * time.Second,
		Interceptors:      o.Interceptors,
	})
	Register(w, acts, delivery)
	return w
}

// Registry is what both a worker and a replayer can register into.
type Registry interface {
	RegisterWorkflow(w any)
}

// RegisterWorkflows registers every claimflow workflow; the replayer uses it
// too, so replays check exactly the code the worker runs.
func RegisterWorkflows(r Registry) {
	r.RegisterWorkflow(workflows.Enrollment)
	r.RegisterWorkflow(workflows.Cancellation)
	r.RegisterWorkflow(workflows.EnrollmentBatch)
	r.RegisterWorkflow(workflows.IssueCoupon)
	r.RegisterWorkflow(workflows.UseCoupon)
	r.RegisterWorkflow(workflows.DeliverEvent)
}

// Register registers workflows and activities on w.
func Register(w sdkworker.Worker, acts *activities.Activities, delivery *consumer.Activities) {
	RegisterWorkflows(w)
	w.RegisterActivity(acts)
	w.RegisterActivity(delivery)
}

// CheckActivities fails when an activity a workflow names has no method on
// Activities (or, for DeliverEvent's, on consumer.Activities), which would
// otherwise surface only at run time.
func CheckActivities() error {
	names := append(slices.Clone(workflows.ActivityNames), workflows.CouponActivityNames...)
	names = append(names, workflows.BatchActivityNames...)
	for _, name := range names {
		if _, ok := reflect.TypeFor[*activities.Activities]().MethodByName(name); !ok {
			return fmt.Errorf("workflows call activity %q but activities.Activities has no such method", name)
		}
	}
	for _, name := range workflows.DeliveryActivityNames {
		if _, ok := reflect.TypeFor[*consumer.Activities]().MethodByName(name); !ok {
			return fmt.Errorf("DeliverEvent calls activity %q but consumer.Activities has no such method", name)
		}
	}
	return nil
}
