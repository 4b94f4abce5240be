// Package kafka is claimflow's Kafka plumbing: the topic list, client
// configuration, the producer the activities publish with, topic admin,
// and the reader the audit and the tests use.
package kafka

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"
	"github.com/claimflow/claimflow/internal/tlsfiles"
	"github.com/claimflow/claimflow/workflows"
)

// Config is what a claimflow process needs to reach Kafka.
type Config struct {
	Brokers []string
	// Version must not be above the broker's; kfake and Kafka 4.x both
	// accept 2.8 and later.
	Version string
	// ClientID names this process in broker logs.
	ClientID string
	// Linger is how long the producer holds a message so that those sent
	// with it share its produce request (KAFKA_LINGER; 0: none).
	Linger time.Duration
	// TLS and SASL secure the connections (KAFKA_TLS*, KAFKA_SASL_*).
	TLS  tlsfiles.Files
	SASL SASL
}

// SASL mechanisms claimflow speaks (KAFKA_SASL_MECHANISM).
const (
	SASLPlain       = "PLAIN"
	SASLScram256    = "SCRAM-SHA-256"
	SASLScram512    = "SCRAM-SHA-512"
	SASLOAuthBearer = "OAUTHBEARER"
)

// SASL is how a client authenticates to the brokers; a zero Mechanism
// means none.
type SASL struct {
	Mechanism      string
	User, Password string
	// TokenFile holds the current OAUTHBEARER token (KAFKA_SASL_OAUTHBEARER_
	// TOKEN_PATH); Tokens, when set, is used instead: plug in any source.
	TokenFile string
	Tokens    sarama.AccessTokenProvider
}

// NewProducer returns a producer whose SendMessage returns only once every
// in-sync replica has the message, with the idempotent producer on so that
// sarama's own retries do not write a message twice.
func NewProducer(cfg Config) (sarama.SyncProducer, error) {
	sc, err := SaramaConfig(cfg)
	if err != nil {
		return nil, err
	}
	sc.Producer.RequiredAcks = sarama.WaitForAll
	sc.Producer.Idempotent = true
	sc.Producer.Return.Successes = true
	sc.Producer.Return.Errors = true
	// Idempotence needs a single in-flight request per connection.
	sc.Net.MaxOpenRequests = 1
	// A few quick retries inside one activity attempt absorb a leader move;
	// the activity retry policy handles longer outages.
	sc.Producer.Retry.Max = 3
	sc.Producer.Retry.Backoff = 100 * time.Millisecond
	sc.Producer.Timeout = 10 * time.Second
	// With one request in flight a broker, a batch sent without a wait
	// goes out as its first messages alone and the rest queued behind
	// them: a round trip each (config.DefaultKafkaLinger has the figures).
	sc.Producer.Flush.Frequency = cfg.Linger
	p, err := sarama.NewSyncProducer(cfg.Brokers, sc)
	if err != nil {
		return nil, fmt.Errorf("connect producer to Kafka %v: %w", cfg.Brokers, Explain(cfg, sc, err))
	}
	return p, nil
}

// SaramaConfig is the client configuration every claimflow client starts
// from: version, client ID, metadata retries, TLS and SASL. A client that
// fails to connect passes its error through Explain.
func SaramaConfig(cfg Config) (*sarama.Config, error) {
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("no Kafka brokers configured (set KAFKA_BROKERS)")
	}
	sc := sarama.NewConfig()
	version := cfg.Version
	if version == "" {
		version = DefaultVersion
	}
	v, err := sarama.ParseKafkaVersion(version)
	if err != nil {
		return nil, fmt.Errorf("KAFKA_VERSION %q: %w", version, err)
	}
	sc.Version = v
	sc.ClientID = cfg.ClientID
	if sc.ClientID == "" {
		sc.ClientID = "claimflow"
	}
	sc.Metadata.Retry.Max = 5
	sc.Metadata.Retry.Backoff = 200 * time.Millisecond
	sc.Net.DialTimeout = 5 * time.Second
	if err := applySecurity(sc, cfg); err != nil {
		return nil, err
	}
	return sc, nil
}

// DefaultVersion is the protocol version claimflow speaks unless told
// otherwise; both kfake and Apache Kafka 4.x accept it.
const DefaultVersion = "3.9.0"

