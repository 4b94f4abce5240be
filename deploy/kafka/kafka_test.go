// Package kafka holds the scripts that run a real Apache Kafka broker for CI
// (kafka.sh, pom.xml) and a smoke test proving that our sarama client
// configuration works against it.
//
// The tests are skipped unless KAFKA_BROKERS is set, e.g.
//
//	eval "$(deploy/kafka/kafka.sh start | tail -n 1 | sed 's/^/export /')"
//	go test -count=1 ./deploy/kafka/
//
// Environment:
//
//	KAFKA_BROKERS      comma-separated bootstrap list (required)
//	KAFKA_VERSION      protocol version for sarama (default 4.1.0)
//	KAFKA_RF           replication factor of the test topic (default 1)
//	KAFKA_FAULT_TEST   1 to also run TestLeaderFailover (needs KAFKA_RF=3 and a
//	                   3-node cluster started by kafka.sh; it kills and restarts
//	                   the leader of partition 0)
//	KAFKA_RUN_DIR      the --dir given to kafka.sh start (default ./run)
package kafka

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
)

const (
	testPartitions = 3
	testMessages   = 1000
)

type env struct {
	brokers []string
	version sarama.KafkaVersion
	rf      int16
}

func loadEnv(t *testing.T) env {
	t.Helper()
	raw := strings.TrimSpace(os.Getenv("KAFKA_BROKERS"))
	if raw == "" {
		t.Skip("KAFKA_BROKERS not set: no Kafka broker to test against (start one with deploy/kafka/kafka.sh start)")
	}
	var e env
	for _, b := range strings.Split(raw, ",") {
		if b = strings.TrimSpace(b); b != "" {
			e.brokers = append(e.brokers, b)
		}
	}
	vs := os.Getenv("KAFKA_VERSION")
	if vs == "" {
		vs = "4.1.0"
	}
	v, err := sarama.ParseKafkaVersion(vs)
	if err != nil {
		t.Fatalf("KAFKA_VERSION=%q: %v", vs, err)
	}
	if !v.IsAtLeast(sarama.V2_1_0_0) {
		t.Fatalf("KAFKA_VERSION=%s: Kafka 4.x brokers need a sarama Version >= 2.1.0", v)
	}
	e.version = v
	e.rf = 1
	if s := os.Getenv("KAFKA_RF"); s != "" {
		n, err := strconv.ParseInt(s, 10, 16)
		if err != nil || n < 1 {
			t.Fatalf("KAFKA_RF=%q: want a positive integer", s)
		}
		e.rf = int16(n)
	}
	return e
}

// config is the client configuration under test: an idempotent producer that
// waits for all in-sync replicas.
func (e env) config() *sarama.Config {
	cfg := sarama.NewConfig()
	cfg.ClientID = "claimflow-kafka-smoke"
	cfg.Version = e.version
	cfg.Net.MaxOpenRequests = 1 // required by Idempotent
	cfg.Producer.Idempotent = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Return.Successes = true
	cfg.Producer.Return.Errors = true
	// A killed broker is fenced, and its partitions get a new leader, only
	// after broker.session.timeout.ms (9 s by default): keep retrying past that.
	cfg.Producer.Retry.Max = 40
	cfg.Producer.Retry.Backoff = 500 * time.Millisecond
	cfg.Producer.Timeout = 15 * time.Second
	cfg.Metadata.Retry.Max = 20
	cfg.Metadata.Retry.Backoff = 500 * time.Millisecond
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	cfg.Consumer.Return.Errors = true
	return cfg
}

// createTopic creates a fresh topic and waits until every partition has a leader.
func createTopic(t *testing.T, e env, client sarama.Client) string {
	t.Helper()
	topic := fmt.Sprintf("claimflow-smoke-%d", time.Now().UnixNano())
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		t.Fatalf("cluster admin: %v", err)
	}
	// admin shares client; closing admin would close it, so it is left open.
	err = admin.CreateTopic(topic, &sarama.TopicDetail{
		NumPartitions:     testPartitions,
		ReplicationFactor: e.rf,
	}, false)
	if err != nil {
		t.Fatalf("create topic %s (partitions=%d rf=%d): %v", topic, testPartitions, e.rf, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := client.RefreshMetadata(topic)
		if err == nil {
			ready := 0
			for p := int32(0); p < testPartitions; p++ {
				if l, err := client.Leader(topic, p); err == nil && l != nil {
					ready++
				}
			}
			if ready == testPartitions {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("topic %s has no leader for every partition after 30s (last error: %v)", topic, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("created topic %s: %d partitions, replication factor %d", topic, testPartitions, e.rf)
	return topic
}

// produce sends messages with values prefix-from .. prefix-(to-1) from a few
// goroutines sharing one producer, failing the test on the first error.
func produce(t *testing.T, producer sarama.SyncProducer, topic string, from, to int) {
	t.Helper()
	const workers = 8
	start := time.Now()
	jobs := make(chan int)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				msg := &sarama.ProducerMessage{
					Topic: topic,
					Key:   sarama.StringEncoder(fmt.Sprintf("key-%d", i)),
					Value: sarama.StringEncoder(fmt.Sprintf("msg-%d", i)),
				}
				if _, _, err := producer.SendMessage(msg); err != nil {
					errs <- fmt.Errorf("send msg-%d: %w", i, err)
					return
				}
			}
		}()
	}
	failed := false
feed:
	for i := from; i < to; i++ {
		select {
		case jobs <- i:
		case err := <-errs:
			t.Error(err)
			failed = true
			break feed
		}
	}
	close(jobs)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
		failed = true
	}
	if failed {
		t.FailNow()
	}
	d := time.Since(start)
	t.Logf("produced %d messages in %v (%.0f msg/s)", to-from, d.Round(time.Millisecond), float64(to-from)/d.Seconds())
}

