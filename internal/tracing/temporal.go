package tracing

import (
	"context"
	"fmt"

	temporalotel "go.temporal.io/sdk/contrib/opentelemetry"
	"go.temporal.io/sdk/interceptor"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/workflow"
)

// TemporalInterceptor carries the trace through Temporal's headers into the
// workflows and their activities: the SDK's OpenTelemetry interceptor, but
// a run that continues as new ends its span without an error (a desk does
// so at every close, and each of its traces would show it failed).
func TemporalInterceptor() (interceptor.Interceptor, error) {
	t, err := temporalotel.NewTracer(temporalotel.TracerOptions{})
	if err != nil {
		return nil, fmt.Errorf("the Temporal SDK's tracer: %w", err)
	}
	return interceptor.NewTracingInterceptor(continueAsNewTracer{t}), nil
}

type continueAsNewTracer struct{ interceptor.Tracer }

// continueAsNewSpan is the SDK tracer's span, whose Finish does not record
// a continue-as-new as the run's error.
type continueAsNewSpan struct{ interceptor.TracerSpan }

func (s continueAsNewSpan) Finish(o *interceptor.TracerFinishSpanOptions) {
	if o != nil && workflow.IsContinueAsNewError(o.Error) {
		o = &interceptor.TracerFinishSpanOptions{}
	}
	s.TracerSpan.Finish(o)
}

// unwrap hands the SDK tracer back its own span, which it type-asserts.
func unwrap(s interceptor.TracerSpan) interceptor.TracerSpan {
	if w, ok := s.(continueAsNewSpan); ok {
		return w.TracerSpan
	}
	return s
}

func (t continueAsNewTracer) StartSpan(o *interceptor.TracerStartSpanOptions) (interceptor.TracerSpan, error) {
	if p, ok := o.Parent.(interceptor.TracerSpan); ok {
		c := *o
		c.Parent = unwrap(p)
		o = &c
	}
	s, err := t.Tracer.StartSpan(o)
	if err != nil {
		return nil, err
	}
	return continueAsNewSpan{s}, nil
}

func (t continueAsNewTracer) MarshalSpan(s interceptor.TracerSpan) (map[string]string, error) {
	return t.Tracer.MarshalSpan(unwrap(s))
}

func (t continueAsNewTracer) ContextWithSpan(ctx context.Context, s interceptor.TracerSpan) context.Context {
	return t.Tracer.ContextWithSpan(ctx, unwrap(s))
}

func (t continueAsNewTracer) GetLogger(logger log.Logger, ref interceptor.TracerSpanRef) log.Logger {
	if s, ok := ref.(continueAsNewSpan); ok {
		ref = s.TracerSpan
	}
	return t.Tracer.GetLogger(logger, ref)
}
