package consumer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"

	"github.com/claimflow/claimflow/internal/tracing"
	"github.com/claimflow/claimflow/workflows"
)

// Sink delivers the notification of a consumed event: first, when WebhookURL
// is set, a POST to the webhook; then a row in notifications. The row is
// written only once the webhook accepted, so a row means "delivered", and it
// is the record every later redelivery of the event is checked against. The
// webhook gets each event ID as its idempotency key: a crash between its
// answer and the row sends the event to it once more, and it must dedupe.
type Sink struct {
	DB *pgxpool.Pool
	// WebhookURL receives notifications in batches (see WebhookRequest).
	WebhookURL string
	// Client calls the webhook; nil means a client with a 10 s timeout.
	Client *http.Client
}

// WebhookRequest is the body POSTed to NOTIFY_WEBHOOK_URL. Notifications
// are in offset order per partition; the receiver answers 2xx with a
// WebhookResponse (or an empty body, meaning all were accepted). Any other
// status fails the whole batch.
type WebhookRequest struct {
	Notifications []WebhookNotification `json:"notifications"`
}

type WebhookNotification struct {
	// EventID is the idempotency key: the same event may be sent again.
	EventID    string          `json:"event_id"`
	EventType  string          `json:"event_type"`
	Recipient  string          `json:"recipient,omitempty"`
	Topic      string          `json:"topic"`
	Key        string          `json:"key"`
	OccurredAt *time.Time      `json:"occurred_at,omitempty"`
	Event      json.RawMessage `json:"event"`
}

// WebhookResponse says per event whether it was taken. An event the answer
// does not mention counts as not delivered.
type WebhookResponse struct {
	Results []WebhookResult `json:"results"`
}

type WebhookResult struct {
	EventID string `json:"event_id"`
	// Status is accepted, duplicate (accepted before; fine) or rejected.
	Status string `json:"status"`
	Error  string `json:"error,omitempty"`
}

const (
	WebhookAccepted  = "accepted"
	WebhookDuplicate = "duplicate"
	WebhookRejected  = "rejected"
)

// Notification paths, as stored in notifications.path.
const (
	pathConsumer = "consumer"
	pathWorkflow = "workflow"
)

// notification is one event ready for the sink.
type notification struct {
	ev         workflows.ConsumedEvent
	recipient  string
	occurredAt *time.Time
	payload    json.RawMessage
	attempts   int
}

// envelope is the part of workflows.Event a notification needs; Data is kept
// generic because coupon events name their user differently.
type envelope struct {
	ID         string          `json:"event_id"`
	Type       string          `json:"type"`
	OccurredAt *time.Time      `json:"occurred_at"`
	Data       json.RawMessage `json:"data"`
}

// newNotification builds the notification of a well-formed event.
func newNotification(ev workflows.ConsumedEvent) (notification, error) {
	if ev.Malformed != "" {
		return notification{}, fmt.Errorf("event %s at %s/%d@%d: %s", ev.EventID, ev.Topic, ev.Partition, ev.Offset, ev.Malformed)
	}
	var env envelope
	if err := json.Unmarshal([]byte(ev.Value), &env); err != nil {
		return notification{}, fmt.Errorf("decode event %s: %w", ev.EventID, err)
	}
	// Enrollment events name a student, coupon events a user. Only these
	// two fields are decoded: the rest of data stays in the payload.
	var data struct {
		StudentID any `json:"student_id"`
		UserID    any `json:"user_id"`
	}
	_ = json.Unmarshal(env.Data, &data) // data is optional; a notification may name nobody
	n := notification{ev: ev, occurredAt: env.OccurredAt, payload: json.RawMessage(ev.Value), attempts: 1}
	for _, v := range []any{data.StudentID, data.UserID} {
		if s, ok := v.(string); ok && s != "" {
			n.recipient = s
			break
		}
	}
	return n, nil
}

func (s *Sink) client() *http.Client {
	if s.Client != nil {
		return s.Client
	}
	return defaultWebhookClient
}

// defaultWebhookClient traces its calls while tracing is on (the
// transport decides per call).
var defaultWebhookClient = &http.Client{
	Timeout:   10 * time.Second,
	Transport: tracing.Transport(&http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second}),
}

