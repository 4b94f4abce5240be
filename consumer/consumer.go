// Package consumer is the event consumer process: it reads the topics the
// workflows publish to in a consumer group and delivers each event's
// notification exactly once per event ID, handing the events whose inline
// attempt failed to DeliverEvent runs. Those runs call this package's
// Activities (DeliverNotification, RecordConsumeDeadLetter), which the
// worker registers.
package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgconn"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"

	"github.com/claimflow/claimflow/internal/config"
	"github.com/claimflow/claimflow/internal/kafka"
	"github.com/claimflow/claimflow/internal/tracing"
	"github.com/claimflow/claimflow/workflows"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// WorkflowStarter is the part of the Temporal client the consumer uses.
type WorkflowStarter interface {
	ExecuteWorkflow(ctx context.Context, options client.StartWorkflowOptions, workflow any, args ...any) (client.WorkflowRun, error)
}

// Config wires a Consumer.
type Config struct {
	Kafka kafka.Config
	// EventKey verifies each record's signature (kafka.Verify): a record
	// without a valid one is counted, logged and skipped, never notified.
	// Required.
	EventKey []byte
	// Group is the consumer group; its committed offsets are the consumer's
	// progress.
	Group  string
	Topics []string
	Sink   *Sink
	// Temporal starts DeliverEvent runs for events whose inline attempt failed.
	Temporal WorkflowStarter
	Log      *slog.Logger
	// MaxBatch bounds the records of one partition applied together; 0
	// means config.DefaultConsumerBatch.
	MaxBatch int
	// DrainTimeout bounds how long a batch in flight may still take once a
	// rebalance or shutdown began; what is not durable by then stays
	// uncommitted. 0 means 20 s, below sarama's 60 s rebalance timeout.
	DrainTimeout time.Duration
	// Metrics, when set, receives consumer lag and record counts.
	Metrics *Metrics
}

// Consumer reads events in a consumer group and applies each one's
// notification exactly once per event ID. Per partition it works in
// batches: look up which events are done already, deliver the rest, hand
// the failures to DeliverEvent runs, and only then mark the batch's last
// offset for commit. A batch that is cut short is never marked and is
// redelivered, and redelivery finds the finished part done.
type Consumer struct {
	cfg    Config
	log    *slog.Logger
	client sarama.Client
	group  sarama.ConsumerGroup
	stats  consumerCounters
	// The partitions' batches share their lookups, webhook requests and
	// notification INSERTs (see merger).
	standingOf *merger[string, map[string]string]
	pushOf     *merger[notification, []error]
	recordOf   *merger[notification, struct{}]
}

// Stats counts records since the consumer started.
type Stats struct {
	// Records read from the topics.
	Records int64
	// Delivered inline by the consumer.
	Delivered int64
	// Skipped: delivered or discarded before (a redelivery), or a second
	// copy of an event within one batch.
	Skipped int64
	// HandedOff to DeliverEvent runs after a failed inline attempt.
	HandedOff int64
	// Batches made durable and marked for commit.
	Batches int64
	// Rejected records: unsigned or badly signed, so not acted on.
	Rejected int64
}

type consumerCounters struct {
	records, delivered, skipped, handedOff, batches, rejected atomic.Int64
}

