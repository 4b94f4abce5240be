package kafka

import (
	"slices"
	"testing"

	"github.com/claimflow/claimflow/workflows"
)

// TestTopicListMatchesWorkflows: the workflows name the topics they publish
// to and the ones DeliverEvent expects consumed; the list here adds
// partitions and dead-letter topics, and must name the same topics.
func TestTopicListMatchesWorkflows(t *testing.T) {
	if got := EventTopicNames(); !slices.Equal(got, workflows.ConsumedTopics) {
		t.Errorf("EventTopics are %v, workflows.ConsumedTopics %v", got, workflows.ConsumedTopics)
	}
	for _, et := range EventTopics {
		if et.DLT != et.Name+".DLT" {
			t.Errorf("%s: dead-letter topic %q, the activities copy dead letters to %q", et.Name, et.DLT, et.Name+".DLT")
		}
		if et.Partitions < 1 || et.DLTPartitions < 1 {
			t.Errorf("%s: partitions %d/%d", et.Name, et.Partitions, et.DLTPartitions)
		}
	}
	if n := len(AllTopics(3)); n != 2*len(EventTopics) {
		t.Errorf("AllTopics has %d topics, want %d", n, 2*len(EventTopics))
	}
}

// TestReplication: a small cluster keeps every copy in sync; from Replicas
// brokers on, one broker may be lost without refusing acks=all writes.
func TestReplication(t *testing.T) {
	for _, tc := range []struct {
		brokers             int
		replicas, minInsync int16
	}{
		{0, 1, 1}, {1, 1, 1}, {2, 2, 2}, {3, 3, 2}, {5, 3, 2},
	} {
		r, m := Replication(tc.brokers)
		if r != tc.replicas || m != tc.minInsync {
			t.Errorf("Replication(%d) = %d, %d; want %d, %d", tc.brokers, r, m, tc.replicas, tc.minInsync)
		}
		if m > r {
			t.Errorf("Replication(%d): min.insync.replicas %d above the replication factor %d", tc.brokers, m, r)
		}
	}
}
