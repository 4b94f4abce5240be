package consumer

// The consumer's dedupe, contended where it lives: the consumer's batch step
// (Consumer.apply, fed by a fake session instead of Kafka), the durable
// path's DeliverNotification and the sink's insert, each given the same
// events again, within one batch, in a later batch and from two consumers
// at once. One notifications row per event_id, and the webhook is not sent
// an event the table already holds.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/testsuite"

	"github.com/claimflow/claimflow/dev/pgtest"
	"github.com/claimflow/claimflow/internal/config"
	"github.com/claimflow/claimflow/internal/kafka"
	"github.com/claimflow/claimflow/workflows"
)

// webhookCounter is a notification webhook that accepts everything and
// counts how often it was sent each event.
type webhookCounter struct {
	*httptest.Server
	mu       sync.Mutex
	sent     map[string]int
	requests int
	// delay holds each request this long before answering.
	delay time.Duration
}

func newWebhookCounter(t *testing.T) *webhookCounter {
	w := &webhookCounter{sent: map[string]int{}}
	w.Server = httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		var req WebhookRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(rw, err.Error(), http.StatusBadRequest)
			return
		}
		w.mu.Lock()
		for _, n := range req.Notifications {
			w.sent[n.EventID]++
		}
		w.requests++
		delay := w.delay
		w.mu.Unlock()
		time.Sleep(delay)
		rw.WriteHeader(http.StatusOK) // an empty body: all accepted
	}))
	t.Cleanup(w.Close)
	return w
}

func (w *webhookCounter) count(id string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.sent[id]
}

// fakeSession is the consumer group session of one batch.
type fakeSession struct {
	ctx    context.Context
	mu     sync.Mutex
	marked []int64
}

func (s *fakeSession) Claims() map[string][]int32               { return nil }
func (s *fakeSession) MemberID() string                         { return "test-member" }
func (s *fakeSession) GenerationID() int32                      { return 1 }
func (s *fakeSession) MarkOffset(string, int32, int64, string)  {}
func (s *fakeSession) Commit()                                  {}
func (s *fakeSession) ResetOffset(string, int32, int64, string) {}
func (s *fakeSession) Context() context.Context                 { return s.ctx }
func (s *fakeSession) MarkMessage(m *sarama.ConsumerMessage, _ string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.marked = append(s.marked, m.Offset)
}

// noHandOff is a Temporal that must not be asked: every event here is
// well-formed and the webhook takes it inline.
type noHandOff struct{ t *testing.T }

func (n noHandOff) ExecuteWorkflow(_ context.Context, o client.StartWorkflowOptions, _ any, _ ...any) (client.WorkflowRun, error) {
	n.t.Errorf("event handed to a DeliverEvent run (%s); the inline attempt should have delivered it", o.ID)
	return nil, errors.New("test: no Temporal")
}

func eventRecord(topic string, offset int64, eventID, student string) *sarama.ConsumerMessage {
	v, _ := json.Marshal(map[string]any{
		"event_id": eventID, "type": workflows.EventEnrollmentConfirmed, "occurred_at": time.Now(),
		"data": map[string]any{"student_id": student},
	})
	pm := &sarama.ProducerMessage{Topic: topic, Key: sarama.ByteEncoder(student), Value: sarama.ByteEncoder(v)}
	if err := kafka.Sign(testEventKey, pm); err != nil {
		panic(err)
	}
	return &sarama.ConsumerMessage{Topic: topic, Partition: 0, Offset: offset, Key: []byte(student), Value: v,
		Headers: []*sarama.RecordHeader{{Key: []byte("event_id"), Value: []byte(eventID)}, &pm.Headers[0]}}
}

// testEventKey signs the records of these tests, as a worker would.
var testEventKey = []byte("the workers' key in these tests, 32+ bytes")

