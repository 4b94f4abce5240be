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
