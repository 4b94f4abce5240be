// Package worker hosts claimflow's workflows and activities on a Temporal
// task queue. Scale out by running more worker processes against the same
// Temporal cluster; the task queue balances them.
package worker

import (
	"context"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/interceptor"
	sdkworker "go.temporal.io/sdk/worker"

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
// sagas' activities from sagas, the event consumer's durable path from
// delivery (*consumer.Activities, the event consumer's own struct). Start it with Start, or
// Run to block until interrupted.
func New(c client.Client, sagas SagaActivities, delivery DeliveryActivities, o Options) sdkworker.Worker {
	w := sdkworker.New(c, workflows.TaskQueue, SDKOptions(o))
	RegisterWorkflows(w)
	RegisterActivities(w, sagas, delivery)
	return w
}

// SDKOptions are the SDK's worker settings of a claimflow worker. The
// bench's floor starts its own worker with them, so the floor it measures
// is claimflow's: the same pollers, slots and stop timeout.
func SDKOptions(o Options) sdkworker.Options {
	return sdkworker.Options{
		MaxConcurrentActivityExecutionSize: o.MaxConcurrentActivities,
		// A desk's batch is one workflow task. With the SDK's default of two
		// pollers, under load most workflow tasks found no poller waiting
		// and queued in matching's backlog instead; more pollers keep one
		// waiting (docs/performance.md).
		MaxConcurrentWorkflowTaskPollers: 16,
		// Let in-flight activities finish on SIGTERM before the process goes.
		WorkerStopTimeout: 20 * time.Second,
		Interceptors:      o.Interceptors,
	}
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
	r.RegisterWorkflow(workflows.Promotion)
	r.RegisterWorkflow(workflows.EnrollmentBatch)
	r.RegisterWorkflow(workflows.EnrollmentDesk)
	r.RegisterWorkflow(workflows.RecoverReservations)
	r.RegisterWorkflow(workflows.IssueCoupon)
	r.RegisterWorkflow(workflows.UseCoupon)
	r.RegisterWorkflow(workflows.DeliverEvent)
}

// Registrar is what a worker and a test environment register activities
// with.
type Registrar interface {
	RegisterActivityWithOptions(a any, options activity.RegisterOptions)
}

// EnrollmentActivities are the effects of Enrollment, Cancellation,
// Promotion and the publish-or-dead-letter loop every saga shares.
type EnrollmentActivities interface {
	Publish(context.Context, workflows.PublishInput) error
	MarkConfirmed(ctx context.Context, enrollmentID string) error
	ReleaseSeat(context.Context, workflows.ReleaseSeatInput) error
	RecordDeadLetter(context.Context, workflows.DeadLetterInput) (workflows.DeadLetterRecord, error)
	ResolveDeadLetter(context.Context, workflows.ResolveDeadLetterInput) error
	CancelEnrollment(context.Context, workflows.CancelEnrollmentInput) (workflows.CancelEnrollmentResult, error)
	PromoteWaitlist(context.Context, workflows.PromoteWaitlistInput) (workflows.PromoteWaitlistResult, error)
}

// BatchActivities are the effects of EnrollmentDesk, EnrollmentBatch and
// RecoverReservations.
type BatchActivities interface {
	ReserveSeats(context.Context, workflows.ReserveSeatsInput) (workflows.ReserveSeatsResult, error)
	PublishBatch(context.Context, workflows.PublishBatchInput) error
	ConfirmBatch(ctx context.Context, enrollmentIDs []string) error
	ReleaseSeats(ctx context.Context, enrollmentIDs []string) error
	FindStrandedReservations(context.Context, workflows.RecoverReservationsInput) (workflows.FindStrandedResult, error)
}

// CouponActivities are the effects of IssueCoupon and UseCoupon.
type CouponActivities interface {
	ReserveCoupon(context.Context, workflows.ReserveCouponInput) (workflows.ReserveCouponResult, error)
	RevokeCoupon(context.Context, workflows.RevokeCouponInput) (workflows.RevokeCouponResult, error)
	MarkCouponUsed(context.Context, workflows.MarkCouponUsedInput) (workflows.MarkCouponUsedResult, error)
	UnmarkCouponUsed(context.Context, workflows.UnmarkCouponUsedInput) error
	PayVendor(context.Context, workflows.PayVendorInput) (workflows.PayVendorResult, error)
	RecordPayout(context.Context, workflows.RecordPayoutInput) (workflows.RecordPayoutResult, error)
}

// SagaActivities are the effects of every saga; package activities
// implements them on one struct.
type SagaActivities interface {
	EnrollmentActivities
	BatchActivities
	CouponActivities
}

// DeliveryActivities are the event consumer's durable path (DeliverEvent,
// which also calls the sagas' ResolveDeadLetter). They are a group of their
// own so that the consumer can keep them on a struct of its own.
type DeliveryActivities interface {
	DeliverNotification(context.Context, workflows.DeliverNotificationInput) (workflows.DeliverNotificationResult, error)
	RecordConsumeDeadLetter(context.Context, workflows.ConsumeDeadLetterInput) (workflows.DeadLetterRecord, error)
}

// RegisterActivities registers every activity a workflow calls under the
// name of its reference in package workflows. Each line pairs a reference
// with the method that implements it; the compiler checks that they agree.
func RegisterActivities(r Registrar, sagas SagaActivities, delivery DeliveryActivities) {
	registerNoResult(r, workflows.Publish, sagas.Publish)
	registerNoResult(r, workflows.MarkConfirmed, sagas.MarkConfirmed)
	registerNoResult(r, workflows.ReleaseSeat, sagas.ReleaseSeat)
	register(r, workflows.RecordDeadLetter, sagas.RecordDeadLetter)
	registerNoResult(r, workflows.ResolveDeadLetter, sagas.ResolveDeadLetter)
	register(r, workflows.CancelEnrollment, sagas.CancelEnrollment)
	register(r, workflows.PromoteWaitlist, sagas.PromoteWaitlist)

	// The desk calls ReserveSeats and PublishBatch, the batch run
	// ConfirmBatch, as local activities, by these same registered names.
	register(r, workflows.ReserveSeats, sagas.ReserveSeats)
	registerNoResult(r, workflows.PublishBatch, sagas.PublishBatch)
	registerNoResult(r, workflows.ConfirmBatch, sagas.ConfirmBatch)
	registerNoResult(r, workflows.ReleaseSeats, sagas.ReleaseSeats)
	register(r, workflows.FindStrandedReservations, sagas.FindStrandedReservations)

	register(r, workflows.ReserveCoupon, sagas.ReserveCoupon)
	register(r, workflows.RevokeCoupon, sagas.RevokeCoupon)
	register(r, workflows.MarkCouponUsed, sagas.MarkCouponUsed)
	registerNoResult(r, workflows.UnmarkCouponUsed, sagas.UnmarkCouponUsed)
	register(r, workflows.PayVendor, sagas.PayVendor)
	register(r, workflows.RecordPayout, sagas.RecordPayout)

	register(r, workflows.DeliverNotification, delivery.DeliverNotification)
	register(r, workflows.RecordConsumeDeadLetter, delivery.RecordConsumeDeadLetter)
}

// register registers fn under ref's name. fn's type must be the reference's
// (In, Out), so a method cannot drift from the reference a workflow calls,
// and the name a history records comes from the reference alone.
func register[In, Out any](r Registrar, ref workflows.Activity[In, Out], fn func(context.Context, In) (Out, error)) {
	r.RegisterActivityWithOptions(fn, activity.RegisterOptions{Name: ref.Name})
}

// registerNoResult is register for an activity that returns only an error.
func registerNoResult[In any](r Registrar, ref workflows.ActivityNoResult[In], fn func(context.Context, In) error) {
	r.RegisterActivityWithOptions(fn, activity.RegisterOptions{Name: ref.Name})
}