// New connects to Kafka; Run consumes.
func New(cfg Config) (*Consumer, error) {
	if cfg.Group == "" || len(cfg.Topics) == 0 {
		return nil, errors.New("consumer needs a group and at least one topic")
	}
	if cfg.Sink == nil || cfg.Sink.DB == nil || cfg.Temporal == nil {
		return nil, errors.New("consumer needs a sink with a database and a Temporal client")
	}
	if len(cfg.EventKey) == 0 {
		return nil, errors.New("consumer needs the event signing key (EVENT_SIGNING_KEY)")
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = config.DefaultConsumerBatch
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = 20 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	sc, err := kafka.SaramaConfig(cfg.Kafka)
	if err != nil {
		return nil, err
	}
	// A batch's last offset is marked only once the batch is durable, and
	// sarama commits only marked offsets: every second, and when a partition
	// is released (rebalance, shutdown). Committing on a timer rather than
	// after each batch keeps a round trip out of every batch; a crash then
	// redelivers up to a second of durable batches, which are skipped as done.
	sc.Consumer.Offsets.AutoCommit.Enable = true
	sc.Consumer.Offsets.AutoCommit.Interval = time.Second
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	sc.Consumer.Return.Errors = true
	// Cooperative rebalancing: a member joining or leaving moves only the
	// partitions that change owner; the others keep flowing.
	sc.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{sarama.NewBalanceStrategyCooperativeSticky()}
	sc.ChannelBufferSize = 2 * cfg.MaxBatch
	// A batch may hold the partition's channel for a webhook round trip; do
	// not let the fetcher give up on it that quickly.
	sc.Consumer.MaxProcessingTime = time.Second
	sc.Consumer.Fetch.Default = 4 << 20
	// Under load the broker answers a fetch once 256 KiB are there or 100
	// ms have passed, not at the first record: a partition's batch then
	// holds about 100 ms of its records instead of the few of one produce,
	// and each batch's look-up, webhook call and record cost that many
	// fewer round trips. At 2,000/s on `claimflow dev` it took Postgres
	// from 18 % of two cores to 14 % and this process from 34 % to 32 %
	// (docs/performance.md); a notification waits at most 100 ms more.
	sc.Consumer.Fetch.Min = 256 << 10
	sc.Consumer.MaxWaitTime = 100 * time.Millisecond
	c, err := sarama.NewClient(cfg.Kafka.Brokers, sc)
	if err != nil {
		return nil, fmt.Errorf("connect consumer to Kafka %v: %w", cfg.Kafka.Brokers, kafka.Explain(cfg.Kafka, sc, err))
	}
	g, err := sarama.NewConsumerGroupFromClient(cfg.Group, c)
	if err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("join consumer group %s: %w", cfg.Group, kafka.Explain(cfg.Kafka, sc, err))
	}
	return newConsumer(cfg, c, g), nil
}

// newConsumer is a Consumer whose partitions share the sink's round trips.
func newConsumer(cfg Config, c sarama.Client, g sarama.ConsumerGroup) *Consumer {
	sink := cfg.Sink
	return &Consumer{cfg: cfg, log: cfg.Log, client: c, group: g,
		standingOf: newMerger(cfg.MaxBatch, sink.standing),
		pushOf: newMerger(cfg.MaxBatch, func(ctx context.Context, ns []notification) ([]error, error) {
			return sink.push(ctx, ns), nil
		}),
		recordOf: newMerger(cfg.MaxBatch, func(ctx context.Context, ns []notification) (struct{}, error) {
			return struct{}{}, sink.record(ctx, ns, pathConsumer)
		}),
	}
}

// Stats returns the counters.
func (c *Consumer) Stats() Stats {
	return Stats{
		Records:   c.stats.records.Load(),
		Delivered: c.stats.delivered.Load(),
		Skipped:   c.stats.skipped.Load(),
		HandedOff: c.stats.handedOff.Load(),
		Batches:   c.stats.batches.Load(),
		Rejected:  c.stats.rejected.Load(),
	}
}

// Run consumes until ctx ends, then lets the batches in flight finish (or
// leaves them uncommitted), leaves the group and closes the connection. A
// session that Kafka ends by refusing the TLS or SASL settings ends Run
// with that error (a kafka.AuthError) rather than rejoining in vain.
func (c *Consumer) Run(ctx context.Context) error {
	defer func() {
		if err := c.group.Close(); err != nil {
			c.log.Warn("leave consumer group", "group", c.cfg.Group, "error", err)
		}
		if err := c.client.Close(); err != nil && !errors.Is(err, sarama.ErrClosedClient) {
			c.log.Warn("close Kafka client", "error", err)
		}
	}()
	go func() {
		for err := range c.group.Errors() {
			c.log.Warn("consumer group", "group", c.cfg.Group, "error", err)
		}
	}()
	go c.logProgress(ctx)

	h := &claimHandler{c: c}
	for ctx.Err() == nil {
		topics, missing := c.existingTopics()
		if len(topics) == 0 {
			c.log.Warn("none of the consumer's topics exist yet; waiting", "topics", c.cfg.Topics)
			if !sleepCtx(ctx, 5*time.Second) {
				break
			}
			continue
		}
		// A session on the topics that exist; one that appears later ends
		// the session so the next one includes it.
		sctx, cancel := context.WithCancel(ctx)
		if len(missing) > 0 {
			c.log.Warn("consumer topics missing; consuming the others until they appear", "missing", missing)
			go c.watchTopics(sctx, cancel, missing)
		}
		err := c.group.Consume(sctx, topics, h)
		cancel()
		if errors.Is(err, sarama.ErrClosedConsumerGroup) {
			break
		}
		if err != nil && ctx.Err() == nil {
			if err := kafka.Explain(c.cfg.Kafka, nil, err); kafka.IsAuthError(err) {
				// Rejoining with the same credentials cannot succeed.
				return fmt.Errorf("consumer group %s: %w", c.cfg.Group, err)
			}
			c.log.Warn("consumer session ended; rejoining", "group", c.cfg.Group, "error", err)
			if !sleepCtx(ctx, time.Second) {
				break
			}
		}
	}
	s := c.Stats()
	c.log.Info("consumer stopped", "group", c.cfg.Group, "records", s.Records, "delivered", s.Delivered,
		"skipped", s.Skipped, "handed_off", s.HandedOff)
	return nil
}

