package kafka

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/IBM/sarama"
)

// SignatureHeader carries a record's signature: "v1=" and the hex
// HMAC-SHA256, under the key the workers and the consumers share
// (EVENT_SIGNING_KEY), of the record's topic, key and value. A record
// anyone else wrote to a topic has none that verifies, so the consumer
// acts on no forged event (docs/security.md).
const SignatureHeader = "claimflow-signature"

const signatureVersion = "v1="

// Why Verify refuses a record.
var (
	ErrUnsigned     = errors.New("record has no " + SignatureHeader + " header")
	ErrBadSignature = errors.New("record's signature does not verify")
)

// signature is the header value for a record.
func signature(key []byte, topic string, k, v []byte) string {
	mac := hmac.New(sha256.New, key)
	// Length-prefixed, so that no two different records sign alike.
	for _, part := range [][]byte{[]byte(topic), k, v} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(part)))
		mac.Write(n[:])
		mac.Write(part)
	}
	return signatureVersion + hex.EncodeToString(mac.Sum(nil))
}

// Sign adds m's signature header (replacing one already there).
func Sign(key []byte, m *sarama.ProducerMessage) error {
	var k, v []byte
	var err error
	if m.Key != nil {
		if k, err = m.Key.Encode(); err != nil {
			return fmt.Errorf("sign record for %s: %w", m.Topic, err)
		}
	}
	if m.Value != nil {
		if v, err = m.Value.Encode(); err != nil {
			return fmt.Errorf("sign record for %s: %w", m.Topic, err)
		}
	}
	hs := m.Headers[:0:0]
	for _, h := range m.Headers {
		if string(h.Key) != SignatureHeader {
			hs = append(hs, h)
		}
	}
	m.Headers = append(hs, sarama.RecordHeader{Key: []byte(SignatureHeader), Value: []byte(signature(key, m.Topic, k, v))})
	return nil
}

// Verify checks m's signature under key.
func Verify(key []byte, m *sarama.ConsumerMessage) error {
	var got []byte
	for _, h := range m.Headers {
		if h != nil && string(h.Key) == SignatureHeader {
			got = h.Value
		}
	}
	if got == nil {
		return ErrUnsigned
	}
	if !hmac.Equal(got, []byte(signature(key, m.Topic, m.Key, m.Value))) {
		return ErrBadSignature
	}
	return nil
}

// SigningProducer signs every record before it sends it: wrap the
// producers of whatever publishes events the consumer acts on.
type SigningProducer struct {
	sarama.SyncProducer
	Key []byte
}

// SendMessage signs msg and sends it.
func (p SigningProducer) SendMessage(msg *sarama.ProducerMessage) (int32, int64, error) {
	if err := Sign(p.Key, msg); err != nil {
		return -1, -1, err
	}
	return p.SyncProducer.SendMessage(msg)
}

// SendMessages signs msgs and sends them.
func (p SigningProducer) SendMessages(msgs []*sarama.ProducerMessage) error {
	for _, m := range msgs {
		if err := Sign(p.Key, m); err != nil {
			return err
		}
	}
	return p.SyncProducer.SendMessages(msgs)
}
