package activities

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/claimflow/claimflow/workflows"
)

// recordingProducer acknowledges every message and keeps the enrollment IDs
// it was given (ProducerMessage.Metadata).
type recordingProducer struct {
	mu   sync.Mutex
	sent []string
}

func (p *recordingProducer) SendMessages(msgs []*sarama.ProducerMessage) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range msgs {
		p.sent = append(p.sent, m.Metadata.(string))
	}
	return nil
}

func (p *recordingProducer) SendMessage(m *sarama.ProducerMessage) (int32, int64, error) {
	return 0, 0, p.SendMessages([]*sarama.ProducerMessage{m})
}

// batchOf is a ReserveSeatsInput of one claim per student and the
// PublishBatchInput of its events.
func batchOf(p, course string, students ...string) (workflows.ReserveSeatsInput, workflows.PublishBatchInput) {
	in := workflows.ReserveSeatsInput{WorkflowID: p + "batch-" + course, RunID: "run-1"}
	var pub workflows.PublishBatchInput
	for _, s := range students {
		id := p + course + "-" + s
		in.Claims = append(in.Claims, workflows.EnrollmentInput{EnrollmentID: id, CourseID: course, StudentID: s, RequestedAt: time.Now()})
		pub.EnrollmentIDs = append(pub.EnrollmentIDs, id)
		pub.Messages = append(pub.Messages, workflows.Message{Topic: workflows.EnrollmentTopic, Key: course,
			Event: workflows.Event{ID: workflows.EventID(id, workflows.EventEnrollmentConfirmed), Type: workflows.EventEnrollmentConfirmed}})
	}
	return in, pub
}

// A batch retried after its first student's event went out: ReserveSeats
// reports that event as out, and PublishBatch sends only the others —
// looking the published ones up itself, or taking them from ReserveSeats
// when the fast path says it knows (then it does not look: an input that
// knows of none sends all).
func TestPublishBatchSendsOnlyWhatIsNotOut(t *testing.T) {
	db, p := testDB(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		// publish builds the publish of the retried batch from its input
		// and ReserveSeats' answer.
		publish func(in workflows.PublishBatchInput, res workflows.ReserveSeatsResult) workflows.PublishBatchInput
		want    []string // students whose events the retry sends
	}{
		{"a retry looks them up", func(in workflows.PublishBatchInput, _ workflows.ReserveSeatsResult) workflows.PublishBatchInput {
			return in
		}, []string{"bob", "cyd"}},
		{"the fast path takes ReserveSeats' word", func(in workflows.PublishBatchInput, res workflows.ReserveSeatsResult) workflows.PublishBatchInput {
			in.PublishedKnown, in.Published, in.Confirm = true, res.Published, true
			return in
		}, []string{"bob", "cyd"}},
		{"a known list is not looked up again", func(in workflows.PublishBatchInput, _ workflows.ReserveSeatsResult) workflows.PublishBatchInput {
			in.PublishedKnown = true
			return in
		}, []string{"ann", "bob", "cyd"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			course := p + sanitize(tc.name)
			addCourse(t, db, course, 5)
			prod := &recordingProducer{}
			a := testActivities(t, db)
			a.Producer = prod
			reserve, publish := batchOf(p, course, "ann", "bob", "cyd")
			first, err := a.ReserveSeats(ctx, reserve)
			if err != nil {
				t.Fatal(err)
			}
			if len(first.Published) != 0 {
				t.Fatalf("a new batch has events out: %v", first.Published)
			}
			// ann's event goes out; then the worker dies.
			ann := workflows.PublishBatchInput{Messages: publish.Messages[:1], EnrollmentIDs: publish.EnrollmentIDs[:1]}
			if err := a.PublishBatch(ctx, ann); err != nil {
				t.Fatal(err)
			}
			again, err := a.ReserveSeats(ctx, reserve)
			if err != nil {
				t.Fatal(err)
			}
			if want := publish.EnrollmentIDs[:1]; !slices.Equal(again.Published, want) {
				t.Fatalf("retried ReserveSeats says %v are out, want %v", again.Published, want)
			}
			if fmt.Sprint(again.Decisions) != fmt.Sprint(first.Decisions) {
				t.Fatalf("retried ReserveSeats decided\n%v\nthe first time\n%v", again.Decisions, first.Decisions)
			}
			prod.sent = nil
			if err := a.PublishBatch(ctx, tc.publish(publish, again)); err != nil {
				t.Fatal(err)
			}
			var want []string
			for _, s := range tc.want {
				want = append(want, p+course+"-"+s)
			}
			if !slices.Equal(prod.sent, want) {
				t.Errorf("the retry sent %v, want %v", prod.sent, want)
			}
			var out int
			if err := db.QueryRow(ctx, `SELECT count(*) FROM enrollments WHERE id = ANY($1) AND published_at IS NOT NULL`, publish.EnrollmentIDs).Scan(&out); err != nil {
				t.Fatal(err)
			}
			if out != 3 {
				t.Errorf("%d of 3 enrollments stamped published", out)
			}
		})
	}
}

// A batch whose write fails half-way leaves nothing behind: no enrollment,
// no seat taken, and its connection goes back to the pool usable. Two claims
// under one enrollment ID make the insert fail after the courses are locked.
func TestReserveSeatsFailingHalfWayWritesNothing(t *testing.T) {
	db, p := testDB(t)
	ctx := context.Background()
	cfg := db.Config()
	cfg.MaxConns = 1
	one, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	course := p + "half"
	addCourse(t, db, course, 5)
	a := testActivities(t, one)
	bad, _ := batchOf(p, course, "ann", "bob")
	bad.Claims[1].EnrollmentID = bad.Claims[0].EnrollmentID
	if _, err := a.ReserveSeats(ctx, bad); err == nil {
		t.Fatal("a batch with one enrollment ID twice was recorded")
	}
	assertSeats(t, db, course, 0)
	// Rolled back, not dropped: the pool keeps its one connection.
	if st := one.Stat(); st.TotalConns() != 1 || st.AcquiredConns() != 0 {
		t.Errorf("pool after the failure: %d connections, %d acquired; want 1 idle", st.TotalConns(), st.AcquiredConns())
	}
	good, _ := batchOf(p, course, "cyd")
	res, err := a.ReserveSeats(ctx, good)
	if err != nil {
		t.Fatalf("the next batch: %v", err)
	}
	if res.Decisions[0].Status != workflows.StatusReserved {
		t.Fatalf("the next batch decided %+v", res.Decisions[0])
	}
	assertSeats(t, db, course, 1)
}
