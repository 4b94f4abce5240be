package main

// Integration tests of the event consumer on the real stack: Temporal dev
// server, kfake (or Apache Kafka), Postgres, the worker that runs
// DeliverEvent, and the notification webhook simulator, whose failures are
// real failed HTTP calls. Each test writes to a topic of its own, so the
// stack's own consumer (on enrollment.events and coupon.events) does not
// interfere and counts are exact.

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/claimflow/claimflow/internal/kafka"

	"github.com/claimflow/claimflow/dev/audit"

	"github.com/IBM/sarama"

	"github.com/claimflow/claimflow/dev/notifysim"
	"github.com/claimflow/claimflow/workflows"
)

// consumerTopic creates a topic (and its .DLT) for one test. The name is
// unique so reruns against a shared real broker start empty.
func consumerTopic(t *testing.T, s *stack, name string, partitions int32) string {
	t.Helper()
	topic := fmt.Sprintf("test.%s.%d", name, time.Now().UnixNano())
	err := kafka.EnsureTopics(context.Background(), s.Config.Kafka("claimflow-test"), []kafka.Topic{
		{Name: topic, Partitions: partitions, Replicas: 1},
		{Name: topic + ".DLT", Partitions: 1, Replicas: 1},
	})
	if err != nil {
		t.Fatal(err)
	}
	return topic
}

// testEvents builds n enrollment.confirmed events spread round-robin over
// keys courses, so each key's events are interleaved with the others'.
func testEvents(prefix string, n, keys int) []workflows.Message {
	out := make([]workflows.Message, n)
	now := time.Now().UTC()
	for i := range out {
		course := fmt.Sprintf("%s-c%03d", prefix, i%keys)
		enrollment := fmt.Sprintf("%s-e%06d", prefix, i)
		out[i] = workflows.Message{Key: course, Event: workflows.Event{
			ID:         workflows.EventID(enrollment, workflows.EventEnrollmentConfirmed),
			Type:       workflows.EventEnrollmentConfirmed,
			OccurredAt: now.Add(time.Duration(i) * time.Microsecond),
			Data:       map[string]any{"enrollment_id": enrollment, "course_id": course, "student_id": fmt.Sprintf("s-%06d", i)},
		}}
	}
	return out
}

// produce writes the events to topic in order, as the workflows publish
// them: key, JSON envelope, event_id and type headers.
func produce(t *testing.T, s *stack, topic string, events []workflows.Message) {
	t.Helper()
	unsigned, err := kafka.NewProducer(s.Config.Kafka("claimflow-test-producer"))
	if err != nil {
		t.Fatal(err)
	}
	defer unsigned.Close()
	p := kafka.SigningProducer{SyncProducer: unsigned, Key: []byte(s.Config.EventSigningKey)}
	for chunk := range slices.Chunk(events, 1000) {
		msgs := make([]*sarama.ProducerMessage, len(chunk))
		for i, m := range chunk {
			b, err := json.Marshal(m.Event)
			if err != nil {
				t.Fatal(err)
			}
			msgs[i] = &sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(m.Key), Value: sarama.ByteEncoder(b),
				Headers: []sarama.RecordHeader{
					{Key: []byte("event_id"), Value: []byte(m.Event.ID)},
					{Key: []byte("type"), Value: []byte(m.Event.Type)},
				}}
		}
		if err := p.SendMessages(msgs); err != nil {
			t.Fatalf("produce to %s: %v", topic, err)
		}
	}
}

// startTestConsumer runs a consumer in this process on topic, as `claimflow
// dev` runs its own, and stops it at cleanup.
func startTestConsumer(t *testing.T, s *stack, topic, group string, batch int) *consumerService {
	t.Helper()
	cfg := s.Config
	cfg.ConsumerTopics, cfg.ConsumerGroup, cfg.ConsumerBatch = []string{topic}, group, batch
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	c, err := startConsumer(cfg, log, s.Pool, s.Client, newTelemetry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() }) // Stop twice is harmless
	return c
}

