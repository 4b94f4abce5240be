package kafka

import (
	"errors"
	"testing"

	"github.com/IBM/sarama"
)

func TestSignAndVerify(t *testing.T) {
	key := []byte("the workers' event signing key, 32+ bytes")
	signed := func() *sarama.ConsumerMessage {
		pm := &sarama.ProducerMessage{Topic: "claimflow.enrollments", Key: sarama.StringEncoder("cs101"), Value: sarama.StringEncoder(`{"event_id":"e1"}`),
			Headers: []sarama.RecordHeader{{Key: []byte("event_id"), Value: []byte("e1")}}}
		if err := Sign(key, pm); err != nil {
			t.Fatal(err)
		}
		if err := Sign(key, pm); err != nil { // signing twice keeps one header
			t.Fatal(err)
		}
		if len(pm.Headers) != 2 {
			t.Fatalf("headers %v, want event_id and one signature", pm.Headers)
		}
		m := &sarama.ConsumerMessage{Topic: pm.Topic, Key: []byte("cs101"), Value: []byte(`{"event_id":"e1"}`)}
		for i := range pm.Headers {
			m.Headers = append(m.Headers, &pm.Headers[i])
		}
		return m
	}
	for _, tc := range []struct {
		name   string
		change func(m *sarama.ConsumerMessage)
		key    []byte
		want   error
	}{
		{name: "as signed", change: func(*sarama.ConsumerMessage) {}, want: nil},
		{name: "no signature", change: func(m *sarama.ConsumerMessage) { m.Headers = m.Headers[:1] }, want: ErrUnsigned},
		{name: "another key", change: func(*sarama.ConsumerMessage) {}, key: []byte("someone else's key of the same length!!!!"), want: ErrBadSignature},
		{name: "value changed", change: func(m *sarama.ConsumerMessage) { m.Value = []byte(`{"event_id":"e2"}`) }, want: ErrBadSignature},
		{name: "key changed", change: func(m *sarama.ConsumerMessage) { m.Key = []byte("cs102") }, want: ErrBadSignature},
		{name: "topic changed", change: func(m *sarama.ConsumerMessage) { m.Topic = "claimflow.coupons" }, want: ErrBadSignature},
		{name: "key and value shifted", change: func(m *sarama.ConsumerMessage) {
			m.Key, m.Value = []byte("cs101{"), []byte(`"event_id":"e1"}`)
		}, want: ErrBadSignature},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := signed()
			tc.change(m)
			k := key
			if tc.key != nil {
				k = tc.key
			}
			if err := Verify(k, m); !errors.Is(err, tc.want) {
				t.Fatalf("Verify = %v, want %v", err, tc.want)
			}
		})
	}
}