func (c *Consumer) existingTopics() (have, missing []string) {
	if err := c.client.RefreshMetadata(); err != nil {
		c.log.Warn("refresh Kafka metadata", "error", err)
	}
	known, err := c.client.Topics()
	if err != nil {
		// Let Consume report what is wrong.
		return c.cfg.Topics, nil
	}
	for _, t := range c.cfg.Topics {
		if slices.Contains(known, t) {
			have = append(have, t)
		} else {
			missing = append(missing, t)
		}
	}
	return have, missing
}

func (c *Consumer) watchTopics(ctx context.Context, restart context.CancelFunc, missing []string) {
	t := time.NewTicker(30 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := c.client.RefreshMetadata(missing...); err != nil {
			continue
		}
		known, err := c.client.Topics()
		if err != nil {
			continue
		}
		for _, m := range missing {
			if slices.Contains(known, m) {
				c.log.Info("consumer topic appeared; rejoining to include it", "topic", m)
				restart()
				return
			}
		}
	}
}

func (c *Consumer) logProgress(ctx context.Context) {
	t := time.NewTicker(30 * time.Second)
	defer t.Stop()
	last, lastAt := c.Stats(), time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			s := c.Stats()
			if s.Records == last.Records {
				continue
			}
			rate := float64(s.Records-last.Records) / now.Sub(lastAt).Seconds()
			c.log.Info("consumer progress", "records", s.Records, "delivered", s.Delivered, "skipped", s.Skipped,
				"handed_off", s.HandedOff, "records_per_s", int(rate))
			last, lastAt = s, now
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// claimHandler is the sarama group handler; each claim (partition) runs in
// its own goroutine and its batches run one after the other, so events of one
// key are applied in offset order.
type claimHandler struct {
	c *Consumer
}

func (h *claimHandler) Setup(s sarama.ConsumerGroupSession) error {
	h.c.log.Info("consumer partitions assigned", "group", h.c.cfg.Group, "generation", s.GenerationID(), "claims", s.Claims())
	return nil
}

func (h *claimHandler) Cleanup(s sarama.ConsumerGroupSession) error {
	h.c.log.Info("consumer partitions released", "group", h.c.cfg.Group, "generation", s.GenerationID())
	return nil
}

func (h *claimHandler) ConsumeClaim(s sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for {
		batch, open := nextBatch(s.Context(), claim.Messages(), h.c.cfg.MaxBatch)
		if len(batch) > 0 {
			if err := h.c.apply(s, batch); err != nil {
				// Not durable, so not committed: the partition's next owner
				// (or this consumer after it rejoins) gets the batch again.
				h.c.log.Warn("batch left uncommitted", "topic", claim.Topic(), "partition", claim.Partition(),
					"from_offset", batch[0].Offset, "records", len(batch), "error", err)
				return nil
			}
			h.c.cfg.Metrics.observeConsumed(claim.Topic(), claim.Partition(),
				claim.HighWaterMarkOffset()-batch[len(batch)-1].Offset-1, len(batch))
		}
		if !open {
			return nil
		}
	}
}

// nextBatch waits for one record, then takes whatever else is already
// buffered, up to max. It reports false once the claim ends (revoked or the
// session is over); records still buffered then are left to the next owner.
func nextBatch(ctx context.Context, msgs <-chan *sarama.ConsumerMessage, max int) ([]*sarama.ConsumerMessage, bool) {
	select {
	case <-ctx.Done():
		return nil, false
	case m, ok := <-msgs:
		if !ok {
			return nil, false
		}
		batch := []*sarama.ConsumerMessage{m}
		for len(batch) < max {
			select {
			case m, ok := <-msgs:
				if !ok {
					return batch, false
				}
				batch = append(batch, m)
			default:
				return batch, true
			}
		}
		return batch, true
	}
}

// handoff is an event whose inline attempt failed.
type handoff struct {
	ev  workflows.ConsumedEvent
	err string
}

// errSessionOver: the batch could not be made durable before the session
// (rebalance or shutdown) ended.
var errSessionOver = errors.New("consumer session ended before the batch was durable")

// apply makes one batch of one partition durable and marks it for commit.
// The batch runs to completion on its own context even when the session ends
// meanwhile (a rebalance or SIGTERM), so nothing is cut off half-way; only
// the retries of an unavailable Postgres or Temporal give up when it ends.
func (c *Consumer) apply(s sarama.ConsumerGroupSession, batch []*sarama.ConsumerMessage) error {
	stop := s.Context().Done()
	ctx, cancel := context.WithCancel(context.WithoutCancel(s.Context()))
	defer cancel()
	// The watcher reads its own copy: ctx gains the batch's span below.
	done := ctx.Done()
	go func() {
		select {
		case <-done:
		case <-stop:
			// The session is over: give the batch DrainTimeout to finish.
			t := time.NewTimer(c.cfg.DrainTimeout)
			defer t.Stop()
			select {
			case <-done:
			case <-t.C:
				cancel()
			}
		}
	}()
	c.stats.records.Add(int64(len(batch)))

	// Each record continues the trace that produced it; the batch's span,
	// under which the lookups, the webhook call and the insert run, links
	// to them all.
	records := make([]trace.Span, len(batch))
	for i := range records {
		records[i] = trace.SpanFromContext(context.Background()) // no-op
	}
	if tracing.On() {
		links := make([]trace.Link, len(batch))
		for i, m := range batch {
			_, records[i] = tracing.Tracer().Start(tracing.Extract(ctx, m), "kafka.consume "+m.Topic, trace.WithSpanKind(trace.SpanKindConsumer),
				trace.WithAttributes(attribute.String("messaging.system", "kafka"), attribute.String("messaging.destination.name", m.Topic),
					attribute.Int("messaging.kafka.partition", int(m.Partition)), attribute.Int64("messaging.kafka.offset", m.Offset)))
			links[i] = trace.Link{SpanContext: records[i].SpanContext()}
		}
		defer func() {
			for _, sp := range records {
				sp.End()
			}
		}()
		var batchSpan trace.Span
		ctx, batchSpan = tracing.Tracer().Start(ctx, "consumer.batch", trace.WithLinks(links...),
			trace.WithAttributes(attribute.Int("claimflow.records", len(batch))))
		defer batchSpan.End()
	}

	// Identify the events; a second copy of an event within the batch (the
	// publisher's retry after a lost ack) is the same event.
	events := make([]workflows.ConsumedEvent, 0, len(batch))
	seen := make(map[string]bool, len(batch))
	for i, m := range batch {
		if err := kafka.Verify(c.cfg.EventKey, m); err != nil {
			records[i].SetStatus(codes.Error, err.Error())
			// Anyone who can write to the topic could have written it:
			// nothing it says is acted on.
			c.stats.rejected.Add(1)
			c.cfg.Metrics.observeRejected(m.Topic, err)
			c.log.Warn("record refused: not signed by a worker", "topic", m.Topic, "partition", m.Partition,
				"offset", m.Offset, "error", err)
			continue
		}
		ev := kafka.ParseEvent(m)
		if records[i].IsRecording() {
			records[i].SetAttributes(attribute.String("claimflow.event_id", ev.EventID), attribute.String("claimflow.event_type", ev.EventType))
		}
		if seen[ev.EventID] {
			c.stats.skipped.Add(1)
			continue
		}
		seen[ev.EventID] = true
		events = append(events, ev)
	}
	ids := make([]string, len(events))
	for i, ev := range events {
		ids[i] = ev.EventID
	}

	var standing map[string]string
	if err := c.retry(ctx, stop, "look up delivered events", func(ctx context.Context) (err error) {
		standing, _, err = c.standingOf.do(ctx, ids)
		return err
	}); err != nil {
		return err
	}
	var (
		todo     []notification
		handoffs []handoff
	)
	for _, ev := range events {
		switch standing[ev.EventID] {
		case eventDelivered, eventDiscarded:
			c.stats.skipped.Add(1)
			continue
		case eventParked:
			// Joins the run that waits for an operator (or restarts it, if
			// it was terminated); the operator's decision stands.
			handoffs = append(handoffs, handoff{ev: ev, err: "event is dead-lettered; its delivery run owns it"})
			continue
		}
		n, err := newNotification(ev)
		if err != nil {
			handoffs = append(handoffs, handoff{ev: ev, err: err.Error()})
			continue
		}
		todo = append(todo, n)
	}

	// The inline attempt: one webhook call for the batch. An event it does
	// not take leaves the line and goes to the durable path; the events
	// behind it go on.
	var delivered []notification
	for i, err := range c.push(ctx, todo) {
		if err != nil {
			handoffs = append(handoffs, handoff{ev: todo[i].ev, err: err.Error()})
			continue
		}
		delivered = append(delivered, todo[i])
	}
	rejected, err := c.record(ctx, stop, delivered)
	if err != nil {
		return err
	}
	handoffs = append(handoffs, rejected...)
	if err := c.handOff(ctx, stop, handoffs); err != nil {
		return err
	}

	// Everything up to the last record is delivered, skipped or owned by a
	// DeliverEvent run: the batch may be committed.
	s.MarkMessage(batch[len(batch)-1], "")
	c.stats.delivered.Add(int64(len(delivered) - len(rejected)))
	c.stats.handedOff.Add(int64(len(handoffs)))
	c.stats.batches.Add(1)
	return nil
}

// push is the inline webhook attempt of one batch, in a request it may share
// with other partitions' batches; it returns this batch's errors.
func (c *Consumer) push(ctx context.Context, ns []notification) []error {
	if len(ns) == 0 {
		return nil
	}
	errs, off, _ := c.pushOf.do(ctx, ns)
	return errs[off : off+len(ns)]
}

// record writes the delivered notifications. Postgres being unreachable is
// retried in place (it is the dedupe record: without it no event can be
// applied). A row Postgres refuses as data (say a NUL escape jsonb cannot
// hold) must not block the partition: the batch is then written row by row
// and a refused row goes to the durable path, which dead-letters it.
func (c *Consumer) record(ctx context.Context, stop <-chan struct{}, ns []notification) (rejected []handoff, err error) {
	if len(ns) == 0 {
		return nil, nil
	}
	err = c.retry(ctx, stop, "record notifications", func(ctx context.Context) error {
		_, _, err := c.recordOf.do(ctx, ns)
		if isDataError(err) {
			rejected = nil
			for _, n := range ns {
				if err := c.cfg.Sink.record(ctx, []notification{n}, pathConsumer); isDataError(err) {
					rejected = append(rejected, handoff{ev: n.ev, err: err.Error()})
				} else if err != nil {
					return err
				}
			}
			return nil
		}
		return err
	})
	return rejected, err
}

func isDataError(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "22")
}

