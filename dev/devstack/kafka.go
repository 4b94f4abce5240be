package devstack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
)

// KafkaOptions configures StartKafka.
type KafkaOptions struct {
	// DataDir persists topics, records, group offsets and producer state
	// across restarts; empty keeps everything in memory.
	DataDir string
	// Port for the single broker on 127.0.0.1; default 9092.
	Port int
	// Topics are created when missing; existing ones keep their contents
	// and partition count.
	Topics []Topic
}

// Topic to create at startup.
type Topic struct {
	Name string
	// Partitions; zero or less means one, so ordering per topic is the
	// default rather than kfake's default of ten partitions.
	Partitions int32
}

// Kafka is a running in-process kfake broker.
type Kafka struct {
	Cluster *kfake.Cluster
	// Brokers are the bootstrap addresses for clients.
	Brokers []string
}

// StartKafka starts an in-process Kafka-compatible broker (kfake). It runs
// inside our process, so it starts in milliseconds and dies with us; with a
// DataDir, Close flushes its state so the next start resumes from it.
func StartKafka(ctx context.Context, o KafkaOptions) (*Kafka, error) {
	started := time.Now()
	if o.Port == 0 {
		o.Port = 9092
	}
	opts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.Ports(o.Port),
		kfake.ClusterID("claimflow-dev"),
	}
	if o.DataDir != "" {
		if err := os.MkdirAll(o.DataDir, 0o755); err != nil {
			return nil, fmt.Errorf("create kafka data dir: %w", err)
		}
		opts = append(opts, kfake.DataDir(o.DataDir))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		return nil, fmt.Errorf("start kfake on 127.0.0.1:%d (data dir %q): %w (if the port is taken, stop the other broker or choose another port)", o.Port, o.DataDir, err)
	}
	k := &Kafka{Cluster: c, Brokers: c.ListenAddrs()}

	var created []string
	for _, t := range o.Topics {
		if err := ctx.Err(); err != nil {
			k.Close()
			return nil, fmt.Errorf("start kafka: %w", err)
		}
		p := t.Partitions
		if p <= 0 {
			p = 1
		}
		err := c.CreateTopic(t.Name, p, nil)
		switch {
		case err == nil:
			created = append(created, t.Name)
		case errors.Is(err, kerr.TopicAlreadyExists):
			// Restart on the same data dir: keep the existing records.
			if have := len(c.PartitionInfos(t.Name)); have != int(p) {
				slog.WarnContext(ctx, "kafka topic exists with a different partition count than configured; keeping it",
					"topic", t.Name, "have", have, "want", p)
			}
		default:
			k.Close()
			return nil, fmt.Errorf("create kafka topic %q with %d partitions: %w", t.Name, p, err)
		}
	}
	slog.InfoContext(ctx, "kafka (kfake) ready", "brokers", k.Brokers, "data", o.DataDir,
		"created_topics", created, "took", time.Since(started).Round(time.Millisecond))
	return k, nil
}

// Close stops the broker and, with a DataDir, writes its state to disk.
func (k *Kafka) Close() {
	if k != nil && k.Cluster != nil {
		k.Cluster.Close()
	}
}