// buildClaimflow builds this command, so a test can SIGKILL a consumer
// process as a crash would.
func buildClaimflow(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "claimflow")
	began := time.Now()
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	t.Logf("built %s in %s", bin, time.Since(began).Round(time.Millisecond))
	return bin
}

// startConsumerProcess runs `claimflow consumer` against the stack.
func startConsumerProcess(t *testing.T, s *stack, bin, topic, group string, batch int, name string) *exec.Cmd {
	t.Helper()
	logFile, err := os.Create(filepath.Join(t.TempDir(), name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "consumer", "-migrate=false")
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"),
		"DATABASE_URL=" + s.Config.DatabaseURL,
		"TEMPORAL_ADDRESS=" + s.Config.TemporalAddress,
		"TEMPORAL_NAMESPACE=" + s.Config.Namespace,
		"KAFKA_BROKERS=" + strings.Join(s.Config.KafkaBrokers, ","),
		"KAFKA_VERSION=" + s.Config.KafkaVersion,
		"NOTIFY_WEBHOOK_URL=" + s.Config.NotifyWebhookURL,
		"CONSUMER_TOPICS=" + topic,
		"CONSUMER_GROUP=" + group,
		"CONSUMER_BATCH=" + strconv.Itoa(batch),
		"EVENT_SIGNING_KEY=" + s.Config.EventSigningKey,
		"LOG_FORMAT=text", "LOG_LEVEL=info",
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		logFile.Close()
		if t.Failed() {
			if b, err := os.ReadFile(logFile.Name()); err == nil {
				t.Logf("--- %s log ---\n%s", name, lastLinesOf(string(b), 40))
			}
		}
	})
	return cmd
}