// handOff starts a DeliverEvent run per failed event and returns once every
// start was acknowledged. The workflow ID is the event's, so a start for an
// event that already has a run (a redelivery) joins that run, and one whose
// run completed (delivered or discarded) starts nothing; a run that failed
// or was terminated may be started again.
func (c *Consumer) handOff(ctx context.Context, stop <-chan struct{}, hs []handoff) error {
	pending := hs
	return c.retry(ctx, stop, "hand failed events to Temporal", func(ctx context.Context) error {
		var (
			mu     sync.Mutex
			failed []handoff
			errs   []error
			wg     sync.WaitGroup
			sem    = make(chan struct{}, 32)
		)
		for _, h := range pending {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				_, err := c.cfg.Temporal.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
					ID:                       workflows.DeliverEventWorkflowID(h.ev.EventID),
					TaskQueue:                workflows.TaskQueue,
					WorkflowIDReusePolicy:    enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE_FAILED_ONLY,
					WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
				}, workflows.DeliverEvent, workflows.DeliverEventInput{Event: h.ev, InlineError: h.err})
				if err != nil {
					mu.Lock()
					failed = append(failed, h)
					errs = append(errs, fmt.Errorf("start delivery of %s: %w", h.ev.EventID, err))
					mu.Unlock()
					return
				}
				c.log.Debug("event handed to its delivery workflow", "event_id", h.ev.EventID, "error", h.err)
			})
		}
		wg.Wait()
		pending = failed
		return errors.Join(errs...)
	})
}

// retry runs fn until it succeeds, backing off up to 5 s. Once the session
// has ended (stop) it gives up instead of trying again, leaving the batch
// uncommitted.
func (c *Consumer) retry(ctx context.Context, stop <-chan struct{}, what string, fn func(context.Context) error) error {
	backoff := 100 * time.Millisecond
	for {
		// Bound each try, so that a hung connection becomes a retry.
		tctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		err := fn(tctx)
		cancel()
		if err == nil {
			return nil
		}
		c.log.Warn("consumer step failed; retrying", "step", what, "retry_in", backoff, "error", err)
		select {
		case <-stop:
			return fmt.Errorf("%w: %s: %w", errSessionOver, what, err)
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", what, err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}