// notificationsOf counts the notifications rows of each event.
func notificationsOf(t *testing.T, db *pgxpool.Pool, ids []string) map[string]int {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT event_id, count(*) FROM notifications WHERE event_id = ANY($1) GROUP BY event_id`, ids)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		out[id] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func assertOneRowEach(t *testing.T, db *pgxpool.Pool, ids []string) {
	t.Helper()
	got := notificationsOf(t, db, ids)
	for _, id := range ids {
		if got[id] != 1 {
			t.Errorf("event %s: %d notifications rows, want 1", id, got[id])
		}
	}
}

func testConsumer(t *testing.T, db *pgxpool.Pool, webhook string) *Consumer {
	log := slog.New(slog.NewTextHandler(pgtest.LogWriter{T: t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	return newConsumer(Config{EventKey: testEventKey, Sink: &Sink{DB: db, WebhookURL: webhook}, Temporal: noHandOff{t}, Log: log,
		MaxBatch: config.DefaultConsumerBatch, DrainTimeout: time.Second}, nil, nil)
}

// applyBatch runs the consumer's batch step on records; a step that keeps
// failing gives up when the session ends after a few seconds.
func applyBatch(t *testing.T, c *Consumer, batch []*sarama.ConsumerMessage) (*fakeSession, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s := &fakeSession{ctx: ctx}
	return s, c.apply(s, batch)
}

// The consumer applies each event once: two copies within a batch are sent
// and recorded once; a batch delivered again (after a crash before the
// commit) sends nothing and records nothing; two consumers applying the same
// records at once (a rebalance) leave one row per event.
func TestConsumerAppliesEachEventOnce(t *testing.T) {
	db, p := testDB(t)
	hook := newWebhookCounter(t)
	topic := p + "enrollments"
	var ids []string
	var batch []*sarama.ConsumerMessage
	copies := map[string]int{}
	for i := range 5 {
		id := fmt.Sprintf("%se%d/%s", p, i, workflows.EventEnrollmentConfirmed)
		ids = append(ids, id)
		for range 1 + i%2 { // odd events twice: the publisher's retry after a lost ack
			batch = append(batch, eventRecord(topic, int64(len(batch)), id, fmt.Sprintf("s%d", i)))
			copies[id]++
		}
	}
	c := testConsumer(t, db, hook.URL)

	s, err := applyBatch(t, c, batch)
	if err != nil {
		t.Fatalf("apply: %v", err)
	}
	if last := batch[len(batch)-1].Offset; len(s.marked) != 1 || s.marked[0] != last {
		t.Errorf("marked offsets %v, want [%d]", s.marked, last)
	}
	for _, id := range ids {
		if n := hook.count(id); n != 1 {
			t.Errorf("event %s sent to the webhook %d times in a batch holding it %d times, want once", id, n, copies[id])
		}
	}
	assertOneRowEach(t, db, ids)

	// Redelivered: nothing is sent or written again.
	if _, err := applyBatch(t, c, batch); err != nil {
		t.Fatalf("apply the redelivered batch: %v", err)
	}
	for _, id := range ids {
		if n := hook.count(id); n != 1 {
			t.Errorf("event %s sent to the webhook %d times after a redelivery of a delivered batch, want once", id, n)
		}
	}
	assertOneRowEach(t, db, ids)

	// Two consumers at once on the same new records, three rounds.
	for round := range 3 {
		var fresh []string
		var records []*sarama.ConsumerMessage
		for i := range 6 {
			id := fmt.Sprintf("%sr%d-e%d/%s", p, round, i, workflows.EventEnrollmentConfirmed)
			fresh = append(fresh, id)
			records = append(records, eventRecord(topic, int64(100*(round+1)+i), id, fmt.Sprintf("s%d", i)))
		}
		concurrently(2, func(int) {
			if _, err := applyBatch(t, testConsumer(t, db, hook.URL), records); err != nil {
				t.Errorf("round %d: apply: %v", round, err)
			}
		})
		assertOneRowEach(t, db, fresh)
		for _, id := range fresh {
			if n := hook.count(id); n < 1 || n > 2 {
				t.Errorf("event %s sent %d times by two consumers, want 1 or 2 (at least once)", id, n)
			}
		}
	}
}

// Partitions applied at once by one consumer share webhook requests and
// INSERTs, and each event is still sent once and recorded once with its own
// data, and each partition's batch is marked.
func TestPartitionsShareRoundTrips(t *testing.T) {
	db, p := testDB(t)
	hook := newWebhookCounter(t)
	// Slow enough that the partitions arriving at once queue behind the
	// first request instead of each getting one of its own.
	hook.delay = 50 * time.Millisecond
	c := testConsumer(t, db, hook.URL)
	const partitions, perBatch = 12, 7
	batches := make([][]*sarama.ConsumerMessage, partitions)
	var ids []string
	student := map[string]string{}
	for part := range partitions {
		for i := range perBatch {
			id := fmt.Sprintf("%sp%d-e%d/%s", p, part, i, workflows.EventEnrollmentConfirmed)
			ids = append(ids, id)
			student[id] = fmt.Sprintf("s%d-%d", part, i)
			m := eventRecord(p+"enrollments", int64(i), id, student[id])
			m.Partition = int32(part)
			batches[part] = append(batches[part], m)
		}
	}
	concurrently(partitions, func(part int) {
		s, err := applyBatch(t, c, batches[part])
		if err != nil {
			t.Errorf("partition %d: apply: %v", part, err)
			return
		}
		if len(s.marked) != 1 || s.marked[0] != perBatch-1 {
			t.Errorf("partition %d: marked %v, want [%d]", part, s.marked, perBatch-1)
		}
	})
	assertOneRowEach(t, db, ids)
	for _, id := range ids {
		if n := hook.count(id); n != 1 {
			t.Errorf("event %s sent %d times, want once", id, n)
		}
	}
	rows, err := db.Query(context.Background(), `SELECT event_id, recipient FROM notifications WHERE event_id = ANY($1)`, ids)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id, recipient string
		if err := rows.Scan(&id, &recipient); err != nil {
			t.Fatal(err)
		}
		if recipient != student[id] {
			t.Errorf("event %s recorded for %q, want %q", id, recipient, student[id])
		}
	}
	hook.mu.Lock()
	requests := hook.requests
	hook.mu.Unlock()
	if requests >= partitions {
		t.Errorf("%d webhook requests for %d partitions' batches arriving at once, want them shared", requests, partitions)
	}
	t.Logf("%d partitions' batches in %d webhook requests", partitions, requests)
}

// The sink's insert is the dedupe record: the same notifications written
// again, one after the other and from several writers at once, leave one row
// each and no error, and the first write's row stays.
func TestSinkRecordIsIdempotent(t *testing.T) {
	db, p := testDB(t)
	ctx := context.Background()
	sink := &Sink{DB: db}
	var ns []notification
	var ids []string
	for i := range 8 {
		id := fmt.Sprintf("%se%d/x", p, i)
		ids = append(ids, id)
		n, err := newNotification(kafka.ParseEvent(eventRecord(p+"topic", int64(i), id, "s")))
		if err != nil {
			t.Fatal(err)
		}
		ns = append(ns, n)
	}
	if err := sink.record(ctx, ns[:3], pathConsumer); err != nil {
		t.Fatal(err)
	}
	concurrently(6, func(i int) {
		path := pathConsumer
		if i%2 == 1 {
			path = pathWorkflow
		}
		if err := sink.record(ctx, ns, path); err != nil {
			t.Errorf("record again: %v", err)
		}
	})
	if err := sink.record(ctx, ns, pathWorkflow); err != nil {
		t.Fatalf("record once more: %v", err)
	}
	assertOneRowEach(t, db, ids)
	var consumerRows int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM notifications WHERE event_id = ANY($1) AND path = 'consumer'`, ids[:3]).Scan(&consumerRows); err != nil {
		t.Fatal(err)
	}
	if consumerRows != 3 {
		t.Errorf("%d of the 3 first-written rows kept their path, want 3", consumerRows)
	}
}

