package services

import (
	"context"
	"strings"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/errordetails/v1"
	"go.temporal.io/api/workflowservice/v1"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prometheus/client_golang/prometheus"
)

// closingRetryWithin bounds how long retryClosingRun retries one call
// before it hands the error to the SDK's own retries. A run continues as
// new within a workflow task's completion; its next run is there well
// within this.
const closingRetryWithin = 100 * time.Millisecond

// updateMethods are the calls that send an update: on its own, and with
// Update-With-Start (the API's batches to a desk).
var updateMethods = map[string]bool{
	workflowservice.WorkflowService_UpdateWorkflowExecution_FullMethodName: true,
	workflowservice.WorkflowService_ExecuteMultiOperation_FullMethodName:   true,
}

// retryClosingRun is a gRPC client interceptor, innermost in the SDK's
// chain, so it sees each attempt of a call. When an update reaches a run
// that continues as new before it accepted the update (a desk closing to
// tell what it decided), the server aborts the update with
// ResourceExhausted, cause BUSY_WORKFLOW, "workflow is closing", or, when
// the workflow task that carried it failed, with WorkflowNotReady
// (workflowClosing), and does not retry it itself. The SDK retries the
// first only after its backoff of 400 ms or more, and the second not at
// all, so the batch's claims would wait that long or get a 503. The next
// run is there as soon as the old one has closed, so this sends the same
// request again (the same update ID and request ID: the server dedupes it
// as it would the SDK's retry) after 2, 4, 8, … ms, for up to
// closingRetryWithin, and only then returns the error to the SDK. retries
// counts each retried call by method and outcome ("answered": a retry got
// through; "to_sdk": handed back); nil counts nothing.
func retryClosingRun(retries *prometheus.CounterVec) grpc.UnaryClientInterceptor {
	count := func(method, outcome string) {
		if retries != nil {
			retries.WithLabelValues(method[strings.LastIndex(method, "/")+1:], outcome).Inc()
		}
	}
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if err == nil || !updateMethods[method] || !workflowClosing(err) {
			return err
		}
		giveUp := time.Now().Add(closingRetryWithin)
		for wait := 2 * time.Millisecond; time.Now().Add(wait).Before(giveUp); wait *= 2 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				count(method, "to_sdk")
				return err
			case <-t.C:
			}
			if err = invoker(ctx, method, req, reply, cc, opts...); err == nil || !workflowClosing(err) {
				count(method, "answered")
				return err
			}
		}
		count(method, "to_sdk")
		return err
	}
}

// NewClosingRetries is the counter retryClosingRun keeps, registered on reg.
func NewClosingRetries(reg prometheus.Registerer) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "claimflow_temporal_closing_retries_total",
		Help: "Updates the Temporal server refused because their run was continuing as new, retried at once by claimflow's client: by call and outcome (answered: a retry got through; to_sdk: handed back to the SDK's slower retries).",
	}, []string{"operation", "outcome"})
	reg.MustRegister(c)
	return c
}

// workflowClosing tells whether err is the server's refusal of an update
// that its run did not take because it was closing, alone or as the
// update's part of a multi-operation (Update-With-Start) error: "workflow is
// closing", or WorkflowNotReady, which the server answers when the
// workflow task that carried the update failed (a run that continues as
// new while the update arrives fails its task as UnhandledCommand). Either
// way the run never accepted the update, and its next task or run takes
// it when it is sent again.
func workflowClosing(err error) bool {
	st, ok := status.FromError(err)
	if !ok {
		return false
	}
	if refusedUpdate(st) {
		return true
	}
	for _, d := range st.Details() {
		multi, ok := d.(*errordetails.MultiOperationExecutionFailure)
		if !ok {
			continue
		}
		for _, op := range multi.GetStatuses() {
			if refusedUpdate(status.FromProto(&spb.Status{Code: op.GetCode(), Message: op.GetMessage(), Details: op.GetDetails()})) {
				return true
			}
		}
	}
	return false
}

// refusedUpdate: a busy workflow because it closes, or one not ready.
func refusedUpdate(st *status.Status) bool {
	switch st.Code() {
	case codes.ResourceExhausted:
		return closingStatus(st)
	case codes.FailedPrecondition:
		for _, d := range st.Details() {
			if _, ok := d.(*errordetails.WorkflowNotReadyFailure); ok {
				return true
			}
		}
	}
	return false
}

// closingStatus: ResourceExhausted for a busy workflow because it closes.
func closingStatus(st *status.Status) bool {
	if !strings.Contains(st.Message(), "closing") {
		return false
	}
	for _, d := range st.Details() {
		if re, ok := d.(*errordetails.ResourceExhaustedFailure); ok {
			return re.GetCause() == enumspb.RESOURCE_EXHAUSTED_CAUSE_BUSY_WORKFLOW
		}
	}
	return false
}