func lastLinesOf(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func notificationCount(t *testing.T, s *stack, topic string) int {
	t.Helper()
	var n int
	if err := s.Pool.QueryRow(context.Background(), `SELECT count(*) FROM notifications WHERE topic = $1`, topic).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// row is one notification as stored.
type row struct {
	EventID   string
	Key       string
	Partition int32
	Offset    int64
	Path      string
	Attempts  int
	Seq       int64
	Recipient string
}

// notificationRows returns a topic's notifications in delivery order.
func notificationRows(t *testing.T, s *stack, topic string) []row {
	t.Helper()
	rows, err := s.Pool.Query(context.Background(), `
		SELECT event_id, message_key, kafka_partition, kafka_offset, path, attempts, seq, coalesce(recipient, '')
		FROM notifications WHERE topic = $1 ORDER BY seq`, topic)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []row
	for rows.Next() {
		var r row
		if err := rows.Scan(&r.EventID, &r.Key, &r.Partition, &r.Offset, &r.Path, &r.Attempts, &r.Seq, &r.Recipient); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// checkCommittedAreDurable is the consumer's first promise: an offset is
// committed only after its event's notification is durable. Every record
// below the group's committed offset must have its row (these tests hand
// nothing to Temporal while they check this).
func checkCommittedAreDurable(t *testing.T, s *stack, topic, group string) (committedTotal int) {
	t.Helper()
	records, _, err := kafka.ReadTopics(context.Background(), s.Config.Kafka("claimflow-test"), []string{topic})
	if err != nil {
		t.Fatal(err)
	}
	parts := map[string][]int32{}
	for _, r := range records {
		if !slices.Contains(parts[topic], r.Partition) {
			parts[topic] = append(parts[topic], r.Partition)
		}
	}
	committed, err := kafka.CommittedOffsets(s.Config.Kafka("claimflow-test"), group, parts)
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, r := range notificationRows(t, s, topic) {
		have[r.EventID] = true
	}
	for _, r := range records {
		if next := committed[topic][r.Partition]; next >= 0 && r.Offset < next {
			committedTotal++
			if !have[r.EventID] {
				t.Errorf("offset %d of %s/%d is committed but event %s has no notification", r.Offset, topic, r.Partition, r.EventID)
			}
		}
	}
	return committedTotal
}

// runAuditFor audits one topic against the notifications table and, when
// the stack runs the simulator, against its ledger of webhook deliveries.
func runAuditFor(t *testing.T, s *stack, topic, group string) audit.Report {
	t.Helper()
	in := audit.Input{Kafka: s.Config.Kafka("claimflow-audit"), Topics: []string{topic},
		Group: group, DB: s.Pool, Temporal: s.Client, Show: 10}
	if s.Notify != nil {
		in.Webhook = func(_ context.Context, topics []string) ([]notifysim.Delivery, error) {
			var ds []notifysim.Delivery
			for _, topic := range topics {
				ds = append(ds, s.Notify.Deliveries(topic)...)
			}
			return ds, nil
		}
	}
	r, err := audit.Run(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	r.WriteText(&b)
	t.Log("\n" + b.String())
	return r
}

func setSink(t *testing.T, s *stack, st notifysim.Setting) {
	t.Helper()
	if s.Notify == nil {
		t.Skip("needs the notification simulator (NOTIFY_WEBHOOK_URL is set)")
	}
	if err := s.Notify.Set(st); err != nil {
		t.Fatal(err)
	}
}

// TestConsumerKilledMidStreamDeliversEachEventOnce: 5,000 events; a consumer
// process is SIGKILLed mid-stream (no commit, no goodbye), two consumers take
// over (one in another process, one here: a rebalance), the other process
// is stopped with SIGTERM (graceful: its in-flight batches finish), and the
// last one finishes the topic. Exactly 5,000 notifications, none twice, and
// at every stop no offset was committed ahead of its notification.
func TestConsumerKilledMidStreamDeliversEachEventOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("integration tests start the real stack; skipped with -short")
	}
	s := testStack(t, dataDir(t))
	bin := buildClaimflow(t)
	const n = 5000
	topic := consumerTopic(t, s, "kill", 12)
	group := topic + ".group"
	events := testEvents("kill", n, 50)
	produce(t, s, topic, events)
	// A slow sink (200 ms per batch of 25) keeps the stream going long
	// enough to kill the consumer in the middle of it.
	setSink(t, s, notifysim.Setting{Mode: notifysim.Slow, Delay: notifysim.Duration(200 * time.Millisecond)})

	a := startConsumerProcess(t, s, bin, topic, group, 25, "consumer-a")
	waitFor(t, 2*time.Minute, "1,000 notifications from the first consumer", func() bool {
		return notificationCount(t, s, topic) >= 1000
	})
	if err := a.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = a.Wait()
	killedAt := notificationCount(t, s, topic)
	committed := checkCommittedAreDurable(t, s, topic, group)
	t.Logf("consumer A killed at %d notifications; %d offsets committed, each with its notification", killedAt, committed)

	b := startConsumerProcess(t, s, bin, topic, group, 25, "consumer-b")
	c := startTestConsumer(t, s, topic, group, 25)
	waitFor(t, 2*time.Minute, "3,000 notifications from the two consumers", func() bool {
		return notificationCount(t, s, topic) >= 3000
	})
	if err := b.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := b.Wait(); err != nil {
		t.Errorf("consumer B did not exit cleanly on SIGTERM: %v", err)
	}
	committed = checkCommittedAreDurable(t, s, topic, group)
	t.Logf("consumer B stopped with SIGTERM; %d offsets committed, each with its notification", committed)

	setSink(t, s, notifysim.Setting{Mode: notifysim.Healthy})
	waitFor(t, 2*time.Minute, "5,000 notifications", func() bool { return notificationCount(t, s, topic) >= n })
	// Once the group has committed the whole topic nothing of it is left to
	// deliver: a wrongly doubled delivery would have happened by then.
	waitCaughtUp(t, s, topic, group, 2*time.Minute)
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	st := c.Consumer.Stats()
	t.Logf("consumer C (this process): %d records, %d delivered, %d skipped as done before", st.Records, st.Delivered, st.Skipped)
	if committed := checkCommittedAreDurable(t, s, topic, group); committed != n {
		t.Errorf("%d of %d offsets committed after the last consumer stopped", committed, n)
	}

	rows := notificationRows(t, s, topic)
	seen := map[string]int{}
	for _, r := range rows {
		seen[r.EventID]++
	}
	for _, e := range events {
		if seen[e.Event.ID] != 1 {
			t.Errorf("event %s has %d notifications, want 1", e.Event.ID, seen[e.Event.ID])
		}
	}
	if len(rows) != n || len(seen) != n {
		t.Fatalf("%d notifications for %d distinct events, want exactly %d", len(rows), len(seen), n)
	}
	r := runAuditFor(t, s, topic, group)
	if !r.OK() || r.Delivered != n || r.Lost != 0 || r.DuplicateEffects != 0 || r.Redelivered != 0 {
		t.Fatalf("audit: %+v", r)
	}
	// The webhook is at-least-once: a kill between its answer and the row
	// sends those events again, under the same key and with the same body.
	// Each key takes effect once.
	l := *r.Webhook
	if l.Keys != n || l.Effects != n || !l.OK() {
		t.Errorf("webhook ledger %+v, want %d keys each taking effect once, no key with another body", l, n)
	}
	t.Logf("webhook: %d keys took effect once each; %d re-sent after acceptance (deduped by key), %d attempts",
		l.Effects, l.Resent, l.Attempts)
}

// TestConsumerRetriesFailingEventsBehindTheLine: the sink fails the first
// two attempts of every 25th event. Each of them is delivered once, on its
// third attempt, by its DeliverEvent run; everything else is delivered
// inline and in offset order per key, and a retried event arrives after the
// events of its key behind it: the order the README promises.
func TestConsumerRetriesFailingEventsBehindTheLine(t *testing.T) {
	if testing.Short() {
		t.Skip("integration tests start the real stack; skipped with -short")
	}
	s := testStack(t, dataDir(t))
	const n, keys = 1000, 20
	topic := consumerTopic(t, s, "retry", 12)
	group := topic + ".group"
	events := testEvents("retry", n, keys)
	failing := map[string]bool{}
	var ids []string
	for i := 0; i < n; i += 25 {
		failing[events[i].Event.ID] = true
		ids = append(ids, events[i].Event.ID)
	}
	setSink(t, s, notifysim.Setting{Mode: notifysim.Failing, EventIDs: ids, Attempts: 2})
	produce(t, s, topic, events)
	startTestConsumer(t, s, topic, group, 0)
	waitFor(t, 2*time.Minute, "every event delivered", func() bool { return notificationCount(t, s, topic) >= n })
	waitCaughtUp(t, s, topic, group, time.Minute)

	rows := notificationRows(t, s, topic)
	if len(rows) != n {
		t.Fatalf("%d notifications, want %d", len(rows), n)
	}
	byKey := map[string][]row{}
	for _, r := range rows {
		switch {
		case failing[r.EventID] && (r.Path != "workflow" || r.Attempts != 3):
			t.Errorf("failing event %s: path %s after %d attempts, want workflow after 3", r.EventID, r.Path, r.Attempts)
		case !failing[r.EventID] && (r.Path != "consumer" || r.Attempts != 1):
			t.Errorf("event %s: path %s after %d attempts, want consumer after 1", r.EventID, r.Path, r.Attempts)
		}
		if r.Recipient == "" {
			t.Errorf("event %s: no recipient", r.EventID)
		}
		byKey[r.Key] = append(byKey[r.Key], r)
	}
	late := 0
	for key, rs := range byKey {
		// rs is in delivery order: inline deliveries must be in offset order.
		var lastInline int64 = -1
		for _, r := range rs {
			if r.Path != "consumer" {
				continue
			}
			if r.Offset < lastInline {
				t.Errorf("key %s: inline delivery of offset %d after offset %d", key, r.Offset, lastInline)
			}
			lastInline = r.Offset
		}
		// A retried event arrives after the inline events behind it.
		for i, r := range rs {
			if r.Path != "workflow" {
				continue
			}
			for _, later := range rs[i+1:] {
				if later.Path == "consumer" && later.Offset > r.Offset {
					t.Errorf("key %s: retried event at offset %d was delivered before offset %d, which was not held back for it",
						key, r.Offset, later.Offset)
				}
			}
			for _, earlier := range rs[:i] {
				if earlier.Offset > r.Offset {
					late++
					break
				}
			}
		}
	}
	if late != len(ids) {
		t.Errorf("%d of the %d retried events arrived after events behind them, want all", late, len(ids))
	}
	r := runAuditFor(t, s, topic, group)
	if !r.OK() || r.Delivered != n || r.ViaWorkflow != len(ids) || r.Late != len(ids) || r.LateInline != 0 {
		t.Fatalf("audit: %+v", r)
	}
	if l := *r.Webhook; l.Keys != n || l.Effects != n || l.Retried != 2*len(ids) || l.Resent != 0 || !l.OK() {
		t.Errorf("webhook ledger %+v, want %d keys taking effect once, %d retries after refusals, no re-send", l, n, 2*len(ids))
	}
	var dls int
	if err := s.Pool.QueryRow(context.Background(), `SELECT count(*) FROM dead_letters WHERE topic = $1`, topic).Scan(&dls); err != nil {
		t.Fatal(err)
	}
	if dls != 0 {
		t.Errorf("%d dead letters, want none: every event recovered within the policy", dls)
	}
}

// TestConsumerDeadLetterRetryAndDiscard: the sink refuses two events for
// good. Each is dead-lettered (visible in GET /v1/dead-letters, copied to
// <topic>.DLT with the error) while the other events are delivered inline,
// unaffected. Once the sink recovers, POST .../retry delivers the first once
// (not before, even when Kafka brings it back meanwhile); POST .../compensate
// discards the second, and it stays undelivered when Kafka brings it back.
func TestConsumerDeadLetterRetryAndDiscard(t *testing.T) {
	if testing.Short() {
		t.Skip("integration tests start the real stack; skipped with -short")
	}
	s := testStack(t, dataDir(t))
	c := newAPIClient(t, s)
	const n = 200
	topic := consumerTopic(t, s, "dlt", 12)
	group := topic + ".group"
	events := testEvents("dlt", n, 10)
	poison, doomed := events[37], events[121]
	setSink(t, s, notifysim.Setting{Mode: notifysim.Failing, EventIDs: []string{poison.Event.ID, doomed.Event.ID}})
	produce(t, s, topic, events)
	startTestConsumer(t, s, topic, group, 0)

	deadLetters := map[string]map[string]any{}
	waitFor(t, time.Minute, "two consume dead letters", func() bool {
		_, body, _ := c.do("GET", "/v1/dead-letters?status=open&stage=consume", nil)
		items, _ := body["dead_letters"].([]any)
		for _, it := range items {
			d := it.(map[string]any)
			if d["topic"] == topic {
				deadLetters[d["event_id"].(string)] = d
			}
		}
		return len(deadLetters) == 2
	})
	for _, e := range []workflows.Message{poison, doomed} {
		d := deadLetters[e.Event.ID]
		if d["stage"] != "consume" || d["workflow_id"] != workflows.DeliverEventWorkflowID(e.Event.ID) ||
			d["key"] != e.Key || !strings.Contains(fmt.Sprint(d["error"]), "rejected") || d["rounds"] != float64(1) {
			t.Errorf("dead letter of %s: %v", e.Event.ID, d)
		}
	}
	if got := notificationCount(t, s, topic); got != n-2 {
		t.Fatalf("%d notifications while two events are dead-lettered, want %d", got, n-2)
	}
	for _, r := range notificationRows(t, s, topic) {
		if r.Path != "consumer" || r.Attempts != 1 {
			t.Errorf("event %s was held up: path %s, %d attempts", r.EventID, r.Path, r.Attempts)
		}
	}
	copies := dltRecords(t, s, topic+".DLT")
	for _, e := range []workflows.Message{poison, doomed} {
		h, ok := copies[e.Event.ID]
		if !ok || !strings.Contains(h["error"], "rejected") || h["original_topic"] != topic {
			t.Errorf("copy of %s on %s.DLT: %v (found %v)", e.Event.ID, topic, h, ok)
		}
	}

	// The sink recovers and Kafka brings the parked event back before the
	// operator acted: the dead letter's run owns it, so the consumer does not
	// deliver it behind the operator's back.
	setSink(t, s, notifysim.Setting{Mode: notifysim.Healthy})
	produce(t, s, topic, []workflows.Message{poison})
	waitCaughtUp(t, s, topic, group, time.Minute)
	if got := notificationCount(t, s, topic); got != n-2 {
		t.Fatalf("%d notifications after a parked event came back, want %d", got, n-2)
	}
	retryID := fmt.Sprint(deadLetters[poison.Event.ID]["id"])
	discardID := fmt.Sprint(deadLetters[doomed.Event.ID]["id"])
	c.must("POST", "/v1/dead-letters/"+retryID+"/retry", nil, http.StatusAccepted)
	c.must("POST", "/v1/dead-letters/"+discardID+"/compensate", nil, http.StatusAccepted)
	waitFor(t, 30*time.Second, "the retried event delivered", func() bool { return notificationCount(t, s, topic) == n-1 })
	waitFor(t, 10*time.Second, "dead letters resolved and discarded", func() bool {
		_, a, _ := c.do("GET", "/v1/dead-letters/"+retryID, nil)
		_, b, _ := c.do("GET", "/v1/dead-letters/"+discardID, nil)
		return a["status"] == "resolved" && b["status"] == "discarded"
	})
	c.must("POST", "/v1/dead-letters/"+retryID+"/retry", nil, http.StatusConflict)

	// Kafka brings both back (a publisher's retry, or a replay): the
	// delivered one is not sent again, the discarded one stays discarded.
	produce(t, s, topic, []workflows.Message{poison, doomed})
	waitCaughtUp(t, s, topic, group, time.Minute)
	if got := notificationCount(t, s, topic); got != n-1 {
		t.Fatalf("%d notifications after the redelivery, want %d", got, n-1)
	}
	if e, _ := s.Notify.Event(poison.Event.ID); !e.Delivered {
		t.Errorf("webhook never took the retried event: %+v", e)
	}
	if e, _ := s.Notify.Event(doomed.Event.ID); e.Delivered {
		t.Errorf("webhook took the discarded event: %+v", e)
	}
	for _, r := range notificationRows(t, s, topic) {
		if r.EventID == poison.Event.ID && (r.Path != "workflow" || r.Attempts != 5) {
			t.Errorf("retried event: path %s after %d attempts, want workflow after 5 (4 before the dead letter)", r.Path, r.Attempts)
		}
	}
	r := runAuditFor(t, s, topic, group)
	if !r.OK() || r.Delivered != n-1 || r.Discarded != 1 || r.Redelivered != 3 || r.DeadLettered != 0 {
		t.Fatalf("audit: %+v", r)
	}
	if l := *r.Webhook; l.Effects != n-1 || !l.OK() {
		t.Errorf("webhook ledger %+v, want %d keys taking effect once each", l, n-1)
	}
}

// dltRecords reads a .DLT topic: event ID → headers.
func dltRecords(t *testing.T, s *stack, topic string) map[string]map[string]string {
	t.Helper()
	cfg := sarama.NewConfig()
	v, err := sarama.ParseKafkaVersion(kafka.DefaultVersion)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Version = v
	client, err := sarama.NewClient(s.Config.KafkaBrokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	newest, err := client.GetOffset(topic, 0, sarama.OffsetNewest)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]string{}
	if newest == 0 {
		return out
	}
	pc, err := consumer.ConsumePartition(topic, 0, sarama.OffsetOldest)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	for m := range pc.Messages() {
		h := map[string]string{}
		for _, rh := range m.Headers {
			h[string(rh.Key)] = string(rh.Value)
		}
		out[h["event_id"]] = h
		if m.Offset >= newest-1 {
			break
		}
	}
	return out
}

// TestConsumerThroughputAndAudit measures the inline path: events are
// produced first, then a consumer drains the backlog with the sink healthy,
// once through the webhook simulator and once into the table alone. It
// prints events/s and the audit; it asserts exactness, not speed.
// CLAIMFLOW_CONSUMER_EVENTS sets the number of events (default 10,000).
func TestConsumerThroughputAndAudit(t *testing.T) {
	if testing.Short() {
		t.Skip("integration tests start the real stack; skipped with -short")
	}
	n := 10000
	if v := os.Getenv("CLAIMFLOW_CONSUMER_EVENTS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			t.Fatalf("CLAIMFLOW_CONSUMER_EVENTS=%q", v)
		}
	}
	s := testStack(t, dataDir(t))
	setSink(t, s, notifysim.Setting{Mode: notifysim.Healthy})
	for _, sink := range []string{"webhook", "table"} {
		t.Run(sink, func(t *testing.T) {
			topic := consumerTopic(t, s, "bench-"+sink, 12)
			group := topic + ".group"
			events := testEvents("bench-"+sink, n, 200)
			began := time.Now()
			produce(t, s, topic, events)
			t.Logf("produced %d events in %s", n, time.Since(began).Round(time.Millisecond))

			ts := *s
			if sink == "table" {
				ts.Config.NotifyWebhookURL = ""
			}
			began = time.Now()
			c := startTestConsumer(t, &ts, topic, group, 0)
			waitFor(t, 10*time.Minute, "every event delivered", func() bool { return notificationCount(t, s, topic) >= n })
			wall := time.Since(began)
			if err := c.Stop(); err != nil {
				t.Fatal(err)
			}
			var first, last time.Time
			if err := s.Pool.QueryRow(context.Background(),
				`SELECT min(delivered_at), max(delivered_at) FROM notifications WHERE topic = $1`, topic).Scan(&first, &last); err != nil {
				t.Fatal(err)
			}
			span := last.Sub(first)
			st := c.Consumer.Stats()
			t.Logf("inline path, sink %s: %d events delivered in %s from the first to the last notification = %.0f events/s "+
				"(%s wall including joining the group = %.0f events/s; %d batches, %.0f events per batch)",
				sink, n, span.Round(time.Millisecond), float64(n-1)/span.Seconds(), wall.Round(time.Millisecond),
				float64(n)/wall.Seconds(), st.Batches, float64(st.Records)/float64(max(st.Batches, 1)))
			r := runAuditFor(t, s, topic, group)
			if !r.OK() || r.Delivered != n || r.ViaWorkflow != 0 {
				t.Fatalf("audit: %+v", r)
			}
			if l := *r.Webhook; sink == "webhook" && (l.Keys != n || l.Effects != n || !l.OK()) {
				t.Fatalf("the webhook ledger %+v, want %d keys taking effect once each", l, n)
			}
			// The same through the command line, as an operator runs it,
			// with the simulator's ledger.
			var out strings.Builder
			cfg := s.Config
			log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
			if err := runAudit(context.Background(), cfg, log,
				[]string{"-topics", topic, "-group", group, "-json", "-webhook-ledger", s.Notify.URL}, &out); err != nil {
				t.Fatalf("claimflow audit: %v\n%s", err, out.String())
			}
			var cli audit.Report
			if err := json.Unmarshal([]byte(out.String()), &cli); err != nil || cli.Delivered != n || !cli.OK() ||
				cli.Webhook == nil || (sink == "webhook" && cli.Webhook.Effects != n) {
				t.Fatalf("claimflow audit -json printed %s (%v)", out.String(), err)
			}
			t.Logf("claimflow audit -json:\n%s", out.String())
		})
	}
}

// TestConsumerNotifiesEnrollments: the consumer `claimflow dev` starts reads
// enrollment.events (and coupon.events) and notifies the student of a
// confirmed enrollment, through the webhook and in the table.
func TestConsumerNotifiesEnrollments(t *testing.T) {
	if testing.Short() {
		t.Skip("integration tests start the real stack; skipped with -short")
	}
	s := testStack(t, dataDir(t))
	if !slices.Equal(s.Config.ConsumerTopics, []string{workflows.EnrollmentTopic, workflows.CouponTopic}) {
		t.Fatalf("the stack's consumer reads %v", s.Config.ConsumerTopics)
	}
	c := newAPIClient(t, s)
	c.must("POST", "/v1/courses", map[string]any{"id": "ntf101", "title": "Notify", "capacity": 5}, http.StatusCreated)
	e := c.must("POST", "/v1/courses/ntf101/enrollments?wait=confirmed", map[string]any{"student_id": "nia"}, http.StatusCreated)
	eventID := workflows.EventID(e["id"].(string), workflows.EventEnrollmentConfirmed)
	var recipient, path string
	waitFor(t, 30*time.Second, "the enrollment's notification", func() bool {
		err := s.Pool.QueryRow(context.Background(), `SELECT recipient, path FROM notifications WHERE event_id = $1`, eventID).
			Scan(&recipient, &path)
		return err == nil
	})
	if recipient != "nia" || path != "consumer" {
		t.Fatalf("notification of %s: recipient %q via %s", eventID, recipient, path)
	}
	if ev, ok := s.Notify.Event(eventID); !ok || !ev.Delivered || ev.Attempts != 1 {
		t.Fatalf("webhook saw %+v (%v)", ev, ok)
	}
}

// TestConsumerRefusesForgedEvents: whoever can write to the event topics
// (anyone on the pod network without Kafka ACLs) cannot make the consumer
// notify anybody. A record without the workers' signature, or signed with
// another key, is counted and logged and no notification is written, while
// the genuine event beside them is delivered.
func TestConsumerRefusesForgedEvents(t *testing.T) {
	if testing.Short() {
		t.Skip("integration tests start the real stack; skipped with -short")
	}
	s := testStack(t, dataDir(t))
	c := newAPIClient(t, s)
	c.must("POST", "/v1/courses", map[string]any{"id": "forge101", "title": "Forged", "capacity": 5}, http.StatusCreated)
	e := c.must("POST", "/v1/courses/forge101/enrollments?wait=confirmed", map[string]any{"student_id": "alice"}, http.StatusCreated)
	genuine := workflows.EventID(e["id"].(string), workflows.EventEnrollmentConfirmed)
	before := s.Consumer.Consumer.Stats().Rejected

	p, err := kafka.NewProducer(s.Config.Kafka("mallory"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	forge := func(id string) *sarama.ProducerMessage {
		b, err := json.Marshal(workflows.Event{ID: id, Type: workflows.EventEnrollmentConfirmed, OccurredAt: time.Now().UTC(),
			Data: map[string]any{"enrollment_id": "forged", "course_id": "forge101", "student_id": "mallory"}})
		if err != nil {
			t.Fatal(err)
		}
		return &sarama.ProducerMessage{Topic: workflows.EnrollmentTopic, Key: sarama.StringEncoder("forge101"), Value: sarama.ByteEncoder(b),
			Headers: []sarama.RecordHeader{{Key: []byte("event_id"), Value: []byte(id)}, {Key: []byte("type"), Value: []byte(workflows.EventEnrollmentConfirmed)}}}
	}
	unsigned := forge("forged-unsigned/enrollment.confirmed")
	wrongKey := forge("forged-wrong-key/enrollment.confirmed")
	if err := kafka.Sign([]byte("not the workers' key, though just as long"), wrongKey); err != nil {
		t.Fatal(err)
	}
	if err := p.SendMessages([]*sarama.ProducerMessage{unsigned, wrongKey}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the consumer to refuse both forged records", func() bool {
		return s.Consumer.Consumer.Stats().Rejected-before == 2
	})
	waitFor(t, 30*time.Second, "the genuine event's notification", func() bool {
		var n int
		_ = s.Pool.QueryRow(context.Background(), `SELECT count(*) FROM notifications WHERE event_id = $1`, genuine).Scan(&n)
		return n == 1
	})
	var notified []string
	rows, err := s.Pool.Query(context.Background(), `SELECT event_id FROM notifications WHERE event_id = ANY($1) OR recipient = 'mallory'`,
		[]string{"forged-unsigned/enrollment.confirmed", "forged-wrong-key/enrollment.confirmed", genuine})
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		notified = append(notified, id)
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	if !slices.Equal(notified, []string{genuine}) {
		t.Fatalf("notifications %v, want the genuine %s alone", notified, genuine)
	}
	body := metricsText(t, c)
	for _, reason := range []string{"unsigned", "bad_signature"} {
		want := fmt.Sprintf(`claimflow_consumer_rejected_records_total{reason=%q,topic=%q} 1`, reason, workflows.EnrollmentTopic)
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}
