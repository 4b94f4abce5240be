// Package tracing is claimflow's OpenTelemetry tracing: the tracer
// provider the standard OTEL_* variables configure, the trace context
// carried in Kafka record headers, and the trace and span IDs on log
// lines. With no exporter configured nothing is installed: the global
// provider stays OpenTelemetry's no-op, and a span costs a function call.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync/atomic"

	"github.com/IBM/sarama"
	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Name is the instrumentation scope of claimflow's own spans.
const Name = "github.com/claimflow/claimflow"

// Tracer is claimflow's tracer, from the global provider.
func Tracer() trace.Tracer { return otel.Tracer(Name) }

// on is set once a tracer provider is installed (Setup, or Use in a
// test): until then no claimflow code starts a span, builds attributes or
// links, or installs an interceptor, so tracing off costs one atomic load.
var on atomic.Bool

// On reports whether spans are recorded.
func On() bool { return on.Load() }

// Use installs tp as the global provider with the W3C propagator and turns
// tracing on: Setup's work without the exporter, for tests. restore turns
// it off again and puts the previous provider back.
func Use(tp trace.TracerProvider) (restore func()) {
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	on.Store(true)
	return func() {
		on.Store(false)
		otel.SetTracerProvider(prev)
	}
}

// Start starts a span of claimflow's tracer when tracing is on; otherwise
// it returns ctx and a no-op span without evaluating opts.
func Start(ctx context.Context, name string, opts func() []trace.SpanStartOption) (context.Context, trace.Span) {
	if !on.Load() {
		return ctx, trace.SpanFromContext(context.Background())
	}
	return Tracer().Start(ctx, name, opts()...)
}

// Configured reports whether the environment asks for traces: an OTLP
// endpoint, or an exporter other than none, and the SDK not disabled.
func Configured() bool {
	if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") {
		return false
	}
	if e := os.Getenv("OTEL_TRACES_EXPORTER"); e != "" {
		return e != "none"
	}
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Setup installs the W3C trace-context propagator and, when Configured, a
// batching tracer provider whose exporter, endpoint, sampler
// (OTEL_TRACES_SAMPLER, OTEL_TRACES_SAMPLER_ARG) and service name
// (OTEL_SERVICE_NAME, else service) come from the environment. shutdown
// flushes the spans still buffered.
func Setup(ctx context.Context, service string) (shutdown func(context.Context) error, err error) {
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	if !Configured() {
		return func(context.Context) error { return nil }, nil
	}
	exp, err := autoexport.NewSpanExporter(ctx)
	if err != nil {
		return nil, fmt.Errorf("OpenTelemetry exporter (OTEL_TRACES_EXPORTER, OTEL_EXPORTER_OTLP_*): %w", err)
	}
	if os.Getenv("OTEL_SERVICE_NAME") == "" {
		_ = os.Setenv("OTEL_SERVICE_NAME", service)
	}
	res, err := resource.New(ctx, resource.WithFromEnv(), resource.WithTelemetrySDK(), resource.WithHost())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("OpenTelemetry resource: %w", err)
	}
	// The sampler is the SDK's default, which reads OTEL_TRACES_SAMPLER.
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	Use(tp)
	return tp.Shutdown, nil
}

// producerHeaders carries a trace context into a record's headers.
type producerHeaders struct{ m *sarama.ProducerMessage }

func (c producerHeaders) Get(key string) string {
	for _, h := range c.m.Headers {
		if string(h.Key) == key {
			return string(h.Value)
		}
	}
	return ""
}

func (c producerHeaders) Set(key, value string) {
	for i, h := range c.m.Headers {
		if string(h.Key) == key {
			c.m.Headers[i].Value = []byte(value)
			return
		}
	}
	c.m.Headers = append(c.m.Headers, sarama.RecordHeader{Key: []byte(key), Value: []byte(value)})
}

func (c producerHeaders) Keys() []string {
	out := make([]string, len(c.m.Headers))
	for i, h := range c.m.Headers {
		out[i] = string(h.Key)
	}
	return out
}

// consumerHeaders reads a trace context from a consumed record's headers.
type consumerHeaders struct{ m *sarama.ConsumerMessage }

func (c consumerHeaders) Get(key string) string {
	for _, h := range c.m.Headers {
		if h != nil && string(h.Key) == key {
			return string(h.Value)
		}
	}
	return ""
}

func (c consumerHeaders) Set(string, string) {}

func (c consumerHeaders) Keys() []string {
	out := make([]string, 0, len(c.m.Headers))
	for _, h := range c.m.Headers {
		if h != nil {
			out = append(out, string(h.Key))
		}
	}
	return out
}

// Inject writes ctx's trace context into m's headers (traceparent,
// tracestate): the consumer's span continues the trace that produced it.
func Inject(ctx context.Context, m *sarama.ProducerMessage) {
	if !On() {
		return
	}
	otel.GetTextMapPropagator().Inject(ctx, producerHeaders{m})
}

// Extract is the trace context m carries, on top of ctx.
func Extract(ctx context.Context, m *sarama.ConsumerMessage) context.Context {
	if !On() {
		return ctx
	}
	return otel.GetTextMapPropagator().Extract(ctx, consumerHeaders{m})
}

// LogHandler adds trace_id and span_id to every record logged with a
// context that holds a valid span, so a log line leads to its trace.
func LogHandler(h slog.Handler) slog.Handler { return logHandler{h} }

type logHandler struct{ slog.Handler }

func (h logHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return h.Handler.Handle(ctx, r)
}

func (h logHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return logHandler{h.Handler.WithAttrs(as)}
}
func (h logHandler) WithGroup(name string) slog.Handler { return logHandler{h.Handler.WithGroup(name)} }

// Transport traces the HTTP calls made through rt (the webhook, the
// payout API) while tracing is on.
func Transport(rt http.RoundTripper) http.RoundTripper {
	return maybeTraced{plain: rt, traced: otelhttp.NewTransport(rt)}
}

// maybeTraced decides per call, so a client made before tracing was
// turned on traces too.
type maybeTraced struct{ plain, traced http.RoundTripper }

func (m maybeTraced) RoundTrip(r *http.Request) (*http.Response, error) {
	if On() {
		return m.traced.RoundTrip(r)
	}
	return m.plain.RoundTrip(r)
}

// TraceParent is ctx's span as a W3C traceparent, or "" without a valid,
// sampled span.
func TraceParent(ctx context.Context) string {
	if !trace.SpanContextFromContext(ctx).IsSampled() {
		return ""
	}
	c := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, c)
	return c["traceparent"]
}

// LinkTo adds to ctx's span a link to each traceparent given: the claims a
// batch decides, each from a request trace of its own.
func LinkTo(ctx context.Context, traceparents ...string) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	for _, tp := range traceparents {
		if tp == "" {
			continue
		}
		sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": tp}))
		if sc.IsValid() {
			span.AddLink(trace.Link{SpanContext: sc})
		}
	}
}
