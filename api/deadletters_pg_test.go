package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.temporal.io/sdk/client"

	"github.com/claimflow/claimflow/dev/pgtest"
	"github.com/claimflow/claimflow/workflows"
)

// signalTemporal records the dead-letter decisions signalled, fails the
// signals to the runs named in failRuns, and answers coupon updates as
// accepted and then undecided, recording how long each was given.
type signalTemporal struct {
	noDeskRunning
	mu       sync.Mutex
	signals  []signalled
	failRuns map[string]bool
	waits    []time.Duration
}

type signalled struct {
	workflowID, runID string
	decision          workflows.DeadLetterDecision
}

func (f *signalTemporal) NewWithStartWorkflowOperation(client.StartWorkflowOptions, any, ...any) client.WithStartWorkflowOperation {
	return nil
}

func (f *signalTemporal) UpdateWithStartWorkflow(ctx context.Context, o client.UpdateWithStartWorkflowOptions) (client.WorkflowUpdateHandle, error) {
	deadline, ok := ctx.Deadline()
	if !ok {
		return nil, errors.New("test: the wait has no deadline")
	}
	f.mu.Lock()
	f.waits = append(f.waits, time.Until(deadline))
	f.mu.Unlock()
	if o.UpdateOptions.WaitForStage != client.WorkflowUpdateStageAccepted {
		return nil, fmt.Errorf("test: update waits for stage %v, want accepted", o.UpdateOptions.WaitForStage)
	}
	return undecidedUpdate{workflowID: o.UpdateOptions.WorkflowID}, nil
}

func (f *signalTemporal) ExecuteWorkflow(context.Context, client.StartWorkflowOptions, any, ...any) (client.WorkflowRun, error) {
	return nil, errors.New("signalTemporal: no runs")
}

func (f *signalTemporal) SignalWorkflow(_ context.Context, workflowID, runID, name string, arg any) error {
	if name != workflows.SignalDeadLetter {
		return fmt.Errorf("test: signal %q", name)
	}
	d, ok := arg.(workflows.DeadLetterDecision)
	if !ok {
		return fmt.Errorf("test: signal payload %T", arg)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failRuns[runID] {
		return errors.New("test: run not found")
	}
	f.signals = append(f.signals, signalled{workflowID, runID, d})
	return nil
}

func (f *signalTemporal) taken() []signalled {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.signals)
}

// undecidedUpdate was accepted by its run, which has not decided when the
// wait ends.
type undecidedUpdate struct{ workflowID string }

func (u undecidedUpdate) WorkflowID() string { return u.workflowID }
func (u undecidedUpdate) RunID() string      { return "run-use" }
func (u undecidedUpdate) UpdateID() string   { return "update-1" }
func (u undecidedUpdate) Get(context.Context, any) error {
	return context.DeadlineExceeded
}

func newDeadLetterAPI(t *testing.T, db *pgxpool.Pool, tmp *signalTemporal) *testAPI {
	t.Helper()
	auth, err := NewHS256([]byte(testSecret), JWTOptions{})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	h := New(Config{Temporal: tmp, DB: db, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Security: Security{Auth: auth}, Metrics: reg, Gatherer: reg, DecisionTimeout: 5 * time.Second,
		PayoutTimeout: 5 * time.Second})
	t.Cleanup(h.Close)
	return &testAPI{Handler: h}
}

