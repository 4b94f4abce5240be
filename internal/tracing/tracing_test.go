package tracing

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/IBM/sarama"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

func TestConfigured(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want bool
	}{
		{nil, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, true},
		{map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_SDK_DISABLED": "true"}, false},
		{map[string]string{"OTEL_TRACES_EXPORTER": "console"}, true},
	} {
		for _, k := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_TRACES_EXPORTER", "OTEL_SDK_DISABLED"} {
			t.Setenv(k, tc.env[k])
		}
		if got := Configured(); got != tc.want {
			t.Errorf("Configured() with %v = %v, want %v", tc.env, got, tc.want)
		}
	}
}

// TestTraceCrossesKafkaAndReachesTheLogs: a record carries its producer's
// trace in its headers, a consumer's span continues it, a line logged in
// that span names it, and a batch links to a claim by its traceparent.
func TestTraceCrossesKafkaAndReachesTheLogs(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(Use(tp))
	tr := tp.Tracer("test")

	ctx, produce := tr.Start(context.Background(), "produce")
	pm := &sarama.ProducerMessage{Topic: "t", Headers: []sarama.RecordHeader{{Key: []byte("event_id"), Value: []byte("e1")}}}
	Inject(ctx, pm)
	claimTP := TraceParent(ctx)
	produce.End()
	cm := &sarama.ConsumerMessage{Topic: "t"}
	for i := range pm.Headers {
		cm.Headers = append(cm.Headers, &pm.Headers[i])
	}
	cctx, consume := tr.Start(Extract(context.Background(), cm), "consume")
	if consume.SpanContext().TraceID() != produce.SpanContext().TraceID() {
		t.Fatalf("the consumer's span is in trace %s, the producer's in %s", consume.SpanContext().TraceID(), produce.SpanContext().TraceID())
	}
	var buf bytes.Buffer
	slog.New(LogHandler(slog.NewTextHandler(&buf, nil))).InfoContext(cctx, "delivered")
	if want := "trace_id=" + produce.SpanContext().TraceID().String(); !strings.Contains(buf.String(), want) ||
		!strings.Contains(buf.String(), "span_id="+consume.SpanContext().SpanID().String()) {
		t.Errorf("log line %q lacks %s and the span", buf.String(), want)
	}
	consume.End()

	bctx, batch := tr.Start(context.Background(), "batch")
	LinkTo(bctx, claimTP, "", "garbage")
	batch.End()
	spans := exp.GetSpans()
	last := spans[len(spans)-1]
	if len(last.Links) != 1 || last.Links[0].SpanContext.SpanID() != produce.SpanContext().SpanID() {
		t.Errorf("the batch's links are %v, want one to the claim", last.Links)
	}
}