// The durable path delivers an event once: an event the consumer delivered
// is not sent again, and a retried or concurrent DeliverNotification of a
// new event leaves one row, the later attempts answering AlreadyDone
// without a webhook call.
func TestDeliverNotificationOnce(t *testing.T) {
	db, p := testDB(t)
	hook := newWebhookCounter(t)
	a := testActivities(t, db)
	a.Sink = &Sink{DB: db, WebhookURL: hook.URL}
	deliver := func(ev workflows.ConsumedEvent) (workflows.DeliverNotificationResult, error) {
		var res workflows.DeliverNotificationResult
		env := (&testsuite.WorkflowTestSuite{}).NewTestActivityEnvironment()
		env.RegisterActivity(a.DeliverNotification)
		v, err := env.ExecuteActivity(a.DeliverNotification, workflows.DeliverNotificationInput{Event: ev})
		if err != nil {
			return res, err
		}
		return res, v.Get(&res)
	}

	// Delivered by the consumer first.
	done := p + "done/" + workflows.EventEnrollmentConfirmed
	c := testConsumer(t, db, hook.URL)
	if _, err := applyBatch(t, c, []*sarama.ConsumerMessage{eventRecord(p+"topic", 0, done, "s1")}); err != nil {
		t.Fatal(err)
	}
	res, err := deliver(kafka.ParseEvent(eventRecord(p+"topic", 0, done, "s1")))
	if err != nil {
		t.Fatal(err)
	}
	if !res.AlreadyDone || hook.count(done) != 1 {
		t.Errorf("delivering an event the consumer delivered: AlreadyDone %v, webhook got it %d times; want true, 1",
			res.AlreadyDone, hook.count(done))
	}

	// New: delivered by several attempts at once, then retried.
	fresh := p + "fresh/" + workflows.EventEnrollmentConfirmed
	ev := kafka.ParseEvent(eventRecord(p+"topic", 1, fresh, "s2"))
	concurrently(4, func(int) {
		if _, err := deliver(ev); err != nil {
			t.Errorf("deliver: %v", err)
		}
	})
	sent := hook.count(fresh)
	res, err = deliver(ev)
	if err != nil {
		t.Fatal(err)
	}
	if !res.AlreadyDone || hook.count(fresh) != sent {
		t.Errorf("a retry after the delivery: AlreadyDone %v, webhook sends %d → %d; want true and no new send",
			res.AlreadyDone, sent, hook.count(fresh))
	}
	assertOneRowEach(t, db, []string{done, fresh})
}