// addDeadLetter inserts an open dead letter of an enrollment event for
// course, first dead-lettered at created, in round rounds; it returns its ID.
func addDeadLetter(ctx context.Context, t *testing.T, db *pgxpool.Pool, event, stage, course string, created time.Time, rounds int) int64 {
	t.Helper()
	payload, _ := json.Marshal(map[string]any{"event_id": event, "data": map[string]any{"course_id": course}})
	var id int64
	err := db.QueryRow(ctx, `
		INSERT INTO dead_letters (event_id, event_type, topic, message_key, payload, workflow_id, run_id, error, rounds, status, stage, created_at)
		VALUES ($1, 'enrollment.confirmed', 'enrollment.events', $2, $3, 'wf-' || $1, 'run-' || $1, 'broker down', $4, 'open', $5, $6)
		RETURNING id`, event, course, payload, rounds, stage, created).Scan(&id)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func statusOfDeadLetter(ctx context.Context, t *testing.T, db *pgxpool.Pool, id int64) string {
	t.Helper()
	var s string
	if err := db.QueryRow(ctx, `SELECT status FROM dead_letters WHERE id = $1`, id).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

func decodeBody(t *testing.T, body []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("body %q: %v", body, err)
	}
	return m
}

// Dead-letter decisions against a private PostgreSQL: the row is marked in
// the statement that takes the decision, so of concurrent calls one wins;
// the signal names the dead letter and its round; the bulk routes decide
// each open dead letter of a filter once.
func TestDeadLetterDecisionsAreTakenOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("decides dead letters in a private PostgreSQL cluster; skipped under -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	db, p := pgtest.DB(t)
	admin := token(t, "admin-1", RoleAdmin, time.Hour)
	base := time.Date(2026, 12, 1, 5, 0, 0, 0, time.UTC)

	t.Run("concurrent decisions on one dead letter: one 202, the rest 409", func(t *testing.T) {
		for _, action := range []workflows.DeadLetterAction{workflows.ActionCompensate, workflows.ActionRetry} {
			tmp := &signalTemporal{}
			a := newDeadLetterAPI(t, db, tmp)
			id := addDeadLetter(ctx, t, db, p+"one-"+string(action), "publish", p+"c-one", base, 2)
			codes := make([]int, 8)
			errs := make([]string, 8)
			var wg sync.WaitGroup
			for i := range codes {
				wg.Add(1)
				go func() {
					defer wg.Done()
					// half of them the other action: a second operator deciding otherwise
					act := action
					if i%2 == 1 {
						act = map[workflows.DeadLetterAction]workflows.DeadLetterAction{
							workflows.ActionRetry: workflows.ActionCompensate, workflows.ActionCompensate: workflows.ActionRetry}[action]
					}
					rec := a.call(http.MethodPost, fmt.Sprintf("/v1/dead-letters/%d/%s", id, act), admin, nil)
					codes[i] = rec.Code
					if rec.Code == http.StatusConflict {
						errs[i] = errorOf(t, rec).Code
					}
				}()
			}
			wg.Wait()
			for i, e := range errs {
				if codes[i] == http.StatusConflict && e != "dead_letter_not_open" {
					t.Errorf("409 with %s, want dead_letter_not_open", e)
				}
			}
			accepted := 0
			for _, c := range codes {
				switch c {
				case http.StatusAccepted:
					accepted++
				case http.StatusConflict:
				default:
					t.Errorf("a decision answered %d, want 202 or 409", c)
				}
			}
			sig := tmp.taken()
			if accepted != 1 || len(sig) != 1 {
				t.Fatalf("%s: %d answered 202 and %d signals went out, want one of each (codes %v)", action, accepted, len(sig), codes)
			}
			want := map[workflows.DeadLetterAction]string{workflows.ActionRetry: "retrying", workflows.ActionCompensate: "compensating"}
			if d := sig[0].decision; d.DeadLetterID != id || d.Round != 2 || want[d.Action] == "" {
				t.Errorf("signalled %+v, want dead letter %d round 2", d, id)
			} else if got := statusOfDeadLetter(ctx, t, db, id); got != want[d.Action] {
				t.Errorf("after %s the row is %s, want %s", d.Action, got, want[d.Action])
			}
			if sig[0].runID != fmt.Sprintf("run-%sone-%s", p, action) {
				t.Errorf("signalled run %q, want the dead letter's run", sig[0].runID)
			}
		}
	})

	t.Run("a decision the run did not get leaves the dead letter open", func(t *testing.T) {
		tmp := &signalTemporal{failRuns: map[string]bool{"run-" + p + "gone": true}}
		a := newDeadLetterAPI(t, db, tmp)
		id := addDeadLetter(ctx, t, db, p+"gone", "publish", p+"c-gone", base, 1)
		rec := a.call(http.MethodPost, fmt.Sprintf("/v1/dead-letters/%d/compensate", id), admin, nil)
		if rec.Code != http.StatusServiceUnavailable {
			t.Fatalf("= %d %s, want 503", rec.Code, rec.Body.String())
		}
		if got := statusOfDeadLetter(ctx, t, db, id); got != "open" {
			t.Errorf("the row is %s, want open again", got)
		}
		if rec := a.call(http.MethodPost, "/v1/dead-letters/999999/retry", admin, nil); rec.Code != http.StatusNotFound {
			t.Errorf("unknown dead letter: %d, want 404", rec.Code)
		}
	})

	t.Run("bulk decisions take each open dead letter of the filter once", func(t *testing.T) {
		tmp := &signalTemporal{failRuns: map[string]bool{"run-" + p + "bulk-5": true}}
		a := newDeadLetterAPI(t, db, tmp)
		var ids []int64
		for i := range 6 {
			ids = append(ids, addDeadLetter(ctx, t, db, fmt.Sprintf("%sbulk-%d", p, i), "publish", p+"c-bulk", base.Add(time.Duration(i)*time.Minute), 1))
		}
		other := addDeadLetter(ctx, t, db, p+"bulk-other-course", "publish", p+"c-bulk-other", base, 1)
		consume := addDeadLetter(ctx, t, db, p+"bulk-consume", "consume", p+"c-bulk", base, 1)
		late := addDeadLetter(ctx, t, db, p+"bulk-late", "publish", p+"c-bulk", base.Add(time.Hour), 1)

		filter := map[string]any{"stage": "publish", "course_id": p + "c-bulk", "opened_after": base.Format(time.RFC3339),
			"opened_before": base.Add(30 * time.Minute).Format(time.RFC3339), "limit": 2}
		// limit 2: two calls take four, the third the fifth and the one
		// whose run is gone (open again), the fourth only that one.
		want := []struct {
			ids    []int64
			failed int
			more   bool
		}{
			{ids[0:2], 0, true}, {ids[2:4], 0, true}, {ids[4:5], 1, true}, {nil, 1, false},
		}
		var decided []int64
		for call, w := range want {
			rec := a.call(http.MethodPost, "/v1/dead-letters/retry", admin, filter)
			if rec.Code != http.StatusAccepted {
				t.Fatalf("bulk retry = %d %s, want 202", rec.Code, rec.Body.String())
			}
			var got struct {
				Signalled int     `json:"signalled"`
				IDs       []int64 `json:"ids"`
				Failed    []struct {
					ID int64 `json:"id"`
				} `json:"failed"`
				More bool `json:"more"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
				t.Fatal(err)
			}
			if got.Signalled != len(got.IDs) || !slices.Equal(got.IDs, w.ids) || len(got.Failed) != w.failed || got.More != w.more {
				t.Errorf("call %d: %s, want ids %v, %d failed, more %v", call+1, rec.Body.String(), w.ids, w.failed, w.more)
			}
			for _, f := range got.Failed {
				if f.ID != ids[5] {
					t.Errorf("dead letter %d failed, want only %d (its run is gone)", f.ID, ids[5])
				}
			}
			decided = append(decided, got.IDs...)
		}
		if !slices.Equal(decided, ids[:5]) {
			t.Errorf("decided %v, want the filter's open dead letters oldest first %v", decided, ids[:5])
		}
		for _, id := range ids[:5] {
			if s := statusOfDeadLetter(ctx, t, db, id); s != "retrying" {
				t.Errorf("dead letter %d is %s, want retrying", id, s)
			}
		}
		for _, id := range []int64{ids[5], other, consume, late} {
			if s := statusOfDeadLetter(ctx, t, db, id); s != "open" {
				t.Errorf("dead letter %d outside the decision is %s, want open", id, s)
			}
		}
		byID := map[int64]int{}
		for _, s := range tmp.taken() {
			byID[s.decision.DeadLetterID]++
			if s.decision.Action != workflows.ActionRetry || s.decision.Round != 1 {
				t.Errorf("signalled %+v, want retry of round 1", s.decision)
			}
		}
		for _, id := range ids[:5] {
			if byID[id] != 1 {
				t.Errorf("dead letter %d signalled %d times, want once", id, byID[id])
			}
		}

		// Concurrent bulk calls decide disjoint sets.
		var many []int64
		for i := range 40 {
			many = append(many, addDeadLetter(ctx, t, db, fmt.Sprintf("%srace-%d", p, i), "consume", p+"c-race", base, 1))
		}
		var mu sync.Mutex
		seen := map[int64]int{}
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rec := a.call(http.MethodPost, "/v1/dead-letters/compensate", admin, map[string]any{"course_id": p + "c-race", "limit": 15})
				if rec.Code != http.StatusAccepted {
					t.Errorf("bulk compensate = %d %s", rec.Code, rec.Body.String())
					return
				}
				var got struct {
					IDs []int64 `json:"ids"`
				}
				_ = json.Unmarshal(rec.Body.Bytes(), &got)
				mu.Lock()
				for _, id := range got.IDs {
					seen[id]++
				}
				mu.Unlock()
			}()
		}
		wg.Wait()
		if len(seen) != len(many) {
			t.Errorf("four concurrent calls of 15 decided %d of %d dead letters", len(seen), len(many))
		}
		for id, n := range seen {
			if n != 1 {
				t.Errorf("dead letter %d decided by %d calls", id, n)
			}
		}
	})

	t.Run("bulk filters are validated", func(t *testing.T) {
		a := newDeadLetterAPI(t, db, &signalTemporal{})
		for _, tc := range []struct {
			body  any
			field string
		}{
			{map[string]any{"limit": 0}, "limit"},
			{map[string]any{"limit": 1001}, "limit"},
			{map[string]any{"stage": "nope"}, "stage"},
			{map[string]any{"course_id": "c1", "coupon_type_id": "t1"}, "coupon_type_id"},
			{map[string]any{"opened_before": "yesterday"}, "opened_before"},
			{map[string]any{"opened_after": "2026-13-01T00:00:00Z"}, "opened_after"},
			{map[string]any{"topic": "a topic"}, "topic"},
			{map[string]any{"status": "open"}, "status"},
		} {
			rec := a.call(http.MethodPost, "/v1/dead-letters/retry", admin, tc.body)
			if rec.Code != http.StatusBadRequest {
				t.Errorf("%v = %d %s, want 400", tc.body, rec.Code, rec.Body.String())
				continue
			}
			if e := errorOf(t, rec); e.Field != tc.field {
				t.Errorf("%v: error %+v, want field %s", tc.body, e, tc.field)
			}
		}
		if rec := a.call(http.MethodPost, "/v1/dead-letters/retry", token(t, "s-1", "", time.Hour), map[string]any{}); rec.Code != http.StatusForbidden {
			t.Errorf("a student's bulk retry = %d, want 403", rec.Code)
		}
	})

	// A coupon use waits as long as the workflow's own options let its
	// decision take; once its run accepted it, a wait that ends undecided
	// answers 202 with the coupon's status URL, not 503.
	t.Run("an undecided use answers 202 with its status URL after the derived wait", func(t *testing.T) {
		for _, q := range []string{
			`INSERT INTO vendors (id, name) VALUES ($1 || 'v', 'v')`,
			`INSERT INTO coupon_types (id, vendor_id, name, stock, issued, payout_cents) VALUES ($1 || 't', $1 || 'v', 't', 5, 1, 100)`,
			`INSERT INTO coupons (id, type_id, user_id, status, workflow_id, run_id, requested_at, issued_at)
			VALUES ($1 || 'cp', $1 || 't', $1 || 'u', 'issued', 'wf', 'run', now(), now())`,
		} {
			if _, err := db.Exec(ctx, q, p); err != nil {
				t.Fatal(err)
			}
		}
		coupon := "/v1/coupons/" + p + "cp"
		tmp := &signalTemporal{}
		a := newDeadLetterAPI(t, db, tmp)
		rec := a.call(http.MethodPost, coupon+"/use", admin, map[string]any{"user_id": p + "u"})
		if rec.Code != http.StatusAccepted {
			t.Fatalf("= %d %s, want 202", rec.Code, rec.Body.String())
		}
		body := decodeBody(t, rec.Body.Bytes())
		if rec.Header().Get("Location") != coupon || body["status_url"] != coupon ||
			body["status"] != "pending" || body["use_id"] == "" || body["run_id"] != "run-use" {
			t.Errorf("202 with Location %q and %v, want the coupon's status URL", rec.Header().Get("Location"), body)
		}
		want, err := workflows.DecisionDeadline(workflows.ClaimUseCoupon, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		tmp.mu.Lock()
		waits := slices.Clone(tmp.waits)
		tmp.mu.Unlock()
		if len(waits) != 1 || waits[0] > want || waits[0] < want-5*time.Second {
			t.Errorf("the use waited %v, want the workflow's decision deadline %v", waits, want)
		}
	})
}
