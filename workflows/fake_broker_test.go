package workflows_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.temporal.io/sdk/activity"

	"github.com/claimflow/claimflow/workflows"
)

// fakeBroker is the Kafka and dead-letter side that the enrollment and
// coupon fakes share: publish attempts (failing on demand), what the broker
// acknowledged, and the dead letters recorded and resolved. It has its own
// lock; a fake may call it while holding its own (never the other way).
type fakeBroker struct {
	bmu sync.Mutex
	// failPublish makes publish fail for an event type: n > 0 fails the next
	// n attempts, n < 0 fails every attempt. Tests set it before the run.
	failPublish     map[string]int
	publishAttempts []publishAttempt
	published       []workflows.Message // messages the broker acknowledged
	dltCopies       []workflows.Message // copies sent to the .DLT topic
	deadLetterCalls []deadLetterCall
	deadLetters     map[int64]*fakeDeadLetter
	resolutions     []workflows.ResolveDeadLetterInput
	nextDeadLetter  int64
}

func newFakeBroker() fakeBroker {
	return fakeBroker{failPublish: map[string]int{}, deadLetters: map[int64]*fakeDeadLetter{}, nextDeadLetter: 100}
}

type publishAttempt struct {
	EventID   string
	EventType string
	Attempt   int32
	At        time.Time
	Failed    bool
}

type deadLetterCall struct {
	In workflows.DeadLetterInput
	At time.Time
}

type fakeDeadLetter struct {
	ID           int64
	Message      workflows.Message
	EnrollmentID string
	Rounds       int
	State        workflows.DeadLetterState
}

// publish is the Publish activity's broker side: an attempt, acked unless
// failPublish says otherwise.
func (b *fakeBroker) publish(ctx context.Context, in workflows.PublishInput, now time.Time) error {
	b.bmu.Lock()
	defer b.bmu.Unlock()
	attempt := publishAttempt{EventID: in.Message.Event.ID, EventType: in.Message.Event.Type,
		Attempt: activity.GetInfo(ctx).Attempt, At: now}
	if n := b.failPublish[in.Message.Event.Type]; n != 0 {
		if n > 0 {
			b.failPublish[in.Message.Event.Type] = n - 1
		}
		attempt.Failed = true
		b.publishAttempts = append(b.publishAttempts, attempt)
		return fmt.Errorf("publish %s to %s: %w", in.Message.Event.ID, in.Message.Topic, errBrokerDown)
	}
	b.publishAttempts = append(b.publishAttempts, attempt)
	b.published = append(b.published, in.Message)
	return nil
}

// recordDeadLetter is RecordDeadLetter's side: one open dead letter per
// event ID (a repeat reopens it), and a copy on the .DLT topic.
func (b *fakeBroker) recordDeadLetter(in workflows.DeadLetterInput, now time.Time) workflows.DeadLetterRecord {
	b.bmu.Lock()
	defer b.bmu.Unlock()
	b.deadLetterCalls = append(b.deadLetterCalls, deadLetterCall{In: in, At: now})
	var dl *fakeDeadLetter
	for _, d := range b.deadLetters {
		if d.Message.Event.ID == in.Message.Event.ID {
			dl = d
		}
	}
	if dl == nil {
		b.nextDeadLetter++
		dl = &fakeDeadLetter{ID: b.nextDeadLetter, Message: in.Message, EnrollmentID: in.EnrollmentID}
		b.deadLetters[dl.ID] = dl
	}
	dl.State = workflows.DeadLetterOpen
	dl.Rounds = max(dl.Rounds, in.Round)
	copied := in.Message
	copied.Topic += ".DLT"
	b.dltCopies = append(b.dltCopies, copied)
	return workflows.DeadLetterRecord{ID: dl.ID, Round: dl.Rounds}
}

func (b *fakeBroker) resolveDeadLetter(in workflows.ResolveDeadLetterInput) {
	b.bmu.Lock()
	defer b.bmu.Unlock()
	b.resolutions = append(b.resolutions, in)
	if dl, ok := b.deadLetters[in.ID]; ok {
		dl.State = in.State
	}
}

// ---- accessors (copies under the lock) ----

// failPublishing makes the next n publishes of eventType fail (n < 0: all).
func (b *fakeBroker) failPublishing(eventType string, n int) {
	b.bmu.Lock()
	defer b.bmu.Unlock()
	b.failPublish[eventType] = n
}

func (b *fakeBroker) publishedMessages() []workflows.Message {
	b.bmu.Lock()
	defer b.bmu.Unlock()
	return slices.Clone(b.published)
}

func (b *fakeBroker) publishedOf(eventType string) []workflows.Message {
	b.bmu.Lock()
	defer b.bmu.Unlock()
	var out []workflows.Message
	for _, m := range b.published {
		if m.Event.Type == eventType {
			out = append(out, m)
		}
	}
	return out
}

func (b *fakeBroker) attemptsOf(eventType string) []publishAttempt {
	b.bmu.Lock()
	defer b.bmu.Unlock()
	var out []publishAttempt
	for _, a := range b.publishAttempts {
		if a.EventType == eventType {
			out = append(out, a)
		}
	}
	return out
}

func (b *fakeBroker) deadLetterInputs() []deadLetterCall {
	b.bmu.Lock()
	defer b.bmu.Unlock()
	return slices.Clone(b.deadLetterCalls)
}

func (b *fakeBroker) deadLetter(id int64) fakeDeadLetter {
	b.bmu.Lock()
	defer b.bmu.Unlock()
	if d, ok := b.deadLetters[id]; ok {
		return *d
	}
	return fakeDeadLetter{}
}

func (b *fakeBroker) resolved() []workflows.ResolveDeadLetterInput {
	b.bmu.Lock()
	defer b.bmu.Unlock()
	return slices.Clone(b.resolutions)
}
