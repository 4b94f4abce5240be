package activities

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/claimflow/claimflow/consumer"
	"github.com/claimflow/claimflow/workflows"
)

// A publish that fails round after round, recorded from several attempts at
// once, is one dead letter (per stage) with the highest round; the
// enrollment keeps its seat, dead-lettered. The consume stage's dead letter
// (the consumer's activity) shares the table and must not collide.
func TestRecordDeadLetterOnePerEvent(t *testing.T) {
	db, p := testDB(t)
	a := testActivities(t, db)
	ctx := context.Background()
	course := p + "c"
	addCourse(t, db, course, 2)
	in := seatInput(p, "e1", course, "s1")
	if _, err := reserveSeat(ctx, a, in); err != nil {
		t.Fatal(err)
	}
	eventID := workflows.EventID(in.EnrollmentID, workflows.EventEnrollmentConfirmed)
	msg := workflows.Message{Topic: p + "enrollments", Key: "s1", Event: workflows.Event{
		ID: eventID, Type: workflows.EventEnrollmentConfirmed, OccurredAt: time.Now(), Data: map[string]any{"student_id": "s1"}}}
	concurrently(6, func(i int) {
		_, err := a.RecordDeadLetter(ctx, workflows.DeadLetterInput{Message: msg, WorkflowID: in.WorkflowID, RunID: "run-1",
			EnrollmentID: in.EnrollmentID, Error: "broker down", Round: 1 + i%3})
		if err != nil {
			t.Errorf("record dead letter: %v", err)
		}
	})
	// A run that records an earlier round (a reset run of the same event)
	// is told the row's round, which the operator's decision names.
	rec, err := a.RecordDeadLetter(ctx, workflows.DeadLetterInput{Message: msg, WorkflowID: in.WorkflowID, RunID: "run-2",
		EnrollmentID: in.EnrollmentID, Error: "broker down", Round: 1})
	if err != nil {
		t.Fatal(err)
	}
	if rec.Round != 3 {
		t.Errorf("RecordDeadLetter answered round %d, want the row's 3", rec.Round)
	}
	value, _ := json.Marshal(msg.Event)
	consumed := workflows.ConsumedEvent{Topic: msg.Topic, Key: "s1", EventID: eventID, EventType: msg.Event.Type, Value: string(value)}
	delivery := &consumer.Activities{DB: db, Producer: acceptingProducer{}, Log: a.Log}
	concurrently(4, func(i int) {
		_, err := delivery.RecordConsumeDeadLetter(ctx, workflows.ConsumeDeadLetterInput{Event: consumed, WorkflowID: "deliver-" + eventID,
			RunID: fmt.Sprint("run-", i), Error: "webhook down", Round: 1})
		if err != nil {
			t.Errorf("record consume dead letter: %v", err)
		}
	})
	rows, err := db.Query(ctx, `SELECT stage, count(*), max(rounds) FROM dead_letters WHERE event_id = $1 GROUP BY stage ORDER BY stage`, eventID)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := map[string][2]int{}
	for rows.Next() {
		var stage string
		var n, rounds int
		if err := rows.Scan(&stage, &n, &rounds); err != nil {
			t.Fatal(err)
		}
		got[stage] = [2]int{n, rounds}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if want := map[string][2]int{"consume": {1, 1}, "publish": {1, 3}}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("dead letters of %s (stage: rows, rounds) = %v, want %v", eventID, got, want)
	}
	if s := statusOf(t, db, in.EnrollmentID); s != "dead_lettered" {
		t.Errorf("enrollment is %s, want dead_lettered", s)
	}
	assertSeats(t, db, course, 1)
}
