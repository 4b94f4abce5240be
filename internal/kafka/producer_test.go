package kafka

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestLingerSharesRequests: with Linger, a batch's messages reach the
// broker in one produce request; without it, sarama sends the first ones
// alone and the rest behind them (the idempotent producer keeps one
// request in flight a broker), which on a replicated cluster is a round
// trip each. The broker counts the requests.
func TestLingerSharesRequests(t *testing.T) {
	const batches, perBatch = 10, 42
	for _, tc := range []struct {
		linger time.Duration
		check  func(perBatch float64) bool
		want   string
	}{
		// Long enough that a slow (race-detector) run still gathers the
		// batch; production's default is config.DefaultKafkaLinger.
		{20 * time.Millisecond, func(r float64) bool { return r == 1 }, "1"},
		{0, func(r float64) bool { return r > 1.5 }, "more than 1.5"},
	} {
		t.Run(fmt.Sprintf("linger %v", tc.linger), func(t *testing.T) {
			c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(12, "t"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			var produces atomic.Int64
			c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
				produces.Add(1)
				return nil, nil, false // counted; the broker handles it
			})
			p, err := NewProducer(Config{Brokers: c.ListenAddrs(), Linger: tc.linger})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			// A first message opens the producer's connections; its request
			// is not counted.
			if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: "t", Value: sarama.StringEncoder("warm")}); err != nil {
				t.Fatal(err)
			}
			produces.Store(0)
			for b := range batches {
				msgs := make([]*sarama.ProducerMessage, perBatch)
				for i := range msgs {
					msgs[i] = &sarama.ProducerMessage{Topic: "t", Key: sarama.StringEncoder(fmt.Sprintf("k-%d-%d", b, i)),
						Value: sarama.StringEncoder("an event of about a hundred bytes, as an enrollment's is ......................")}
				}
				if err := p.SendMessages(msgs); err != nil {
					t.Fatal(err)
				}
			}
			if r := float64(produces.Load()) / batches; !tc.check(r) {
				t.Errorf("%d produce requests for %d batches of %d: %.1f a batch, want %s", produces.Load(), batches, perBatch, r, tc.want)
			}
		})
	}
}