// Topic is a topic claimflow needs.
type Topic struct {
	Name       string
	Partitions int32
	Replicas   int16
}

// EnsureTopics creates the topics that are missing; existing ones are left
// as they are.
func EnsureTopics(ctx context.Context, cfg Config, topics []Topic) error {
	sc, err := SaramaConfig(cfg)
	if err != nil {
		return err
	}
	admin, err := sarama.NewClusterAdmin(cfg.Brokers, sc)
	if err != nil {
		return fmt.Errorf("connect admin to Kafka %v: %w", cfg.Brokers, Explain(cfg, sc, err))
	}
	defer admin.Close()
	for _, t := range topics {
		if err := ctx.Err(); err != nil {
			return err
		}
		err := admin.CreateTopic(t.Name, &sarama.TopicDetail{NumPartitions: t.Partitions, ReplicationFactor: t.Replicas}, false)
		if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
			return fmt.Errorf("create topic %s: %w", t.Name, err)
		}
	}
	return nil
}

// Ping checks that a broker answers a metadata request, once: an error
// that is the security settings' is an *AuthError (see Explain).
func Ping(ctx context.Context, cfg Config) error {
	sc, err := SaramaConfig(cfg)
	if err != nil {
		return err
	}
	sc.Metadata.Retry.Max = 0
	done := make(chan error, 1)
	go func() {
		c, err := sarama.NewClient(cfg.Brokers, sc)
		if err == nil {
			err = c.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		return Explain(cfg, sc, err)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// EventTopic is a topic the workflows publish events to, with the
// dead-letter topic (Name + ".DLT") where a record that cannot be
// delivered is copied for tools that watch Kafka.
type EventTopic struct {
	Name       string
	Partitions int32
	DLT        string
	// DLTPartitions is small: dead letters are rare and unordered.
	DLTPartitions int32
}

// EventTopics is every topic claimflow publishes to: the one list of names,
// partitions and dead-letter topics. 12 partitions leave room for per-key
// ordering across several consumers. Everything that creates or reads
// topics follows it: the dev stack creates AllTopics, the compose file's
// kafka-init and kafka-cluster-init create the same names with the same
// partitions and Replication's factors (deploy/compose_test.go checks, and
// cmd/claimflow's compose walk-through test compares the dev stack's broker
// with both), and the consumer reads EventTopicNames by default
// (CONSUMER_TOPICS).
var EventTopics = []EventTopic{
	{Name: workflows.EnrollmentTopic, Partitions: 12, DLT: workflows.EnrollmentDLTTopic, DLTPartitions: 1},
	{Name: workflows.CouponTopic, Partitions: 12, DLT: workflows.CouponDLTTopic, DLTPartitions: 1},
}

// Replicas and MinInsyncReplicas are the replication of every topic on a
// cluster of at least Replicas brokers: an acks=all write survives the loss
// of one broker and is refused, not lost, when two are down.
const (
	Replicas          int16 = 3
	MinInsyncReplicas int16 = 2
)

// Replication is the replication factor and min.insync.replicas of the
// topics on a cluster of brokers brokers: Replicas and MinInsyncReplicas,
// or as many copies as there are brokers (and all of them in sync) on a
// smaller one such as the dev stack's or compose's single broker.
func Replication(brokers int) (replicas, minInsync int16) {
	if brokers >= int(Replicas) {
		return Replicas, MinInsyncReplicas
	}
	n := int16(max(brokers, 1))
	return n, n
}

// AllTopics is every topic of EventTopics and their dead-letter topics,
// each partition with replicas copies (at least one).
func AllTopics(replicas int16) []Topic {
	replicas = max(replicas, 1)
	var out []Topic
	for _, t := range EventTopics {
		out = append(out,
			Topic{Name: t.Name, Partitions: t.Partitions, Replicas: replicas},
			Topic{Name: t.DLT, Partitions: t.DLTPartitions, Replicas: replicas})
	}
	return out
}

// EventTopicNames are the names of EventTopics, the topics the consumer
// reads unless told otherwise.
func EventTopicNames() []string {
	out := make([]string, len(EventTopics))
	for i, t := range EventTopics {
		out[i] = t.Name
	}
	return out
}
