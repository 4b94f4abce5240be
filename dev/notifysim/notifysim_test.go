package notifysim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/claimflow/claimflow/consumer"
)

func post(t *testing.T, srv *httptest.Server, ns ...consumer.WebhookNotification) int {
	t.Helper()
	b, err := json.Marshal(consumer.WebhookRequest{Notifications: ns})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(srv.URL+"/notifications", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestLedgerRecordsEveryAttempt: a lost answer makes the sender try again;
// the ledger shows the key twice with one body and one effect, and the
// summary counts the re-send. A sender that changes the body under a key
// shows up too.
func TestLedgerRecordsEveryAttempt(t *testing.T) {
	s := New()
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	a := consumer.WebhookNotification{EventID: "e1", EventType: "x", Topic: "t", Key: "k", Event: json.RawMessage(`{"n":1}`)}
	b := consumer.WebhookNotification{EventID: "e2", EventType: "x", Topic: "t", Key: "k", Event: json.RawMessage(`{"n":2}`)}
	if err := s.Set(Setting{Mode: Healthy, LoseAnswers: 1}); err != nil {
		t.Fatal(err)
	}
	if st := post(t, srv, a, b); st != http.StatusServiceUnavailable {
		t.Fatalf("lost answer: status %d, want 503", st)
	}
	if st := post(t, srv, a, b); st != http.StatusOK {
		t.Fatalf("re-send: status %d, want 200", st)
	}
	changed := b
	changed.Event = json.RawMessage(`{"n":3}`)
	if st := post(t, srv, changed); st != http.StatusOK {
		t.Fatalf("changed body: status %d", st)
	}
	ds := s.Deliveries("t")
	got := make([]Result, len(ds))
	for i, d := range ds {
		got[i] = d.Result
	}
	if want := []Result{Accepted, Accepted, Duplicate, Duplicate, Duplicate}; !slices.Equal(got, want) {
		t.Fatalf("results %v, want %v", got, want)
	}
	l := Summarize(ds)
	if l.Keys != 2 || l.Attempts != 5 || l.Effects != 2 || l.Resent != 3 || len(l.DoubleEffects) != 0 ||
		!slices.Equal(l.BodyChanged, []string{"e2"}) || l.OK() {
		t.Fatalf("ledger %+v", l)
	}
	if other := s.Deliveries("other"); len(other) != 0 {
		t.Fatalf("deliveries of another topic: %v", other)
	}
}

func TestSummarize(t *testing.T) {
	d := func(key, body string, r Result) Delivery { return Delivery{Key: key, Body: body, Result: r} }
	cases := []struct {
		name string
		ds   []Delivery
		want Ledger
	}{
		{"one each", []Delivery{d("a", "1", Accepted), d("b", "2", Accepted)},
			Ledger{Keys: 2, Attempts: 2, Effects: 2}},
		{"retried after refusals", []Delivery{d("a", "1", Outage), d("a", "1", Rejected), d("a", "1", Accepted)},
			Ledger{Keys: 1, Attempts: 3, Effects: 1, Retried: 2}},
		{"re-sent after acceptance", []Delivery{d("a", "1", Accepted), d("a", "1", Duplicate), d("a", "1", Duplicate)},
			Ledger{Keys: 1, Attempts: 3, Effects: 1, Resent: 2}},
		{"a receiver without dedupe takes a key twice", []Delivery{d("a", "1", Accepted), d("a", "1", Accepted)},
			Ledger{Keys: 1, Attempts: 2, Effects: 2, Resent: 1, DoubleEffects: []string{"a"}}},
		{"a key with another body", []Delivery{d("a", "1", Accepted), d("a", "2", Duplicate)},
			Ledger{Keys: 1, Attempts: 2, Effects: 1, Resent: 1, BodyChanged: []string{"a"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Summarize(tc.ds)
			a, _ := json.Marshal(got)
			b, _ := json.Marshal(tc.want)
			if !bytes.Equal(a, b) {
				t.Fatalf("Summarize = %s, want %s", a, b)
			}
			if got.OK() != (len(tc.want.DoubleEffects) == 0 && len(tc.want.BodyChanged) == 0) {
				t.Fatalf("OK() = %v", got.OK())
			}
		})
	}
}

// TestMemoryIsBounded: past retain event IDs the oldest are forgotten with
// their ledger entries, newer ones keep their history, and the count of
// forgotten events is reported.
func TestMemoryIsBounded(t *testing.T) {
	s := New()
	s.retain = 10
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	for i := range 25 {
		n := consumer.WebhookNotification{EventID: fmt.Sprintf("e%02d", i), EventType: "x", Topic: "t", Key: "k", Event: json.RawMessage(`{}`)}
		if code := post(t, srv, n, n); code != http.StatusOK { // each sent twice: one effect, one duplicate
			t.Fatalf("post: %d", code)
		}
	}
	if got := s.Stats("").Forgotten; got != 15 {
		t.Errorf("forgotten = %d, want 15", got)
	}
	if _, ok := s.Event("e14"); ok {
		t.Error("e14 is still remembered; only the last 10 should be")
	}
	if e, ok := s.Event("e15"); !ok || !e.Delivered || e.Attempts != 2 {
		t.Errorf("e15 = %+v, %v; want remembered, delivered, 2 attempts", e, ok)
	}
	ds := s.Deliveries("")
	if maxEvents := 10 + 10/4; len(ds) > 2*maxEvents {
		t.Errorf("ledger holds %d deliveries; it must hold those of at most %d events (retain + retain/4)", len(ds), maxEvents)
	}
	keys := map[string]bool{}
	for _, d := range ds {
		keys[d.Key] = true
	}
	for i := 15; i < 25; i++ {
		if !keys[fmt.Sprintf("e%02d", i)] {
			t.Errorf("ledger lost e%02d, which is still remembered", i)
		}
	}
	if l := Summarize(ds); !l.OK() {
		t.Errorf("ledger of the remembered events: %+v", l)
	}
}
