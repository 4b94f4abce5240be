package workflows

import (
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"
)

// PublishRetryPolicy is the user's consumer backoff, 1 s → 2 s → 4 s: four
// attempts, then the message is dead-lettered.
var PublishRetryPolicy = &temporal.RetryPolicy{
	InitialInterval:    time.Second,
	BackoffCoefficient: 2,
	MaximumInterval:    4 * time.Second,
	MaximumAttempts:    4,
}

// Database steps retry until Postgres is back: an outage must delay a claim,
// never drop it. Refusals are non-retryable errors and end at once.
var databaseRetryPolicy = &temporal.RetryPolicy{
	InitialInterval:    100 * time.Millisecond,
	BackoffCoefficient: 2,
	MaximumInterval:    10 * time.Second,
}

// The activity options are values, so that DecisionDeadline derives its
// answer from the very options the workflows run with.

func databaseActivityOptions() workflow.ActivityOptions {
	return workflow.ActivityOptions{StartToCloseTimeout: 10 * time.Second, RetryPolicy: databaseRetryPolicy}
}

func databaseOptions(ctx workflow.Context) workflow.Context {
	return workflow.WithActivityOptions(ctx, databaseActivityOptions())
}

func publishActivityOptions() workflow.ActivityOptions {
	return workflow.ActivityOptions{StartToCloseTimeout: 15 * time.Second, RetryPolicy: PublishRetryPolicy}
}

func publishOptions(ctx workflow.Context) workflow.Context {
	return workflow.WithActivityOptions(ctx, publishActivityOptions())
}

// compensationActivityOptions has no ScheduleToClose bound: a compensation
// must finish eventually, however long an outage lasts.
func compensationActivityOptions() workflow.ActivityOptions {
	return workflow.ActivityOptions{StartToCloseTimeout: 15 * time.Second, RetryPolicy: databaseRetryPolicy}
}

func compensationOptions(ctx workflow.Context) workflow.Context {
	return workflow.WithActivityOptions(ctx, compensationActivityOptions())
}
