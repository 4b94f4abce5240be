package audit

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/claimflow/claimflow/dev/notifysim"
	"github.com/claimflow/claimflow/workflows"
)

// auditFixture is a topic and a notifications table as assess sees them.
type auditFixture struct {
	ts      topicState
	notes   map[string]delivered
	running map[string]bool
	ledger  []notifysim.Delivery
	webhook bool
}

// eventValue is an enrollment.confirmed event as the workflows publish it.
func eventValue(id, enrollment, student string, at time.Time) []byte {
	b, _ := json.Marshal(workflows.Event{ID: id, Type: workflows.EventEnrollmentConfirmed, OccurredAt: at,
		Data: map[string]any{"enrollment_id": enrollment, "course_id": "c1", "student_id": student}})
	return b
}

// add puts a record on partition 0 at the next offset and, when note is
// set, its notification.
func (f *auditFixture) add(id, enrollment, student string, at time.Time, note bool) {
	offset := int64(len(f.ts.records))
	v := eventValue(id, enrollment, student, at)
	f.ts.records = append(f.ts.records, newTopicRecord(workflows.ConsumedEvent{Topic: "t", Partition: 0, Offset: offset,
		Key: "c1", EventID: id, EventType: workflows.EventEnrollmentConfirmed}, v))
	f.ts.committed["t"][0] = offset + 1
	if note {
		f.notes[id] = delivered{topic: "t", partition: 0, offset: offset, key: "c1", path: "consumer",
			seq: int64(len(f.notes) + 1), claim: ClaimOf(workflows.EventEnrollmentConfirmed, v)}
	}
}

func newAuditFixture() *auditFixture {
	f := &auditFixture{
		ts: topicState{
			oldest:    map[string]map[int32]int64{"t": {0: 0, 1: 10}},
			committed: map[string]map[int32]int64{"t": {0: 0}},
		},
		notes:   map[string]delivered{},
		running: map[string]bool{},
	}
	at := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	for i := range 3 {
		e := fmt.Sprintf("e%d", i+1)
		f.add(workflows.EventID(e, workflows.EventEnrollmentConfirmed), e, "s"+e, at, true)
	}
	return f
}

func id(e string) string { return workflows.EventID(e, workflows.EventEnrollmentConfirmed) }

// TestAssessCatchesEachFault: each fault the delivery guarantee rules out
// fails the audit, and what the guarantee allows (redelivered copies,
// webhook re-sends, events still in retry, rows whose event expired) is
// counted without failing it. Removing any of the audit's checks fails a
// case here.
func TestAssessCatchesEachFault(t *testing.T) {
	later := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	at := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	delivery := func(key string, body string, r notifysim.Result) notifysim.Delivery {
		return notifysim.Delivery{Key: key, Topic: "t", Body: body, Result: r}
	}
	cases := []struct {
		name  string
		setup func(f *auditFixture)
		ok    bool
		check func(r Report) bool
	}{
		{"every event delivered once", func(f *auditFixture) {}, true,
			func(r Report) bool { return r.Events == 3 && r.Delivered == 3 && r.Redelivered == 0 }},
		{"a redelivered copy with the same payload is reported, not a fault", func(f *auditFixture) {
			f.add(id("e1"), "e1", "se1", at, false)
		}, true, func(r Report) bool {
			return r.Records == 4 && r.Events == 3 && r.Redelivered == 1 && r.PayloadMismatches == 0
		}},
		{"a copy with another payload under the same event ID", func(f *auditFixture) {
			f.add(id("e1"), "e1", "someone-else", at, false)
		}, false, func(r Report) bool { return r.Redelivered == 1 && r.PayloadMismatches == 1 }},
		{"a copy built later (another occurred_at) is another payload", func(f *auditFixture) {
			f.add(id("e1"), "e1", "se1", later, false)
		}, false, func(r Report) bool { return r.PayloadMismatches == 1 }},
		{"one claim republished under a second event ID, notified twice", func(f *auditFixture) {
			f.add("random-id-1", "e1", "se1", later, true)
		}, false, func(r Report) bool {
			return r.ClaimDuplicates == 1 && r.DuplicateEffects == 1 && r.Redelivered == 0
		}},
		{"an event consumed without a notification is lost", func(f *auditFixture) {
			delete(f.notes, id("e2"))
		}, false, func(r Report) bool { return r.Lost == 1 && r.Delivered == 2 }},
		{"an event without a notification but with a delivery run is in retry", func(f *auditFixture) {
			delete(f.notes, id("e2"))
			f.running[id("e2")] = true
		}, true, func(r Report) bool { return r.InRetry == 1 && r.Lost == 0 }},
		{"an event beyond the committed offset is not yet consumed", func(f *auditFixture) {
			delete(f.notes, id("e3"))
			f.ts.committed["t"][0] = 2
		}, true, func(r Report) bool { return r.NotYetConsumed == 1 && r.Lost == 0 }},
		{"a notification naming no event the topic still keeps", func(f *auditFixture) {
			f.notes["ghost"] = delivered{topic: "t", partition: 0, offset: 1, path: "consumer", seq: 99}
		}, false, func(r Report) bool { return r.Orphans == 1 }},
		{"a notification whose event retention removed", func(f *auditFixture) {
			f.notes["old"] = delivered{topic: "t", partition: 1, offset: 5, path: "consumer", seq: 99}
		}, true, func(r Report) bool { return r.Expired == 1 && r.Orphans == 0 }},
		{"the webhook re-sent a key with the same body: at-least-once", func(f *auditFixture) {
			f.webhook = true
			f.ledger = []notifysim.Delivery{
				delivery(id("e1"), "a", notifysim.Accepted), delivery(id("e1"), "a", notifysim.Duplicate),
				delivery(id("e2"), "b", notifysim.Rejected), delivery(id("e2"), "b", notifysim.Accepted),
				delivery(id("e3"), "c", notifysim.Accepted),
			}
		}, true, func(r Report) bool {
			return r.Webhook != nil && r.Webhook.Resent == 1 && r.Webhook.Retried == 1 && r.Webhook.Effects == 3
		}},
		{"a webhook key taking effect twice", func(f *auditFixture) {
			f.webhook = true
			f.ledger = []notifysim.Delivery{delivery(id("e1"), "a", notifysim.Accepted), delivery(id("e1"), "a", notifysim.Accepted)}
		}, false, func(r Report) bool { return len(r.Webhook.DoubleEffects) == 1 }},
		{"a webhook key sent with another body", func(f *auditFixture) {
			f.webhook = true
			f.ledger = []notifysim.Delivery{delivery(id("e1"), "a", notifysim.Accepted), delivery(id("e1"), "b", notifysim.Duplicate)}
		}, false, func(r Report) bool { return len(r.Webhook.BodyChanged) == 1 }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newAuditFixture()
			tc.setup(f)
			r := assess(Report{Topics: []string{"t"}}, f.ts, f.notes, map[string]string{},
				func(ids []string) map[string]bool { return f.running }, f.ledger, f.webhook, 10)
			var b strings.Builder
			r.WriteText(&b)
			if r.OK() != tc.ok || !tc.check(r) {
				t.Errorf("OK() = %v, want %v; report:\n%s", r.OK(), tc.ok, b.String())
			}
		})
	}
}
