package activities

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/claimflow/claimflow/workflows"
)

type countingProducer struct{ sends int }

func (p *countingProducer) SendMessages([]*sarama.ProducerMessage) error {
	p.sends++
	return errors.New("kafka: client has run out of available brokers")
}

func (p *countingProducer) SendMessage(*sarama.ProducerMessage) (int32, int64, error) {
	p.sends++
	return 0, 0, errors.New("kafka: client has run out of available brokers")
}

// A fail-fast publish right after a failed send answers at once, without
// touching the broker (or the database): the batch has a durable path.
func TestPublishBatchFailFastAfterAFailedSend(t *testing.T) {
	p := &countingProducer{}
	a := &Activities{Producer: p}
	if _, failed := a.sendFailedWithin(FailFastWindow); failed {
		t.Fatal("no send has failed yet")
	}
	a.lastSendFailure.Store(time.Now().Add(-300 * time.Millisecond).UnixNano())
	ago, failed := a.sendFailedWithin(FailFastWindow)
	if !failed || ago < 300*time.Millisecond || ago > FailFastWindow {
		t.Fatalf("sendFailedWithin = %s, %v; want about 300ms, true", ago, failed)
	}
	in := workflows.PublishBatchInput{
		Messages:      []workflows.Message{{Topic: workflows.EnrollmentTopic, Key: "cs101", Event: workflows.Event{ID: "e-1"}}},
		EnrollmentIDs: []string{"enr-1"},
		FailFast:      true,
	}
	err := a.PublishBatch(context.Background(), in)
	if err == nil || !strings.Contains(err.Error(), "not sent") {
		t.Fatalf("fail-fast publish after a failure: %v, want a 'not sent' error", err)
	}
	if p.sends != 0 {
		t.Fatalf("%d sends, want none", p.sends)
	}
	a.lastSendFailure.Store(time.Now().Add(-FailFastWindow - time.Millisecond).UnixNano())
	if _, failed := a.sendFailedWithin(FailFastWindow); failed {
		t.Fatal("an old failure must not make publishes fail fast")
	}
}
