package main

// Coupon integration tests on the real stack (Temporal dev server, kfake or
// Apache Kafka, PostgreSQL, the payout simulator), driven through the API.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"

	"github.com/claimflow/claimflow/dev/payoutsim"
	"github.com/claimflow/claimflow/workflows"
)

// couponEvents reads every event on a coupon topic from the beginning and
// checks that each is keyed by its coupon type.
func couponEvents(t *testing.T, s *stack, topic string) []workflows.Event {
	t.Helper()
	return readTopic(t, s.Config.KafkaBrokers, topic, "coupon_type_id")
}

// couponEventsOf counts the events of one type per coupon, checking that
// every event ID is the deterministic one.
func couponEventsOf(events []workflows.Event, eventType string) map[string]int {
	out := map[string]int{}
	for _, e := range events {
		if e.Type != eventType {
			continue
		}
		id, _ := e.Data["coupon_id"].(string)
		want := workflows.EventID(id, eventType)
		if eventType == workflows.EventCouponUsed || eventType == workflows.EventCouponUseFailed {
			useID, _ := e.Data["use_id"].(string)
			want = workflows.EventID(workflows.PayoutKey(id, useID), eventType)
		}
		if e.ID != want {
			id = "bad event id: " + e.ID
		}
		out[id]++
	}
	return out
}

// eventOf returns the one event of eventType for coupon.
func eventOf(t *testing.T, s *stack, eventType, couponID string) workflows.Event {
	t.Helper()
	var found []workflows.Event
	for _, e := range couponEvents(t, s, workflows.CouponTopic) {
		if e.Type == eventType && e.Data["coupon_id"] == couponID {
			found = append(found, e)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d %s events for coupon %s, want 1: %v", len(found), eventType, couponID, found)
	}
	return found[0]
}

// waitRunDone waits until a run has done all its work: it then waits for
// its starter's update (a timer) or, were it not to wait, closes.
func waitRunDone(ctx context.Context, t *testing.T, s *stack, workflowID, runID, what string) {
	t.Helper()
	waitFor(t, 30*time.Second, "the run done with "+what, func() bool {
		h, err := fetchHistory(ctx, s.Client, runRef{workflowID, runID})
		return err == nil && slices.ContainsFunc(h.GetEvents(), func(ev *historypb.HistoryEvent) bool {
			return ev.GetTimerStartedEventAttributes() != nil || ev.GetWorkflowExecutionCompletedEventAttributes() != nil
		})
	})
}

// useWithLateStarter starts a coupon's use run without the starter's
// update, waits until the run has done its work, then sends that update (as
// the client's retry does under load), and returns the run and the answer.
func useWithLateStarter(t *testing.T, s *stack, c *apiClient, couponID, user string) (client.WorkflowRun, workflows.CouponDecision) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req := workflows.UseRequest{UseID: "late-" + couponID, UserID: user, RequestedAt: time.Now().UTC()}
	workflowID := workflows.UseCouponWorkflowID(couponID)
	run, err := s.Client.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: workflowID, TaskQueue: workflows.TaskQueue},
		workflows.UseCoupon, workflows.UseCouponInput{CouponID: couponID, Request: req, AnswerWait: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	waitRunDone(ctx, t, s, workflowID, run.GetRunID(), "its use")
	if got := c.must("GET", "/v1/coupons/"+couponID, nil, http.StatusOK); got["status"] != "used" {
		t.Fatalf("the coupon after the run's use: %v", got)
	}
	h, err := s.Client.UpdateWorkflow(ctx, client.UpdateWorkflowOptions{WorkflowID: workflowID,
		UpdateName: workflows.UpdateDecision, Args: []any{req}, WaitForStage: client.WorkflowUpdateStageCompleted})
	if err != nil {
		t.Fatalf("the starter's update after the use: %v", err)
	}
	var d workflows.CouponDecision
	if err := h.Get(ctx, &d); err != nil {
		t.Fatal(err)
	}
	if d.UseID != req.UseID {
		t.Fatalf("the starter's late update answered %+v, want the decision of use %s", d, req.UseID)
	}
	return run, d
}

