package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/claimflow/claimflow/internal/kafka"
)

// relay publishes the peer's outbox. Each goroutine claims a batch of unsent
// rows with FOR UPDATE SKIP LOCKED, sends them with the acks=all idempotent
// SyncProducer, and in the same transaction stamps the sent rows and their
// enrollments (published_at, then status confirmed with confirmed_at). A
// crash between the ack and the commit sends the batch again with the same
// event IDs: at-least-once, deduplicated downstream on event_id, exactly
// like claimflow's publish activity.
type relay struct {
	db       *pgxpool.Pool
	producer sarama.SyncProducer
	log      *slog.Logger
	batch    int
	poll     time.Duration
	cancel   context.CancelFunc
	wg       sync.WaitGroup
}

func startRelay(o PeerOptions) (*relay, error) {
	kcfg := o.Kafka // its brokers, version, TLS and SASL
	kcfg.ClientID = "claimflow-bench-peer-relay"
	producer, err := kafka.NewProducer(kcfg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &relay{db: o.DB, producer: producer, log: o.Log, batch: o.Batch, poll: o.Poll, cancel: cancel}
	for range o.Relays {
		r.wg.Go(func() { r.loop(ctx) })
	}
	return r, nil
}

// Stop ends the relay after its current batch.
func (r *relay) Stop() {
	r.cancel()
	r.wg.Wait()
	_ = r.producer.Close()
}

func (r *relay) loop(ctx context.Context) {
	backoff := time.Duration(0)
	for ctx.Err() == nil {
		n, err := r.once(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			// The user's backoff: 1 s, 2 s, 4 s, then stay at 4 s; the rows
			// stay in the outbox until Kafka takes them.
			backoff = min(max(2*backoff, time.Second), 4*time.Second)
			r.log.Warn("peer relay batch failed; retrying", "error", err, "in", backoff)
			sleepCtx(ctx, backoff)
		case n == 0:
			backoff = 0
			sleepCtx(ctx, r.poll)
		default:
			backoff = 0
		}
	}
}

type outboxRow struct {
	id           int64
	eventID      string
	enrollmentID string
	topic        string
	key          string
	payload      []byte
}

// once relays one batch and returns how many rows it marked sent.
func (r *relay) once(ctx context.Context) (int, error) {
	sent := 0
	err := pgx.BeginFunc(ctx, r.db, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT id, event_id, enrollment_id, topic, message_key, payload::text
			FROM peer_outbox WHERE published_at IS NULL ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED`, r.batch)
		if err != nil {
			return err
		}
		batch, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (outboxRow, error) {
			var o outboxRow
			var payload string
			err := row.Scan(&o.id, &o.eventID, &o.enrollmentID, &o.topic, &o.key, &payload)
			o.payload = []byte(payload)
			return o, err
		})
		if err != nil || len(batch) == 0 {
			return err
		}
		msgs := make([]*sarama.ProducerMessage, len(batch))
		for i, o := range batch {
			msgs[i] = &sarama.ProducerMessage{
				Topic: o.topic,
				Key:   sarama.StringEncoder(o.key),
				Value: sarama.ByteEncoder(o.payload),
				Headers: []sarama.RecordHeader{
					{Key: []byte("event_id"), Value: []byte(o.eventID)},
					{Key: []byte("type"), Value: []byte("enrollment.confirmed")},
				},
				Metadata: i,
			}
		}
		failed := map[int]bool{}
		var sendErr error
		if err := r.producer.SendMessages(msgs); err != nil {
			var perrs sarama.ProducerErrors
			if !errors.As(err, &perrs) {
				return fmt.Errorf("publish outbox batch: %w", err)
			}
			for _, pe := range perrs {
				failed[pe.Msg.Metadata.(int)] = true
			}
			sendErr = fmt.Errorf("publish outbox batch: %d of %d failed: %w", len(perrs), len(batch), perrs[0].Err)
		}
		var ids []int64
		var enrollments []string
		for i, o := range batch {
			if !failed[i] {
				ids = append(ids, o.id)
				enrollments = append(enrollments, o.enrollmentID)
			}
		}
		if len(ids) > 0 {
			if _, err := tx.Exec(ctx, `UPDATE peer_outbox SET published_at = clock_timestamp() WHERE id = ANY($1)`, ids); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `UPDATE peer_enrollments SET published_at = clock_timestamp() WHERE id = ANY($1)`, enrollments); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `UPDATE peer_enrollments SET status = 'confirmed', confirmed_at = clock_timestamp()
				WHERE id = ANY($1) AND status = 'reserved'`, enrollments); err != nil {
				return err
			}
		}
		sent = len(ids)
		// Commit what was sent even when part of the batch failed; the
		// failed rows stay unsent and come back in a later batch.
		if sendErr != nil {
			r.log.Warn("peer relay: part of a batch failed", "error", sendErr)
		}
		return nil
	})
	return sent, err
}
