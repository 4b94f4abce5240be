package consumer

import (
	"testing"

	"github.com/claimflow/claimflow/workflows"
)

func TestNotificationRecipient(t *testing.T) {
	for _, tc := range []struct {
		name, data, want string
	}{
		{"a student", `{"student_id":"s-1","course_id":"c1"}`, "s-1"},
		{"a user", `{"user_id":"u-1","coupon_id":"k"}`, "u-1"},
		{"the student before the user", `{"user_id":"u-1","student_id":"s-1"}`, "s-1"},
		{"an empty student falls to the user", `{"student_id":"","user_id":"u-1"}`, "u-1"},
		{"a student that is not a string falls to the user", `{"student_id":7,"user_id":"u-1"}`, "u-1"},
		{"nested values are not names", `{"student":{"student_id":"s-1"}}`, ""},
		{"nobody", `{"course_id":"c1"}`, ""},
		{"data not an object", `[1,2]`, ""},
		{"no data", ``, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			value := `{"event_id":"e-1","type":"enrollment.confirmed","occurred_at":"2026-12-02T00:00:00Z"`
			if tc.data != "" {
				value += `,"data":` + tc.data
			}
			value += `}`
			n, err := newNotification(workflows.ConsumedEvent{EventID: "e-1", EventType: "enrollment.confirmed", Topic: "t", Value: value})
			if err != nil {
				t.Fatal(err)
			}
			if n.recipient != tc.want {
				t.Fatalf("recipient = %q, want %q", n.recipient, tc.want)
			}
			if string(n.payload) != value || n.occurredAt == nil {
				t.Fatalf("payload %s, occurred at %v: the event must pass whole", n.payload, n.occurredAt)
			}
		})
	}
}

// BenchmarkNewNotification is the consumer's per-event decoding.
func BenchmarkNewNotification(b *testing.B) {
	ev := workflows.ConsumedEvent{EventID: "e-1", EventType: "enrollment.confirmed", Topic: "t",
		Value: `{"event_id":"01a2-e","type":"enrollment.confirmed","occurred_at":"2026-12-02T00:00:00Z","data":{"enrollment_id":"01a234ef-716e-7690-a14d-c70d99dfe79b","course_id":"bntpegs5dc2519-c006","student_id":"s0","workflow_id":"enrollment-batch:01a234ef","status":"confirmed"}}`}
	b.ReportAllocs()
	for b.Loop() {
		if n, err := newNotification(ev); err != nil || n.recipient != "s0" {
			b.Fatal(n, err)
		}
	}
}