// issueWithLateStarter starts a coupon's issue run naming a starter's
// update that it does not send, waits until the run has decided and done
// its work, then sends that update (as the client's retry does under load),
// and returns the run, the coupon ID and the answer.
func issueWithLateStarter(t *testing.T, s *stack, c *apiClient, typeID, user string) (client.WorkflowRun, string, workflows.CouponDecision) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	couponID := uuid.NewString()
	in := workflows.IssueCouponInput{CouponID: couponID, TypeID: typeID, UserID: user, RequestedAt: time.Now().UTC(),
		StarterUpdateID: couponID, AnswerWait: 2 * time.Minute}
	workflowID := workflows.IssueCouponWorkflowID(typeID, user)
	run, err := s.Client.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: workflowID, TaskQueue: workflows.TaskQueue},
		workflows.IssueCoupon, in)
	if err != nil {
		t.Fatal(err)
	}
	waitRunDone(ctx, t, s, workflowID, run.GetRunID(), "its issue")
	if got := c.must("GET", "/v1/coupons/"+couponID, nil, http.StatusOK); got["status"] != "issued" {
		t.Fatalf("the coupon after the run's issue: %v", got)
	}
	h, err := s.Client.UpdateWorkflow(ctx, client.UpdateWorkflowOptions{WorkflowID: workflowID, UpdateID: couponID,
		UpdateName: workflows.UpdateDecision, WaitForStage: client.WorkflowUpdateStageCompleted})
	if err != nil {
		t.Fatalf("the starter's update after the issue: %v", err)
	}
	var d workflows.CouponDecision
	if err := h.Get(ctx, &d); err != nil {
		t.Fatal(err)
	}
	return run, couponID, d
}

// setPayoutMode switches the payout simulator through its admin endpoint.
func setPayoutMode(t *testing.T, s *stack, mode payoutsim.Mode, count int) {
	t.Helper()
	body, _ := json.Marshal(payoutsim.Setting{Mode: mode, Count: count})
	req, err := http.NewRequest(http.MethodPut, s.Payout.URL+"/admin/mode", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("PUT /admin/mode %s: %d", body, resp.StatusCode)
	}
}

// simPayouts returns what the payout simulator paid for coupon.
func simPayouts(s *stack, couponID string) []payoutsim.Payout {
	var out []payoutsim.Payout
	for _, p := range s.Payout.Payouts() {
		if p.CouponID == couponID && p.Status == "paid" {
			out = append(out, p)
		}
	}
	return out
}

