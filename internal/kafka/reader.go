package kafka

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/IBM/sarama"

	"github.com/claimflow/claimflow/workflows"
)

// Partition is what ScanTopics read of one partition: its oldest kept
// offset when the read began, and what keep made of each record from there
// to the end.
type Partition[T any] struct {
	Topic     string
	Partition int32
	Oldest    int64
	Records   []T
}

// ScanTopics reads every record of topics, from the oldest kept to the end
// as it was when the call began, keeping what keep makes of each (keep may
// run on several partitions at once). Topics that do not exist are
// returned as missing rather than failing the read.
//
// A connection the client lost mid-read (sarama.ErrNotConnected, seen
// under a loaded CI machine even after offsetOf's own retries) fails the
// whole read; the read has no effects, so it starts over with a new
// client, three times at most.
func ScanTopics[T any](ctx context.Context, cfg Config, topics []string, keep func(*sarama.ConsumerMessage) T) ([]Partition[T], []string, error) {
	for attempt := 1; ; attempt++ {
		parts, missing, err := scanTopicsOnce(ctx, cfg, topics, keep)
		if err == nil || !errors.Is(err, sarama.ErrNotConnected) || attempt == 3 {
			return parts, missing, err
		}
		select {
		case <-ctx.Done():
			return parts, missing, err
		case <-time.After(time.Duration(attempt) * time.Second):
		}
	}
}

func scanTopicsOnce[T any](ctx context.Context, cfg Config, topics []string, keep func(*sarama.ConsumerMessage) T) (parts []Partition[T], missing []string, err error) {
	sc, err := SaramaConfig(cfg)
	if err != nil {
		return nil, nil, err
	}
	c, err := sarama.NewClient(cfg.Brokers, sc)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to Kafka %v: %w", cfg.Brokers, Explain(cfg, sc, err))
	}
	defer c.Close()
	known, err := c.Topics()
	if err != nil {
		return nil, nil, fmt.Errorf("list topics: %w", err)
	}
	consumer, err := sarama.NewConsumerFromClient(c)
	if err != nil {
		return nil, nil, fmt.Errorf("open Kafka consumer: %w", err)
	}
	defer consumer.Close()

	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		errs []error
	)
	for _, topic := range topics {
		if !slices.Contains(known, topic) {
			missing = append(missing, topic)
			continue
		}
		partitions, err := c.Partitions(topic)
		if err != nil {
			return nil, missing, fmt.Errorf("partitions of %s: %w", topic, err)
		}
		for _, p := range partitions {
			wg.Go(func() {
				part, err := readPartition(ctx, c, consumer, topic, p, keep)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
					return
				}
				parts = append(parts, part)
			})
		}
	}
	wg.Wait()
	return parts, missing, errors.Join(errs...)
}

// ReadTopics reads every record of topics as ScanTopics does and
// identifies each as the consumer does (Value is dropped to keep memory
// small).
func ReadTopics(ctx context.Context, cfg Config, topics []string) (records []workflows.ConsumedEvent, missing []string, err error) {
	parts, missing, err := ScanTopics(ctx, cfg, topics, func(m *sarama.ConsumerMessage) workflows.ConsumedEvent {
		ev := ParseEvent(m)
		ev.Value = ""
		return ev
	})
	for _, p := range parts {
		records = append(records, p.Records...)
	}
	return records, missing, err
}

// offsetOf asks for one end of a partition. A fresh client connects to the
// leader lazily, and when many partitions ask at once while that connection
// is being (re)opened some are told "broker not connected" (seen once in CI
// on all twelve partitions); a short retry rides that out.
func offsetOf(ctx context.Context, c sarama.Client, topic string, p int32, which int64) (int64, error) {
	for attempt := 1; ; attempt++ {
		off, err := c.GetOffset(topic, p, which)
		if !errors.Is(err, sarama.ErrNotConnected) || attempt == 5 {
			return off, err
		}
		select {
		case <-ctx.Done():
			return off, err
		case <-time.After(time.Duration(attempt) * 100 * time.Millisecond):
		}
	}
}

