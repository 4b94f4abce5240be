package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/claimflow/claimflow/dev/audit"
	"github.com/claimflow/claimflow/dev/notifysim"
	"github.com/claimflow/claimflow/workflows"
)

// TestAuditFindsDuplicateEffects runs the consumer and `claimflow audit` on
// topics holding what the guarantee allows and what it rules out: the
// command exits non-zero on a real duplicate effect and reports
// redelivered copies and webhook re-sends without failing.
func TestAuditFindsDuplicateEffects(t *testing.T) {
	if testing.Short() {
		t.Skip("integration tests start the real stack; skipped with -short")
	}
	s := testStack(t, dataDir(t))
	if s.Notify == nil {
		t.Skip("needs the notification simulator (NOTIFY_WEBHOOK_URL is set)")
	}
	const n = 60
	cases := []struct {
		name string
		// sink is the simulator's behaviour while the consumer runs.
		sink notifysim.Setting
		// extra is produced after the n events.
		extra func(events []workflows.Message) []workflows.Message
		fails bool
		check func(t *testing.T, r audit.Report)
	}{
		{
			name: "copies with one event ID are redelivered, not duplicated",
			sink: notifysim.Setting{Mode: notifysim.Healthy},
			extra: func(ev []workflows.Message) []workflows.Message {
				return []workflows.Message{ev[3], ev[7], ev[3]}
			},
			check: func(t *testing.T, r audit.Report) {
				if r.Redelivered != 3 || r.Events != n || r.Delivered != n || r.DuplicateEffects != 0 || r.Webhook.Effects != n {
					t.Errorf("report %+v, want 3 redelivered copies and %d events delivered once", r, n)
				}
			},
		},
		{
			name: "webhook answers lost: re-sent under the same key, one effect each",
			// The first two batches take effect but their answers are lost:
			// their events go to DeliverEvent runs, which send them again.
			sink:  notifysim.Setting{Mode: notifysim.Healthy, LoseAnswers: 2},
			extra: func([]workflows.Message) []workflows.Message { return nil },
			check: func(t *testing.T, r audit.Report) {
				l := r.Webhook
				if r.Delivered != n || l.Keys != n || l.Effects != n || l.Resent == 0 || l.Resent != r.ViaWorkflow {
					t.Errorf("report %+v, webhook %+v: want every key re-sent once per lost answer, each taking effect once", r, l)
				}
			},
		},
		{
			name: "one claim under a second event ID is a duplicate effect",
			sink: notifysim.Setting{Mode: notifysim.Healthy},
			extra: func(ev []workflows.Message) []workflows.Message {
				// A publisher that made up a new ID for its retry: the
				// consumer cannot tell, and the student hears twice.
				again := ev[5]
				again.Event.ID = "not-derived-from-the-claim"
				again.Event.OccurredAt = again.Event.OccurredAt.Add(time.Second)
				return []workflows.Message{again}
			},
			fails: true,
			check: func(t *testing.T, r audit.Report) {
				if r.ClaimDuplicates != 1 || r.DuplicateEffects != 1 || r.Redelivered != 0 {
					t.Errorf("report %+v, want one claim duplicated on the topic and in the notifications", r)
				}
			},
		},
		{
			name: "a copy with another payload under one event ID",
			sink: notifysim.Setting{Mode: notifysim.Healthy},
			extra: func(ev []workflows.Message) []workflows.Message {
				other := ev[9]
				other.Event.Data = map[string]any{"enrollment_id": "someone", "course_id": other.Key, "student_id": "else"}
				return []workflows.Message{other}
			},
			fails: true,
			check: func(t *testing.T, r audit.Report) {
				if r.PayloadMismatches != 1 || r.Redelivered != 1 {
					t.Errorf("report %+v, want one copy with another payload", r)
				}
			},
		},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			topic := consumerTopic(t, s, fmt.Sprintf("audit%d", i), 3)
			group := topic + ".group"
			events := testEvents(fmt.Sprintf("audit%d", i), n, 6)
			extra := tc.extra(events)
			distinct := map[string]bool{}
			for _, m := range append(events, extra...) {
				distinct[m.Event.ID] = true
			}
			setSink(t, s, tc.sink)
			produce(t, s, topic, events)
			produce(t, s, topic, extra)
			c := startTestConsumer(t, s, topic, group, 20)
			waitCaughtUp(t, s, topic, group, 2*time.Minute)
			// Events handed to DeliverEvent are committed before their row.
			waitFor(t, time.Minute, "every distinct event notified", func() bool {
				return notificationCount(t, s, topic) >= len(distinct)
			})
			if err := c.Stop(); err != nil {
				t.Fatal(err)
			}

			var out strings.Builder
			log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
			err := runAudit(context.Background(), s.Config, log,
				[]string{"-topics", topic, "-group", group, "-json", "-webhook-ledger", s.Notify.URL}, &out)
			var r audit.Report
			if jerr := json.Unmarshal([]byte(out.String()), &r); jerr != nil {
				t.Fatalf("claimflow audit -json printed %q: %v (exit error %v)", out.String(), jerr, err)
			}
			t.Logf("claimflow audit: %v\n%s", err, out.String())
			if tc.fails != errors.Is(err, audit.ErrFailed) || tc.fails == r.OK() {
				t.Fatalf("claimflow audit returned %v with OK()=%v, want failure %v", err, r.OK(), tc.fails)
			}
			if r.Webhook == nil {
				t.Fatal("the audit did not read the webhook's ledger")
			}
			tc.check(t, r)
		})
	}
}