func ledgerRows(t *testing.T, s *stack, couponID string) int {
	t.Helper()
	var n int
	if err := s.Pool.QueryRow(context.Background(), `SELECT count(*) FROM payouts WHERE coupon_id = $1`, couponID).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestCoupons(t *testing.T) {
	if testing.Short() {
		t.Skip("integration tests start the real stack; skipped with -short")
	}
	// A short payout timeout keeps the lost-answer case quick; the policy is
	// the same.
	t.Setenv("PAYOUT_TIMEOUT", "2s")
	s := testStack(t, dataDir(t))
	if s.Payout == nil {
		t.Fatal("the stack did not start the payout simulator")
	}
	c := newAPIClient(t, s)
	// IDs unique to this run, for a real Kafka broker shared between runs.
	run := fmt.Sprintf("%d", time.Now().UnixNano()%1_000_000)
	vendorID := "acme-" + run
	v := c.must("POST", "/v1/vendors", map[string]any{"id": vendorID, "name": "Acme Coffee"}, http.StatusCreated)
	if v["balance_cents"] != float64(0) {
		t.Fatalf("new vendor: %v", v)
	}
	newType := func(name string, stock int) string {
		t.Helper()
		id := name + "-" + run
		ct := c.must("POST", "/v1/coupon-types", map[string]any{"id": id, "vendor_id": vendorID, "name": name,
			"stock": stock, "payout_cents": 250}, http.StatusCreated)
		if ct["issued"] != float64(0) || ct["remaining"] != float64(stock) {
			t.Fatalf("new coupon type: %v", ct)
		}
		return id
	}
	issue := func(typeID, user string) string {
		t.Helper()
		k := c.must("POST", "/v1/coupon-types/"+typeID+"/coupons", map[string]any{"user_id": user}, http.StatusCreated)
		if k["status"] != "issued" || k["workflow_id"] != workflows.IssueCouponWorkflowID(typeID, user) {
			t.Fatalf("issue answered %v", k)
		}
		return k["id"].(string)
	}
	useTypeID := newType("use", 100)
	paid := 0 // payouts of 250 cents the vendor should have

	t.Run("1000 concurrent claims on a stock of 100 issue exactly 100", func(t *testing.T) {
		typeID := newType("hot", 100)
		const users, concurrency = 1000, 100
		type answer struct {
			status int
			body   map[string]any
			err    error
			took   time.Duration
		}
		answers := make([]answer, users)
		next := make(chan int, users)
		for i := range users {
			next <- i
		}
		close(next)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for range concurrency {
			wg.Go(func() {
				<-start
				for i := range next {
					sent := time.Now()
					st, body, err := c.do("POST", "/v1/coupon-types/"+typeID+"/coupons", map[string]any{"user_id": fmt.Sprintf("u-%04d", i)})
					answers[i] = answer{st, body, err, time.Since(sent)}
				}
			})
		}
		began := time.Now()
		close(start)
		wg.Wait()
		took := time.Since(began)
		latencies := make([]time.Duration, users)
		for i, a := range answers {
			latencies[i] = a.took
		}
		slices.Sort(latencies)
		t.Logf("%d claims through %d concurrent clients answered in %s (%.0f/s); latency p50 %s p95 %s max %s", users, concurrency,
			took.Round(time.Millisecond), float64(users)/took.Seconds(), latencies[users/2].Round(time.Millisecond),
			latencies[users*95/100].Round(time.Millisecond), latencies[users-1].Round(time.Millisecond))

		created, soldOut := 0, 0
		ids := map[string]bool{}
		for i, a := range answers {
			switch {
			case a.err != nil:
				t.Errorf("user %d: %v", i, a.err)
			case a.status == http.StatusCreated:
				created++
				ids[a.body["id"].(string)] = true
			case a.status == http.StatusConflict && errorCode(a.body) == "sold_out":
				soldOut++
			default:
				t.Errorf("user %d: %d %v", i, a.status, a.body)
			}
		}
		if created != 100 || soldOut != 900 || len(ids) != 100 {
			t.Fatalf("issued=%d (distinct %d) sold_out=%d, want 100, 100, 900", created, len(ids), soldOut)
		}
		ct := c.must("GET", "/v1/coupon-types/"+typeID, nil, http.StatusOK)
		if ct["issued"] != float64(100) || ct["remaining"] != float64(0) || ct["stock"] != float64(100) {
			t.Fatalf("coupon type after the rush: %v", ct)
		}
		var rows int
		if err := s.Pool.QueryRow(context.Background(),
			`SELECT count(*) FROM coupons WHERE type_id = $1 AND status = 'issued'`, typeID).Scan(&rows); err != nil {
			t.Fatal(err)
		}
		if rows != 100 {
			t.Fatalf("%d coupon rows, want 100", rows)
		}
		waitFor(t, time.Minute, "100 coupon.issued events", func() bool {
			n := 0
			for id, k := range couponEventsOf(couponEvents(t, s, workflows.CouponTopic), workflows.EventCouponIssued) {
				if ids[id] && k == 1 {
					n++
				}
			}
			return n == 100
		})
		// How many claims a run decided (the rest were answered from the
		// database once the stock was gone); visibility may lag a little.
		time.Sleep(2 * time.Second)
		for _, q := range []string{"ClaimStatus = 'issued'", "ClaimStatus = 'sold_out'"} {
			resp, err := s.Client.CountWorkflow(context.Background(), &workflowservice.CountWorkflowExecutionsRequest{
				Namespace: s.Config.Namespace, Query: fmt.Sprintf("CouponTypeId = '%s' AND %s", typeID, q)})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("runs with %s: %d", q, resp.Count)
		}
		// A sold-out user asking again is still told sold_out; a winner is
		// told already_issued with the coupon it holds.
		again := c.must("POST", "/v1/coupon-types/"+typeID+"/coupons", map[string]any{"user_id": "u-late"}, http.StatusConflict)
		if errorCode(again) != "sold_out" {
			t.Fatalf("late claim: %v", again)
		}
		for i, a := range answers {
			if a.status == http.StatusCreated {
				dup := c.must("POST", "/v1/coupon-types/"+typeID+"/coupons", map[string]any{"user_id": fmt.Sprintf("u-%04d", i)}, http.StatusConflict)
				if errorCode(dup) != "already_issued" || dup["coupon_id"] != a.body["id"] {
					t.Fatalf("a winner claiming again: %v", dup)
				}
				break
			}
		}
	})

	t.Run("50 concurrent uses of one coupon use it once and pay once", func(t *testing.T) {
		couponID := issue(useTypeID, "u-fifty")
		const requests = 50
		type answer struct {
			status int
			body   map[string]any
			err    error
		}
		answers := make([]answer, requests)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range requests {
			wg.Go(func() {
				<-start
				st, body, err := c.do("POST", "/v1/coupons/"+couponID+"/use", map[string]any{"user_id": "u-fifty", "order_id": fmt.Sprintf("o-%02d", i)})
				answers[i] = answer{st, body, err}
			})
		}
		began := time.Now()
		close(start)
		wg.Wait()
		t.Logf("%d concurrent uses answered in %s", requests, time.Since(began).Round(time.Millisecond))
		used, already := 0, 0
		var payout map[string]any
		for i, a := range answers {
			switch {
			case a.err != nil:
				t.Errorf("request %d: %v", i, a.err)
			case a.status == http.StatusOK && a.body["status"] == "used":
				used++
				payout, _ = a.body["payout"].(map[string]any)
			case a.status == http.StatusConflict && errorCode(a.body) == "already_used":
				already++
			default:
				t.Errorf("request %d: %d %v", i, a.status, a.body)
			}
		}
		if used != 1 || already != 49 {
			logUseRuns(t, s, couponID)
			t.Fatalf("used=%d already_used=%d, want 1 and 49", used, already)
		}
		paid++
		key, _ := payout["idempotency_key"].(string)
		if payout["amount_cents"] != float64(250) || payout["vendor_id"] != vendorID || key == "" {
			t.Fatalf("payout in the answer: %v", payout)
		}
		if sim := simPayouts(s, couponID); len(sim) != 1 || sim[0].IdempotencyKey != key || sim[0].Attempts != 1 {
			// The counts first: CI keeps the first 400 characters of a failure.
			logUseRuns(t, s, couponID)
			t.Fatalf("the payout API paid %d payouts, want one under %s, requested once; paid %+v", len(sim), key, sim)
		}
		if n := ledgerRows(t, s, couponID); n != 1 {
			t.Fatalf("%d ledger rows, want 1", n)
		}
		got := c.must("GET", "/v1/coupons/"+couponID, nil, http.StatusOK)
		p, _ := got["payout"].(map[string]any)
		if got["status"] != "used" || got["used_at"] == nil || p["idempotency_key"] != key {
			t.Fatalf("coupon after use: %v", got)
		}
		waitFor(t, 30*time.Second, "coupon.used", func() bool {
			return couponEventsOf(couponEvents(t, s, workflows.CouponTopic), workflows.EventCouponUsed)[couponID] >= 1
		})
		time.Sleep(time.Second) // a wrongly duplicated publish would show up by now
		if n := couponEventsOf(couponEvents(t, s, workflows.CouponTopic), workflows.EventCouponUsed)[couponID]; n != 1 {
			t.Fatalf("%d coupon.used events, want 1", n)
		}
		// Later attempts, by the owner or anyone else.
		c.must("POST", "/v1/coupons/"+couponID+"/use", map[string]any{"user_id": "u-fifty"}, http.StatusConflict)
		other := c.must("POST", "/v1/coupons/"+couponID+"/use", map[string]any{"user_id": "u-other"}, http.StatusNotFound)
		if errorCode(other) != "coupon_not_found" {
			t.Fatalf("another user's use: %v", other)
		}
	})

	// Under load the starter's update can reach the run only after the run
	// used the coupon (through the client's retry). The run waits for it
	// (AnswerWait) and answers it with its use; a run that closed first
	// would leave it to another run that answers its own use already_used.
	t.Run("the starter's update reaching the run after the use is answered used", func(t *testing.T) {
		couponID := issue(useTypeID, "u-late")
		run, d := useWithLateStarter(t, s, c, couponID, "u-late")
		paid++
		if d.Status != workflows.CouponUsed || d.Payout == nil {
			t.Fatalf("the starter's late update answered %+v, want used with its payout", d)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var state workflows.CouponState
		if err := run.Get(ctx, &state); err != nil || state.Status != workflows.CouponUsed || state.Attempts != 1 {
			t.Fatalf("the run ended %+v (%v), want used after one attempt", state, err)
		}
		if n := ledgerRows(t, s, couponID); n != 1 {
			t.Fatalf("%d ledger rows, want 1", n)
		}
	})

	// The same for an issue: the run knows its starter's update by ID
	// (StarterUpdateID), waits for it, and answers it with the coupon, not
	// already_issued.
	t.Run("the starter's update reaching an issue run after its decision is answered issued", func(t *testing.T) {
		run, couponID, d := issueWithLateStarter(t, s, c, useTypeID, "u-late-issue")
		if d.Status != workflows.CouponIssued || d.CouponID != couponID {
			t.Fatalf("the starter's late update answered %+v, want coupon %s issued", d, couponID)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var state workflows.CouponState
		if err := run.Get(ctx, &state); err != nil || state.Status != workflows.CouponIssued {
			t.Fatalf("the run ended %+v (%v), want issued", state, err)
		}
	})

	t.Run("payout declined is compensated", func(t *testing.T) {
		couponID := issue(useTypeID, "u-decline")
		setPayoutMode(t, s, payoutsim.Decline, 1)
		got := c.must("POST", "/v1/coupons/"+couponID+"/use", map[string]any{"user_id": "u-decline"}, http.StatusPaymentRequired)
		if errorCode(got) != "payout_declined" || got["coupon_status"] != "issued" {
			t.Fatalf("declined use answered %v", got)
		}
		if k := c.must("GET", "/v1/coupons/"+couponID, nil, http.StatusOK); k["status"] != "issued" || k["use_id"] != nil {
			t.Fatalf("coupon after a declined payout: %v", k)
		}
		if n := ledgerRows(t, s, couponID); n != 0 {
			t.Fatalf("%d ledger rows after a decline", n)
		}
		if sim := simPayouts(s, couponID); len(sim) != 0 {
			t.Fatalf("declined but paid: %+v", sim)
		}
		waitFor(t, 30*time.Second, "coupon.use_failed", func() bool {
			return couponEventsOf(couponEvents(t, s, workflows.CouponTopic), workflows.EventCouponUseFailed)[couponID] == 1
		})
		if e := eventOf(t, s, workflows.EventCouponUseFailed, couponID); e.Data["reason"] != "payout_declined" {
			t.Fatalf("coupon.use_failed: %v", e)
		}
		if n := couponEventsOf(couponEvents(t, s, workflows.CouponTopic), workflows.EventCouponUsed)[couponID]; n != 0 {
			t.Fatalf("%d coupon.used events for a declined use", n)
		}
		// The coupon is the user's again: the next use (payouts accepted) works.
		ok := c.must("POST", "/v1/coupons/"+couponID+"/use", map[string]any{"user_id": "u-decline"}, http.StatusOK)
		if ok["status"] != "used" || ok["use_id"] == got["use_id"] {
			t.Fatalf("use after compensation: %v (declined use %v)", ok, got["use_id"])
		}
		paid++
	})

	t.Run("payout 5xx on the first two calls pays once", func(t *testing.T) {
		couponID := issue(useTypeID, "u-5xx")
		setPayoutMode(t, s, payoutsim.Fail, 2)
		began := time.Now()
		got := c.must("POST", "/v1/coupons/"+couponID+"/use", map[string]any{"user_id": "u-5xx"}, http.StatusOK)
		took := time.Since(began)
		paid++
		key := got["payout"].(map[string]any)["idempotency_key"].(string)
		if took < 3*time.Second {
			t.Errorf("answered in %s; two retries take 1 s + 2 s of backoff", took)
		}
		if n := s.Payout.Attempts(key); n != 3 {
			t.Fatalf("the payout API saw %d calls with key %s, want 3", n, key)
		}
		if sim := simPayouts(s, couponID); len(sim) != 1 {
			t.Fatalf("paid %d times, want once", len(sim))
		}
		if n := ledgerRows(t, s, couponID); n != 1 {
			t.Fatalf("%d ledger rows, want 1", n)
		}
		t.Logf("used after two 5xx in %s", took.Round(time.Millisecond))
	})

	t.Run("payout processed but its answer lost is retried with the same key and paid once", func(t *testing.T) {
		couponID := issue(useTypeID, "u-lost")
		setPayoutMode(t, s, payoutsim.TimeoutAfterProcessing, 1)
		began := time.Now()
		got := c.must("POST", "/v1/coupons/"+couponID+"/use", map[string]any{"user_id": "u-lost"}, http.StatusOK)
		paid++
		key := got["payout"].(map[string]any)["idempotency_key"].(string)
		sim := simPayouts(s, couponID)
		if len(sim) != 1 || sim[0].IdempotencyKey != key {
			t.Fatalf("the payout API paid %+v, want once under %s", sim, key)
		}
		if n := s.Payout.Attempts(key); n != 2 {
			t.Fatalf("the payout API saw %d calls with key %s, want 2 (the lost one and its retry)", n, key)
		}
		if got["payout"].(map[string]any)["provider_payout_id"] != sim[0].PayoutID {
			t.Fatalf("ledger records %v, the provider paid %s", got["payout"], sim[0].PayoutID)
		}
		if n := ledgerRows(t, s, couponID); n != 1 {
			t.Fatalf("%d ledger rows, want 1", n)
		}
		t.Logf("used after a lost answer in %s", time.Since(began).Round(time.Millisecond))
	})

	t.Run("payout failing on every attempt is compensated with payout_failed", func(t *testing.T) {
		couponID := issue(useTypeID, "u-down")
		setPayoutMode(t, s, payoutsim.Fail, 4)
		began := time.Now()
		got := c.must("POST", "/v1/coupons/"+couponID+"/use", map[string]any{"user_id": "u-down"}, http.StatusBadGateway)
		if errorCode(got) != "payout_failed" || got["coupon_status"] != "issued" {
			t.Fatalf("failed use answered %v", got)
		}
		key := workflows.PayoutKey(couponID, got["use_id"].(string))
		if n := s.Payout.Attempts(key); n != 4 {
			t.Fatalf("%d payout calls, want the policy's 4", n)
		}
		if k := c.must("GET", "/v1/coupons/"+couponID, nil, http.StatusOK); k["status"] != "issued" {
			t.Fatalf("coupon after payout_failed: %v", k)
		}
		if n := ledgerRows(t, s, couponID); n != 0 {
			t.Fatalf("%d ledger rows", n)
		}
		waitFor(t, 30*time.Second, "coupon.use_failed", func() bool {
			return couponEventsOf(couponEvents(t, s, workflows.CouponTopic), workflows.EventCouponUseFailed)[couponID] == 1
		})
		if e := eventOf(t, s, workflows.EventCouponUseFailed, couponID); e.Data["reason"] != "payout_failed" {
			t.Fatalf("coupon.use_failed: %v", e)
		}
		t.Logf("payout_failed after %s", time.Since(began).Round(time.Millisecond))
	})

	t.Run("coupon.used dead-lettered, retry publishes it once", func(t *testing.T) {
		couponID := issue(useTypeID, "u-dlq")
		removeFault := failProduces(t, s, workflows.CouponTopic)
		got := c.must("POST", "/v1/coupons/"+couponID+"/use", map[string]any{"user_id": "u-dlq"}, http.StatusOK)
		paid++
		eventID := workflows.EventID(got["payout"].(map[string]any)["idempotency_key"].(string), workflows.EventCouponUsed)
		var dl map[string]any
		waitFor(t, 60*time.Second, "dead letter of "+eventID, func() bool {
			_, body, _ := c.do("GET", "/v1/dead-letters?status=open", nil)
			items, _ := body["dead_letters"].([]any)
			for _, it := range items {
				if d := it.(map[string]any); d["event_id"] == eventID {
					dl = d
					return true
				}
			}
			return false
		})
		var dlCoupon *string
		if err := s.Pool.QueryRow(context.Background(), `SELECT coupon_id FROM dead_letters WHERE id = $1`, int64(dl["id"].(float64))).
			Scan(&dlCoupon); err != nil || dlCoupon == nil || *dlCoupon != couponID {
			t.Fatalf("dead letter's coupon_id = %v (%v), want %s", dlCoupon, err, couponID)
		}
		if dl["topic"] != workflows.CouponTopic || dl["workflow_id"] != workflows.UseCouponWorkflowID(couponID) {
			t.Fatalf("dead letter: %v", dl)
		}
		if k := c.must("GET", "/v1/coupons/"+couponID, nil, http.StatusOK); k["status"] != "used" {
			t.Fatalf("a paid coupon stays used while its event is parked: %v", k)
		}
		removeFault()
		c.must("POST", fmt.Sprintf("/v1/dead-letters/%v/retry", dl["id"]), nil, http.StatusAccepted)
		waitFor(t, 30*time.Second, "dead letter resolved", func() bool {
			_, got, _ := c.do("GET", fmt.Sprintf("/v1/dead-letters/%v", dl["id"]), nil)
			return got["status"] == "resolved"
		})
		if n := couponEventsOf(couponEvents(t, s, workflows.CouponTopic), workflows.EventCouponUsed)[couponID]; n != 1 {
			t.Fatalf("%d coupon.used events after dead letter and retry, want 1", n)
		}
		if n := couponEventsOf(couponEvents(t, s, workflows.CouponDLTTopic), workflows.EventCouponUsed)[couponID]; n < 1 {
			t.Fatalf("no copy of the dead letter on %s", workflows.CouponDLTTopic)
		}
	})

	t.Run("vendor balance and payouts", func(t *testing.T) {
		// A vendor of its own: two of three issued coupons used.
		own := "solo-" + run
		c.must("POST", "/v1/vendors", map[string]any{"id": own, "name": "Solo Tea"}, http.StatusCreated)
		typeID := "solo-" + run
		c.must("POST", "/v1/coupon-types", map[string]any{"id": typeID, "vendor_id": own, "name": "solo",
			"stock": 3, "payout_cents": 120}, http.StatusCreated)
		for i, user := range []string{"v-1", "v-2", "v-3"} {
			id := issue(typeID, user)
			if i < 2 {
				c.must("POST", "/v1/coupons/"+id+"/use", map[string]any{"user_id": user}, http.StatusOK)
			}
		}
		got := c.must("GET", "/v1/vendors/"+own, nil, http.StatusOK)
		payouts, _ := got["payouts"].([]any)
		if got["balance_cents"] != float64(240) || got["payout_count"] != float64(2) || len(payouts) != 2 {
			t.Fatalf("vendor after 2 paid uses of 120 cents: %v", got)
		}
		// The shared vendor: every use the subtests above paid, once.
		got = c.must("GET", "/v1/vendors/"+vendorID, nil, http.StatusOK)
		payouts, _ = got["payouts"].([]any)
		if got["balance_cents"] != float64(250*paid) || got["payout_count"] != float64(paid) || len(payouts) != paid {
			t.Fatalf("vendor after %d paid uses: %v", paid, got)
		}
	})

	t.Run("refusals and bad input", func(t *testing.T) {
		typeID := newType("edge", 5)
		couponID := issue(typeID, "ann")
		again := c.must("POST", "/v1/coupon-types/"+typeID+"/coupons", map[string]any{"user_id": "ann"}, http.StatusConflict)
		if errorCode(again) != "already_issued" || again["coupon_id"] != couponID {
			t.Fatalf("second claim answered %v", again)
		}
		cases := []struct {
			method, path string
			body         any
			status       int
			code, field  string
		}{
			{"POST", "/v1/coupons/" + couponID + "/use", map[string]any{"user_id": "bob"}, 404, "coupon_not_found", "coupon_id"},
			{"POST", "/v1/coupons/nope/use", map[string]any{"user_id": "ann"}, 404, "coupon_not_found", "coupon_id"},
			{"POST", "/v1/coupons/" + couponID + "/use", map[string]any{"user": "ann"}, 400, "unknown_field", "user"},
			{"POST", "/v1/coupons/" + couponID + "/use", map[string]any{"user_id": "ann", "order_id": "a b"}, 400, "invalid_field", "order_id"},
			{"POST", "/v1/coupon-types/nope/coupons", map[string]any{"user_id": "ann"}, 404, "coupon_type_not_found", ""},
			{"POST", "/v1/coupon-types/" + typeID + "/coupons", map[string]any{"user_id": ""}, 400, "missing_field", "user_id"},
			{"POST", "/v1/coupon-types/" + typeID + "/coupons", map[string]any{"user_id": 7}, 400, "invalid_field", "user_id"},
			{"POST", "/v1/coupon-types", map[string]any{"vendor_id": "nope", "name": "x", "stock": 1, "payout_cents": 1}, 404, "vendor_not_found", "vendor_id"},
			{"POST", "/v1/coupon-types", map[string]any{"vendor_id": vendorID, "name": "x", "stock": -1, "payout_cents": 1}, 400, "invalid_field", "stock"},
			{"POST", "/v1/coupon-types", map[string]any{"vendor_id": vendorID, "name": "x", "stock": 1}, 400, "missing_field", "payout_cents"},
			{"POST", "/v1/coupon-types", map[string]any{"id": typeID, "vendor_id": vendorID, "name": "x", "stock": 1, "payout_cents": 1}, 409, "coupon_type_exists", "id"},
			{"POST", "/v1/vendors", map[string]any{"id": vendorID, "name": "again"}, 409, "vendor_exists", "id"},
			{"POST", "/v1/vendors", map[string]any{"id": "v2"}, 400, "missing_field", "name"},
			{"GET", "/v1/vendors/nope", nil, 404, "vendor_not_found", "id"},
			{"GET", "/v1/coupon-types/nope", nil, 404, "coupon_type_not_found", "id"},
			{"GET", "/v1/coupons/nope", nil, 404, "coupon_not_found", "id"},
		}
		for _, tc := range cases {
			st, body, err := c.do(tc.method, tc.path, tc.body)
			if err != nil {
				t.Fatal(err)
			}
			e, _ := body["error"].(map[string]any)
			if st != tc.status || errorCode(body) != tc.code || (tc.field != "" && e["field"] != tc.field) {
				t.Errorf("%s %s %v = %d %v, want %d %s field %q", tc.method, tc.path, tc.body, st, body, tc.status, tc.code, tc.field)
			}
		}
		k := c.must("GET", "/v1/coupons/"+couponID, nil, http.StatusOK)
		if k["status"] != "issued" || k["user_id"] != "ann" || k["vendor_id"] != vendorID || k["workflow_id"] != workflows.IssueCouponWorkflowID(typeID, "ann") {
			t.Fatalf("coupon: %v", k)
		}
	})
}
