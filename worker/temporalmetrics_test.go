package worker

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The SDK adds tags as it goes: one metric family may be recorded with
// different tag sets, which Prometheus only accepts with one label set per
// family. The collector must pad, not fail the scrape.
func TestTemporalMetricsPadsLabelsPerFamily(t *testing.T) {
	m := NewTemporalMetrics()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	h := m.Handler()
	h.WithTags(map[string]string{"workflow_type": "Enrollment"}).Counter("temporal_workflow_completed").Inc(2)
	h.WithTags(map[string]string{"workflow_type": "Cancellation", "task_queue": "claimflow"}).Counter("temporal_workflow_completed").Inc(1)
	h.Gauge("worker_task_slots_available").Update(7)
	h.WithTags(map[string]string{"activity_type": "Publish"}).Timer("activity_execution_latency").Record(3 * time.Millisecond)

	want := `
# HELP temporal_workflow_completed_total Temporal SDK metric temporal_workflow_completed.
# TYPE temporal_workflow_completed_total counter
temporal_workflow_completed_total{task_queue="",workflow_type="Enrollment"} 2
temporal_workflow_completed_total{task_queue="claimflow",workflow_type="Cancellation"} 1
# HELP temporal_worker_task_slots_available Temporal SDK metric worker_task_slots_available.
# TYPE temporal_worker_task_slots_available gauge
temporal_worker_task_slots_available 7
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"temporal_workflow_completed_total", "temporal_worker_task_slots_available"); err != nil {
		t.Fatal(err)
	}
	n, err := testutil.GatherAndCount(reg, "temporal_activity_execution_latency_seconds")
	if err != nil || n != 1 {
		t.Fatalf("activity latency histogram: %d series, %v", n, err)
	}
}
