package payoutsim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"testing"
	"time"
)

func startSim(t *testing.T) *Server {
	t.Helper()
	s, err := Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Close(ctx)
	})
	return s
}

func pay(t *testing.T, client *http.Client, s *Server, key string) (int, map[string]any, error) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"vendor_id": "v-1", "amount_cents": 250, "coupon_id": "c-1"})
	req, err := http.NewRequest(http.MethodPost, s.PayoutsURL(), bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	out := map[string]any{}
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out, nil
}

func setMode(t *testing.T, s *Server, body string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPut, s.URL+"/admin/mode", bytes.NewBufferString(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("PUT /admin/mode %s = %d", body, resp.StatusCode)
	}
}

func paidCount(s *Server) int {
	n := 0
	for _, p := range s.Payouts() {
		if p.Status == "paid" {
			n++
		}
	}
	return n
}

func TestDedupesOnIdempotencyKey(t *testing.T) {
	s := startSim(t)
	c := &http.Client{Timeout: 5 * time.Second}
	st1, a, err := pay(t, c, s, "k-1")
	if err != nil || st1 != http.StatusOK {
		t.Fatalf("first payout: %d %v %v", st1, a, err)
	}
	st2, b, err := pay(t, c, s, "k-1")
	if err != nil || st2 != http.StatusOK || a["payout_id"] != b["payout_id"] {
		t.Fatalf("replay: %d %v %v, want the first answer %v", st2, b, err, a)
	}
	if n := paidCount(s); n != 1 {
		t.Fatalf("%d payouts for one key", n)
	}
	if n := s.Attempts("k-1"); n != 2 {
		t.Fatalf("attempts = %d, want 2", n)
	}
	if st, _, _ := pay(t, c, s, ""); st != http.StatusBadRequest {
		t.Fatalf("missing key answered %d", st)
	}
}

func TestModes(t *testing.T) {
	s := startSim(t)
	c := &http.Client{Timeout: 300 * time.Millisecond}

	setMode(t, s, `{"mode":"fail","count":2}`)
	for i := range 2 {
		if st, _, _ := pay(t, c, s, "k-fail"); st != http.StatusServiceUnavailable {
			t.Fatalf("fail call %d answered %d", i, st)
		}
	}
	if st, _, _ := pay(t, c, s, "k-fail"); st != http.StatusOK {
		t.Fatalf("after count ran out: %d, want 200", st)
	}
	if got := s.Setting().Mode; got != Accept {
		t.Fatalf("mode after count = %s, want accept", got)
	}

	setMode(t, s, `{"mode":"decline"}`)
	if st, body, _ := pay(t, c, s, "k-decline"); st != http.StatusPaymentRequired {
		t.Fatalf("decline answered %d %v", st, body)
	}
	if st, _, _ := pay(t, c, s, "k-fail"); st != http.StatusOK {
		t.Fatalf("a paid key replays its answer in decline mode, got %d", st)
	}

	setMode(t, s, `{"mode":"hang","count":1}`)
	var netErr interface{ Timeout() bool }
	if _, _, err := pay(t, c, s, "k-hang"); !errors.As(err, &netErr) || !netErr.Timeout() {
		t.Fatalf("hang: %v, want a client timeout", err)
	}

	setMode(t, s, `{"mode":"timeout-after-processing","count":1}`)
	if _, _, err := pay(t, c, s, "k-lost"); err == nil {
		t.Fatal("timeout-after-processing answered in time")
	}
	st, body, err := pay(t, c, s, "k-lost")
	if err != nil || st != http.StatusOK {
		t.Fatalf("retry after a lost answer: %d %v %v", st, body, err)
	}
	if n := s.Attempts("k-lost"); n != 2 {
		t.Fatalf("k-lost attempts = %d", n)
	}

	setMode(t, s, `{"mode":"slow","delay":"100ms","count":1}`)
	began := time.Now()
	if st, _, _ := pay(t, c, s, "k-slow"); st != http.StatusOK || time.Since(began) < 100*time.Millisecond {
		t.Fatalf("slow: %d after %s", st, time.Since(began))
	}

	// k-fail, k-lost and k-slow were paid once each; k-hang and k-decline never.
	if n := paidCount(s); n != 3 {
		t.Fatalf("%d payouts, want 3: %+v", n, s.Payouts())
	}

	req, _ := http.NewRequest(http.MethodPut, s.URL+"/admin/mode", bytes.NewBufferString(`{"mode":"explode"}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("unknown mode answered %d", resp.StatusCode)
	}
}

func TestListPayouts(t *testing.T) {
	s := startSim(t)
	c := &http.Client{Timeout: 5 * time.Second}
	pay(t, c, s, "a")
	pay(t, c, s, "a")
	pay(t, c, s, "b")
	resp, err := http.Get(s.PayoutsURL() + "?idempotency_key=a")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Payouts  []Payout `json:"payouts"`
		Count    int      `json:"count"`
		Requests int      `json:"requests"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	if out.Count != 1 || out.Requests != 2 || out.Payouts[0].Attempts != 2 {
		t.Fatalf("GET /payouts?idempotency_key=a = %+v", out)
	}
}
