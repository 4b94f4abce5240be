package main

// Helpers of the audits in the tests: wait for a consumer group to catch up
// (instead of sleeping and hoping), and read a topic as the audit reads it.

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/claimflow/claimflow/internal/kafka"

	"github.com/claimflow/claimflow/dev/audit"

	"github.com/IBM/sarama"

	"github.com/claimflow/claimflow/workflows"
)

// waitCaughtUp polls until the group has committed every partition of topic
// up to its end. A consumer commits an offset only after the record's effect
// is durable (or handed to a DeliverEvent run), so once it caught up every
// record on the topic has had its chance to take effect: "nothing more
// happened" can be checked then, not after a guessed sleep.
func waitCaughtUp(t *testing.T, s *stack, topic, group string, timeout time.Duration) {
	t.Helper()
	cfg := sarama.NewConfig()
	v, err := sarama.ParseKafkaVersion(kafka.DefaultVersion)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Version = v
	client, err := sarama.NewClient(s.Config.KafkaBrokers, cfg)
	if err != nil {
		t.Fatalf("kafka client: %v", err)
	}
	defer client.Close()
	partitions, err := client.Partitions(topic)
	if err != nil {
		t.Fatalf("partitions of %s: %v", topic, err)
	}
	kcfg := s.Config.Kafka("claimflow-test")
	var last time.Time
	waitFor(t, timeout, "group "+group+" to commit all of "+topic, func() bool {
		// An admin round trip per look: a few looks a second are plenty.
		if time.Since(last) < 250*time.Millisecond {
			return false
		}
		last = time.Now()
		committed, err := kafka.CommittedOffsets(kcfg, group, map[string][]int32{topic: partitions})
		if err != nil {
			return false
		}
		for _, p := range partitions {
			end, err := client.GetOffset(topic, p, sarama.OffsetNewest)
			if err != nil {
				return false
			}
			start, err := client.GetOffset(topic, p, sarama.OffsetOldest)
			if err != nil {
				return false
			}
			// A partition with nothing to read has nothing to commit
			// either: the group's offset there stays -1.
			if end > start && committed[topic][p] < end {
				return false
			}
		}
		return true
	})
}

// enrollmentCopies is what the enrollment topic holds of the enrollments of
// some courses, read the way the audit reads it.
type enrollmentCopies struct {
	// confirmed: enrollment ID → records of its enrollment.confirmed event.
	confirmed map[string]int
	// mismatched: event IDs whose copies differ in payload.
	mismatched []string
	// claimDuplicates: events repeating another's type and data under
	// another event ID.
	claimDuplicates []string
	// badIDs: events whose ID is not the one derived from their enrollment.
	badIDs []string
	// redelivered: copies beyond the first of an event ID.
	redelivered int
	// ids: every event ID of the courses, of any type.
	ids map[string]bool
}

// readEnrollmentCopies reads topic with the audit's reader and sorts out
// the events of the given courses.
func readEnrollmentCopies(t *testing.T, s *stack, topic string, courses []string) enrollmentCopies {
	t.Helper()
	copies, missing, err := audit.ReadCopies(context.Background(), s.Config.Kafka("claimflow-test"), []string{topic})
	if err != nil || len(missing) > 0 {
		t.Fatalf("read %s: %v (missing %v)", topic, err, missing)
	}
	inCourses := map[string]bool{}
	for _, c := range courses {
		inCourses[c] = true
	}
	out := enrollmentCopies{confirmed: map[string]int{}, ids: map[string]bool{}}
	first := map[string]audit.Copy{}
	claims := map[string]string{}
	for _, rec := range copies {
		if !inCourses[rec.Key] {
			continue // a real broker shared between runs holds other courses' events
		}
		out.ids[rec.EventID] = true
		if f, ok := first[rec.EventID]; ok {
			out.redelivered++
			if f.Digest != rec.Digest {
				out.mismatched = append(out.mismatched, rec.EventID)
			}
		} else {
			first[rec.EventID] = rec
			if other, ok := claims[rec.Claim]; ok && rec.Claim != "" {
				out.claimDuplicates = append(out.claimDuplicates, rec.EventID+" repeats "+other)
			}
			claims[rec.Claim] = rec.EventID
		}
		if rec.EventType != workflows.EventEnrollmentConfirmed {
			continue
		}
		var data struct {
			EnrollmentID string `json:"enrollment_id"`
		}
		if i := len(rec.EventType) + 1; len(rec.Claim) > i {
			_ = json.Unmarshal([]byte(rec.Claim[i:]), &data)
		}
		if want := data.EnrollmentID + "/" + rec.EventType; data.EnrollmentID == "" || rec.EventID != want {
			out.badIDs = append(out.badIDs, rec.EventID)
			continue
		}
		out.confirmed[data.EnrollmentID]++
	}
	return out
}
