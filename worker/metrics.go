package worker

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/interceptor"
)

// attemptMetrics counts activity attempts by type, first try or retry, and
// outcome, so a dashboard shows where retry policies are being spent.
type attemptMetrics struct {
	interceptor.WorkerInterceptorBase
	attempts *prometheus.CounterVec
}

// NewAttemptMetrics registers the counter and returns the interceptor to put
// in worker.Options.Interceptors.
func NewAttemptMetrics(reg prometheus.Registerer) interceptor.WorkerInterceptor {
	m := &attemptMetrics{attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "claimflow_activity_attempts_total",
		Help: "Activity attempts by activity type, attempt (first or retry) and outcome (ok, error).",
	}, []string{"activity", "attempt", "outcome"})}
	reg.MustRegister(m.attempts)
	return m
}

func (m *attemptMetrics) InterceptActivity(ctx context.Context, next interceptor.ActivityInboundInterceptor) interceptor.ActivityInboundInterceptor {
	i := &countingActivity{attempts: m.attempts}
	i.Next = next
	return i
}

type countingActivity struct {
	interceptor.ActivityInboundInterceptorBase
	attempts *prometheus.CounterVec
}

func (i *countingActivity) ExecuteActivity(ctx context.Context, in *interceptor.ExecuteActivityInput) (any, error) {
	info := activity.GetInfo(ctx)
	attempt := "first"
	if info.Attempt > 1 {
		attempt = "retry"
	}
	result, err := i.Next.ExecuteActivity(ctx, in)
	outcome := "ok"
	if err != nil {
		outcome = "error"
	}
	i.attempts.WithLabelValues(info.ActivityType.Name, attempt, outcome).Inc()
	return result, err
}