// consumeAll reads every partition of topic from the start until want
// messages arrived, then checks that they are exactly msg-0 .. msg-(want-1),
// each once, and that the partitions hold nothing more.
func consumeAll(t *testing.T, client sarama.Client, topic string, want int) {
	t.Helper()
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		t.Fatalf("consumer: %v", err)
	}
	defer consumer.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	type rec struct {
		partition int32
		offset    int64
		value     string
	}
	recs := make(chan rec)
	var wg sync.WaitGroup
	var highWater int64
	for p := int32(0); p < testPartitions; p++ {
		pc, err := consumer.ConsumePartition(topic, p, sarama.OffsetOldest)
		if err != nil {
			t.Fatalf("consume partition %d: %v", p, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer pc.Close()
			for {
				select {
				case <-ctx.Done():
					return
				case err := <-pc.Errors():
					t.Errorf("partition %d: %v", p, err)
				case m := <-pc.Messages():
					select {
					case recs <- rec{m.Partition, m.Offset, string(m.Value)}:
					case <-ctx.Done():
						return
					}
				}
			}
		}()
	}

	seen := make(map[string]rec, want)
	dups := 0
	for len(seen)+dups < want {
		select {
		case r := <-recs:
			if prev, ok := seen[r.value]; ok {
				dups++
				t.Errorf("duplicate %s at partition %d offset %d (first at partition %d offset %d)",
					r.value, r.partition, r.offset, prev.partition, prev.offset)
				continue
			}
			seen[r.value] = r
		case <-ctx.Done():
			cancel()
			wg.Wait()
			t.Fatalf("consumed %d of %d messages before the 60s timeout", len(seen)+dups, want)
		}
	}
	cancel()
	wg.Wait()

	for i := 0; i < want; i++ {
		if _, ok := seen[fmt.Sprintf("msg-%d", i)]; !ok {
			t.Errorf("msg-%d never consumed", i)
		}
	}
	// Nothing beyond the expected messages: the offsets add up to want.
	for p := int32(0); p < testPartitions; p++ {
		hw, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			t.Fatalf("high watermark of partition %d: %v", p, err)
		}
		highWater += hw
	}
	if highWater != int64(want) {
		t.Errorf("partitions hold %d records, want exactly %d", highWater, want)
	}
	t.Logf("consumed %d messages, each once; partitions hold %d records", len(seen), highWater)
}

func newClient(t *testing.T, e env) sarama.Client {
	t.Helper()
	client, err := sarama.NewClient(e.brokers, e.config())
	if err != nil {
		t.Fatalf("connect to %v (Version %s): %v", e.brokers, e.version, err)
	}
	t.Cleanup(func() { _ = client.Close() })
	return client
}

// TestProduceConsume creates a topic, sends 1000 messages through an
// idempotent SyncProducer with acks=all, and reads exactly those back.
func TestProduceConsume(t *testing.T) {
	e := loadEnv(t)
	client := newClient(t, e)
	topic := createTopic(t, e, client)

	producer, err := sarama.NewSyncProducerFromClient(client)
	if err != nil {
		t.Fatalf("idempotent sync producer: %v", err)
	}
	produce(t, producer, topic, 0, testMessages)
	if err := producer.Close(); err != nil {
		t.Fatalf("close producer: %v", err)
	}
	consumeAll(t, client, topic, testMessages)
}

// TestLeaderFailover kills (kill -9) the broker leading partition 0 halfway
// through, checks that producing with acks=all still succeeds on the two
// remaining replicas (min.insync.replicas=2), that every message is read back
// exactly once, and restarts the killed node.
func TestLeaderFailover(t *testing.T) {
	e := loadEnv(t)
	if os.Getenv("KAFKA_FAULT_TEST") != "1" {
		t.Skip("KAFKA_FAULT_TEST=1 not set")
	}
	if e.rf < 3 {
		t.Skip("needs KAFKA_RF=3 on a 3-node cluster")
	}
	runDir := os.Getenv("KAFKA_RUN_DIR")
	if runDir == "" {
		runDir = "run"
	}
	kafkaSh := func(args ...string) {
		t.Helper()
		cmd := exec.Command("./kafka.sh", append(args, "--dir", runDir)...)
		out, err := cmd.CombinedOutput()
		t.Logf("kafka.sh %s:\n%s", strings.Join(args, " "), strings.TrimSpace(string(out)))
		if err != nil {
			t.Fatalf("kafka.sh %s: %v", strings.Join(args, " "), err)
		}
	}

	client := newClient(t, e)
	topic := createTopic(t, e, client)
	producer, err := sarama.NewSyncProducerFromClient(client)
	if err != nil {
		t.Fatalf("idempotent sync producer: %v", err)
	}
	defer producer.Close()

	produce(t, producer, topic, 0, testMessages/2)

	leader, err := client.Leader(topic, 0)
	if err != nil {
		t.Fatalf("leader of %s/0: %v", topic, err)
	}
	victim := strconv.Itoa(int(leader.ID()))
	killed := time.Now()
	kafkaSh("kill-node", victim)
	restarted := false
	defer func() {
		if !restarted {
			kafkaSh("start-node", victim)
		}
	}()

	produce(t, producer, topic, testMessages/2, testMessages)
	t.Logf("second half acknowledged %v after killing node %s", time.Since(killed).Round(time.Millisecond), victim)
	if l, err := client.Leader(topic, 0); err == nil {
		t.Logf("partition 0 leader is now node %d", l.ID())
	}
	consumeAll(t, client, topic, testMessages)

	kafkaSh("start-node", victim)
	restarted = true
}
