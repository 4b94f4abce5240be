package activities

import "github.com/claimflow/claimflow/internal/kafka"

// The Kafka plumbing moved to internal/kafka. These names stay for the
// bench (cmd/claimflow/internal/bench), which is moving to its own
// command in parallel; remove them once it imports internal/kafka.
type (
	KafkaConfig = kafka.Config
	Topic       = kafka.Topic
)

const DefaultKafkaVersion = kafka.DefaultVersion

var (
	NewProducer  = kafka.NewProducer
	EnsureTopics = kafka.EnsureTopics
)