// Where an event stands before the consumer applies it.
const (
	eventDelivered = "delivered"
	eventDiscarded = "discarded"
	// eventParked: an open consume dead letter. Its DeliverEvent run owns
	// the event until an operator decides, so the consumer does not try it
	// inline again.
	eventParked = "parked"
)

// standing returns, for the events that are not new, where they stand:
// delivered already, discarded by an operator (a discarded event must stay
// undelivered however often Kafka brings it back), or parked.
func (s *Sink) standing(ctx context.Context, ids []string) (map[string]string, error) {
	rows, err := s.DB.Query(ctx, `
		SELECT event_id, 'delivered' FROM notifications WHERE event_id = ANY($1)
		UNION ALL
		SELECT event_id, CASE WHEN status = 'discarded' THEN 'discarded' ELSE 'parked' END
		FROM dead_letters WHERE stage = 'consume' AND status IN ('open', 'retrying', 'discarded') AND event_id = ANY($1)`, ids)
	if err != nil {
		return nil, fmt.Errorf("look up delivered notifications: %w", err)
	}
	defer rows.Close()
	out := make(map[string]string)
	for rows.Next() {
		var id, st string
		if err := rows.Scan(&id, &st); err != nil {
			return nil, fmt.Errorf("look up delivered notifications: %w", err)
		}
		// A delivered row wins over a dead letter not yet resolved.
		if out[id] != eventDelivered {
			out[id] = st
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("look up delivered notifications: %w", err)
	}
	return out, nil
}

// push sends notifications to the webhook and returns, per notification,
// nil when the webhook took it or why not. Without a webhook every
// notification is taken.
func (s *Sink) push(ctx context.Context, ns []notification) []error {
	errs := make([]error, len(ns))
	if s.WebhookURL == "" || len(ns) == 0 {
		return errs
	}
	fail := func(err error) []error {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	req := WebhookRequest{Notifications: make([]WebhookNotification, len(ns))}
	for i, n := range ns {
		req.Notifications[i] = WebhookNotification{EventID: n.ev.EventID, EventType: n.ev.EventType, Recipient: n.recipient,
			Topic: n.ev.Topic, Key: n.ev.Key, OccurredAt: n.occurredAt, Event: n.payload}
	}
	body, err := json.Marshal(req)
	if err != nil {
		return fail(fmt.Errorf("encode webhook request: %w", err))
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, s.WebhookURL, bytes.NewReader(body))
	if err != nil {
		return fail(fmt.Errorf("webhook request: %w", err))
	}
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := s.client().Do(hreq)
	if err != nil {
		return fail(fmt.Errorf("notification webhook: %w", err))
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fail(fmt.Errorf("read webhook answer: %w", err))
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fail(fmt.Errorf("notification webhook answered %s: %s", resp.Status, snippet(raw)))
	}
	if len(bytes.TrimSpace(raw)) == 0 {
		return errs
	}
	var answer WebhookResponse
	if err := json.Unmarshal(raw, &answer); err != nil {
		return fail(fmt.Errorf("notification webhook answered %s with a body that is not a WebhookResponse: %w", resp.Status, err))
	}
	results := make(map[string]WebhookResult, len(answer.Results))
	for _, r := range answer.Results {
		results[r.EventID] = r
	}
	for i, n := range ns {
		r, ok := results[n.ev.EventID]
		switch {
		case !ok:
			errs[i] = fmt.Errorf("notification webhook did not answer for event %s", n.ev.EventID)
		case r.Status == WebhookAccepted || r.Status == WebhookDuplicate:
		default:
			errs[i] = fmt.Errorf("notification webhook %s event %s: %s", r.Status, n.ev.EventID, r.Error)
		}
	}
	return errs
}

func snippet(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// record writes delivered notifications in one statement, in the order
// given, so that seq follows offsets within a batch. A notification that is
// already there is left alone.
func (s *Sink) record(ctx context.Context, ns []notification, path string) error {
	if len(ns) == 0 {
		return nil
	}
	n := len(ns)
	var (
		ids, types, topics, keys, payloads = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		recipients                         = make([]pgtype.Text, n)
		partitions                         = make([]int32, n)
		offsets                            = make([]int64, n)
		occurred                           = make([]pgtype.Timestamptz, n)
		attempts                           = make([]int32, n)
	)
	for i, x := range ns {
		ids[i], types[i], topics[i], keys[i], payloads[i] = x.ev.EventID, x.ev.EventType, x.ev.Topic, x.ev.Key, string(x.payload)
		recipients[i] = pgtype.Text{String: x.recipient, Valid: x.recipient != ""}
		partitions[i], offsets[i] = x.ev.Partition, x.ev.Offset
		if x.occurredAt != nil {
			occurred[i] = pgtype.Timestamptz{Time: *x.occurredAt, Valid: true}
		}
		attempts[i] = int32(x.attempts)
	}
	_, err := s.DB.Exec(ctx, `
		INSERT INTO notifications (event_id, event_type, recipient, topic, kafka_partition, kafka_offset,
			message_key, payload, occurred_at, path, attempts)
		SELECT u.event_id, u.event_type, u.recipient, u.topic, u.kafka_partition, u.kafka_offset,
			u.message_key, u.payload::jsonb, u.occurred_at, $10, u.attempts
		FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int[], $6::bigint[], $7::text[], $8::text[],
			$9::timestamptz[], $11::int[])
			WITH ORDINALITY AS u(event_id, event_type, recipient, topic, kafka_partition, kafka_offset, message_key, payload,
				occurred_at, attempts, ord)
		ORDER BY u.ord
		ON CONFLICT (event_id) DO NOTHING`,
		ids, types, recipients, topics, partitions, offsets, keys, payloads, occurred, path, attempts)
	if err != nil {
		return fmt.Errorf("record %d notifications: %w", n, err)
	}
	return nil
}

// Producer is the part of a Kafka producer the dead-letter copy uses.
type Producer interface {
	SendMessage(msg *sarama.ProducerMessage) (partition int32, offset int64, err error)
}

// Activities are the DeliverEvent workflow's activities: the durable path
// of a notification whose inline attempt failed. The worker registers them
// next to the sagas' activities.
type Activities struct {
	DB *pgxpool.Pool
	// Producer copies dead letters to <topic>.DLT; nil skips the copy.
	Producer Producer
	Log      *slog.Logger
	// Sink delivers notifications; nil means the notifications table alone.
	Sink *Sink
}

// sink is the configured sink, or the notifications table alone.
func (a *Activities) sink() *Sink {
	if a.Sink != nil {
		return a.Sink
	}
	return &Sink{DB: a.DB}
}

// DeliverNotification is the durable path's attempt at one event: the same
// effect as the consumer's inline attempt, for a single event. It is a no-op
// for an event delivered (or discarded) meanwhile.
func (a *Activities) DeliverNotification(ctx context.Context, in workflows.DeliverNotificationInput) (workflows.DeliverNotificationResult, error) {
	var res workflows.DeliverNotificationResult
	n, err := newNotification(in.Event)
	if err != nil {
		// No attempt can turn a malformed event into a notification.
		return res, temporal.NewNonRetryableApplicationError(err.Error(), "malformed_event", nil)
	}
	sink := a.sink()
	standing, err := sink.standing(ctx, []string{in.Event.EventID})
	if err != nil {
		return res, err
	}
	// Parked is this run's own dead letter: the operator asked to retry.
	if st := standing[in.Event.EventID]; st == eventDelivered || st == eventDiscarded {
		res.AlreadyDone = true
		return res, nil
	}
	n.attempts = in.PriorAttempts + int(activity.GetInfo(ctx).Attempt)
	if err := sink.push(ctx, []notification{n})[0]; err != nil {
		return res, err
	}
	if err := sink.record(ctx, []notification{n}, pathWorkflow); err != nil {
		if isDataError(err) {
			// Postgres will refuse this row however often it is asked.
			return res, temporal.NewNonRetryableApplicationError(err.Error(), "unstorable_event", err)
		}
		return res, err
	}
	// A dead letter left open by an earlier run of this event (one an
	// operator terminated) is settled too; this run resolves its own.
	if _, err := a.DB.Exec(ctx, `
		UPDATE dead_letters SET status = 'resolved', updated_at = now()
		WHERE stage = 'consume' AND event_id = $1 AND status IN ('open', 'retrying') AND run_id <> $2`,
		in.Event.EventID, activity.GetInfo(ctx).WorkflowExecution.RunID); err != nil {
		return res, fmt.Errorf("settle earlier dead letters of %s: %w", in.Event.EventID, err)
	}
	res.Attempts = n.attempts
	return res, nil
}

// RecordConsumeDeadLetter parks an event whose notification exhausted its
// retries: a dead_letters row (stage consume) the operator lists and acts on
// through the API, and a best-effort copy of the original record on
// <topic>.DLT with the error, for tools that watch Kafka.
func (a *Activities) RecordConsumeDeadLetter(ctx context.Context, in workflows.ConsumeDeadLetterInput) (workflows.DeadLetterRecord, error) {
	var rec workflows.DeadLetterRecord
	payload := []byte(in.Event.Value)
	if !json.Valid(payload) {
		// Keep an unreadable record inspectable as a JSON string.
		b, err := json.Marshal(in.Event.Value)
		if err != nil {
			return rec, fmt.Errorf("encode record of %s: %w", in.Event.EventID, err)
		}
		payload = b
	}
	insert := func(payload []byte) error {
		return a.DB.QueryRow(ctx, `
			INSERT INTO dead_letters (event_id, stage, event_type, topic, message_key, payload, workflow_id, run_id, error, rounds, status)
			VALUES ($1, 'consume', $2, $3, $4, $5, $6, $7, $8, $9, 'open')
			ON CONFLICT (event_id, stage) DO UPDATE SET
				status = 'open', error = EXCLUDED.error, workflow_id = EXCLUDED.workflow_id, run_id = EXCLUDED.run_id,
				rounds = GREATEST(dead_letters.rounds, EXCLUDED.rounds), updated_at = now()
			RETURNING id, rounds`,
			in.Event.EventID, in.Event.EventType, in.Event.Topic, in.Event.Key, payload,
			in.WorkflowID, in.RunID, in.Error, in.Round).Scan(&rec.ID, &rec.Round)
	}
	err := insert(payload)
	if isDataError(err) {
		// jsonb refuses what was on the topic (a NUL escape, typically):
		// park it as a string without NULs rather than not at all.
		b, merr := json.Marshal(strings.ReplaceAll(in.Event.Value, "\x00", ""))
		if merr == nil {
			err = insert(b)
		}
	}
	if err != nil {
		return rec, fmt.Errorf("insert dead letter for %s: %w", in.Event.EventID, err)
	}
	if err := a.copyToDLT(in, rec.ID); err != nil {
		// The row is the record of truth; the copy is for Kafka-side tooling.
		a.Log.Warn("dead letter not copied to topic", "topic", in.Event.Topic+".DLT", "event_id", in.Event.EventID,
			"workflow_id", in.WorkflowID, "error", err)
	}
	return rec, nil
}

// copyToDLT sends the original record, untouched, with headers naming where
// it came from and why it was parked.
func (a *Activities) copyToDLT(in workflows.ConsumeDeadLetterInput, id int64) error {
	if a.Producer == nil {
		return errors.New("no Kafka producer")
	}
	ev := in.Event
	_, _, err := a.Producer.SendMessage(&sarama.ProducerMessage{
		Topic: ev.Topic + ".DLT",
		Key:   sarama.StringEncoder(ev.Key),
		Value: sarama.StringEncoder(ev.Value),
		Headers: []sarama.RecordHeader{
			{Key: []byte("event_id"), Value: []byte(ev.EventID)},
			{Key: []byte("dead_letter_id"), Value: fmt.Appendf(nil, "%d", id)},
			{Key: []byte("error"), Value: []byte(in.Error)},
			{Key: []byte("stage"), Value: []byte("consume")},
			{Key: []byte("original_topic"), Value: []byte(ev.Topic)},
			{Key: []byte("original_partition"), Value: fmt.Appendf(nil, "%d", ev.Partition)},
			{Key: []byte("original_offset"), Value: fmt.Appendf(nil, "%d", ev.Offset)},
		},
	})
	return err
}
