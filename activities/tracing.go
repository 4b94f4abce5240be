package activities

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/claimflow/claimflow/internal/tracing"
)

// produceSpan is the span of one Kafka produce call of n records; the
// records carry its context in their traceparent header, so the
// consumer's spans continue this trace.
func produceSpan(ctx context.Context, topic string, n int) (context.Context, trace.Span) {
	return tracing.Start(ctx, "kafka.produce "+topic, func() []trace.SpanStartOption {
		return []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(attribute.String("messaging.system", "kafka"), attribute.String("messaging.destination.name", topic),
				attribute.Int("messaging.batch.message_count", n))}
	})
}

func endSpan(span trace.Span, err error) {
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