func readPartition[T any](ctx context.Context, c sarama.Client, consumer sarama.Consumer, topic string, p int32, keep func(*sarama.ConsumerMessage) T) (Partition[T], error) {
	part := Partition[T]{Topic: topic, Partition: p}
	newest, err := offsetOf(ctx, c, topic, p, sarama.OffsetNewest)
	if err != nil {
		return part, fmt.Errorf("end of %s/%d: %w", topic, p, err)
	}
	if part.Oldest, err = offsetOf(ctx, c, topic, p, sarama.OffsetOldest); err != nil {
		return part, fmt.Errorf("start of %s/%d: %w", topic, p, err)
	}
	if newest <= part.Oldest {
		return part, nil
	}
	pc, err := consumer.ConsumePartition(topic, p, part.Oldest)
	if err != nil {
		return part, fmt.Errorf("read %s/%d: %w", topic, p, err)
	}
	defer pc.Close()
	part.Records = make([]T, 0, newest-part.Oldest)
	for {
		select {
		case <-ctx.Done():
			return part, ctx.Err()
		case m := <-pc.Messages():
			part.Records = append(part.Records, keep(m))
			if m.Offset >= newest-1 {
				return part, nil
			}
		case err := <-pc.Errors():
			return part, fmt.Errorf("read %s/%d: %w", topic, p, err)
		}
	}
}

// CommittedOffsets returns, per topic and partition, the next offset the
// group will read (-1 when it has committed nothing there).
func CommittedOffsets(cfg Config, group string, topics map[string][]int32) (map[string]map[int32]int64, error) {
	sc, err := SaramaConfig(cfg)
	if err != nil {
		return nil, err
	}
	admin, err := sarama.NewClusterAdmin(cfg.Brokers, sc)
	if err != nil {
		return nil, fmt.Errorf("connect admin to Kafka %v: %w", cfg.Brokers, Explain(cfg, sc, err))
	}
	defer admin.Close()
	resp, err := admin.ListConsumerGroupOffsets(group, topics)
	if err != nil {
		return nil, fmt.Errorf("offsets of group %s: %w", group, err)
	}
	if resp.Err != sarama.ErrNoError {
		return nil, fmt.Errorf("offsets of group %s: %w", group, resp.Err)
	}
	out := make(map[string]map[int32]int64, len(topics))
	for topic, parts := range topics {
		out[topic] = make(map[int32]int64, len(parts))
		for _, p := range parts {
			out[topic][p] = -1
			if b := resp.GetBlock(topic, p); b != nil && b.Err == sarama.ErrNoError {
				out[topic][p] = b.Offset
			}
		}
	}
	return out, nil
}

// ParseEvent identifies a consumed record. It never fails: a record that is
// not an event still gets an ID (its position) and a Malformed reason, so it
// can be dead-lettered, counted by the audit and deduplicated like any other.
func ParseEvent(m *sarama.ConsumerMessage) workflows.ConsumedEvent {
	ev := workflows.ConsumedEvent{
		Topic:     m.Topic,
		Partition: m.Partition,
		Offset:    m.Offset,
		Key:       string(m.Key),
		Value:     string(m.Value),
	}
	for _, h := range m.Headers {
		if h != nil && string(h.Key) == "event_id" {
			ev.EventID = string(h.Value)
		}
	}
	var env struct {
		ID   string `json:"event_id"`
		Type string `json:"type"`
	}
	if err := json.Unmarshal(m.Value, &env); err != nil {
		ev.Malformed = "value is not a JSON event: " + err.Error()
	} else {
		if env.ID != "" {
			ev.EventID = env.ID
		}
		ev.EventType = env.Type
		if env.Type == "" {
			ev.Malformed = "event has no type"
		}
	}
	if ev.EventID == "" {
		ev.EventID = fmt.Sprintf("%s/%d@%d", m.Topic, m.Partition, m.Offset)
		if ev.Malformed == "" {
			ev.Malformed = "event has no event_id"
		}
	}
	return ev
}
