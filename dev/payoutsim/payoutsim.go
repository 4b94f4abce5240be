// Package payoutsim is a small vendor payout API for the local stack and the
// tests: it pays (in memory), dedupes on the Idempotency-Key header as a real
// payment provider does, and can be switched at run time to misbehave.
//
//	POST /payouts        pay; header Idempotency-Key required; body
//	                     {"vendor_id","amount_cents",...}; 200 {"payout_id",...},
//	                     402 when declined, 503 when failing
//	GET  /payouts        {"payouts":[...],"count","requests"}; ?idempotency_key=K
//	                     filters, and every payout lists its attempts
//	GET  /admin/mode     the current behaviour
//	PUT  /admin/mode     {"mode","count"?,"delay"?} switches it
//
// Modes: accept (the default), decline (402, stored under the key like a
// real decline), fail (503 before processing), hang (no answer until the
// client gives up), slow (answer after delay, then as accept),
// timeout-after-processing (pay, then hold the answer past the client's
// timeout so the response is lost). count > 0 applies the mode to the next
// count payout requests only, then the simulator goes back to accept: mode
// fail with count 2 fails the first two calls. A key already answered is
// answered again from the store (accept, decline and slow modes; the
// timeout-after-processing mode replays and then holds the answer); fail and
// hang model an unreachable provider and answer nothing useful.
package payoutsim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/claimflow/claimflow/dev/simserver"
)

// Mode is how the simulator answers payout requests.
type Mode string

const (
	Accept                 Mode = "accept"
	Decline                Mode = "decline"
	Fail                   Mode = "fail"
	Hang                   Mode = "hang"
	Slow                   Mode = "slow"
	TimeoutAfterProcessing Mode = "timeout-after-processing"
)

var modes = map[Mode]bool{Accept: true, Decline: true, Fail: true, Hang: true, Slow: true, TimeoutAfterProcessing: true}

// Default delays: slow answers after 2 s; hang and timeout-after-processing
// hold the answer until the client disconnects, or 60 s at most.
const (
	defaultSlowDelay = 2 * time.Second
	defaultHoldDelay = 60 * time.Second
)

// Setting is the simulator's behaviour.
type Setting struct {
	Mode Mode `json:"mode"`
	// Count > 0 applies Mode to that many more payout requests; 0 until changed.
	Count int `json:"count,omitempty"`
	// Delay is how long slow waits, and how long hang and
	// timeout-after-processing hold the answer at most.
	Delay Duration `json:"delay,omitempty"`
}

// Duration is a JSON duration ("250ms", or nanoseconds).
type Duration = simserver.Duration

// Payout is one idempotency key's payment (or decline).
type Payout struct {
	PayoutID       string    `json:"payout_id,omitempty"`
	IdempotencyKey string    `json:"idempotency_key"`
	Status         string    `json:"status"` // paid | declined
	VendorID       string    `json:"vendor_id"`
	AmountCents    int64     `json:"amount_cents"`
	Currency       string    `json:"currency,omitempty"`
	Reference      string    `json:"reference,omitempty"`
	CouponID       string    `json:"coupon_id,omitempty"`
	UseID          string    `json:"use_id,omitempty"`
	OrderID        string    `json:"order_id,omitempty"`
	CreatedAt      time.Time `json:"created_at"`
	// Attempts counts every request that carried this key, whatever the mode.
	Attempts int `json:"attempts"`
}

type request struct {
	VendorID    string `json:"vendor_id"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
	Reference   string `json:"reference"`
	CouponID    string `json:"coupon_id"`
	UseID       string `json:"use_id"`
	OrderID     string `json:"order_id"`
}

// Server is a running simulator.
type Server struct {
	// URL is the base URL, e.g. http://127.0.0.1:8090; payouts go to URL+"/payouts".
	URL string

	mu       sync.Mutex
	setting  Setting
	byKey    map[string]*Payout
	attempts map[string]int
	order    []string
	requests int
	next     int

	ln      *simserver.Listener
	closing chan struct{}
	once    sync.Once
}

// New returns a simulator that is not listening; use Handler (tests) or Start.
func New() *Server {
	return &Server{
		setting:  Setting{Mode: Accept},
		byKey:    map[string]*Payout{},
		attempts: map[string]int{},
		closing:  make(chan struct{}),
	}
}

// Start serves a new simulator on addr ("127.0.0.1:0" picks a free port).
func Start(addr string) (*Server, error) {
	s := New()
	l, err := simserver.Listen("payout simulator", addr, s.Handler())
	if err != nil {
		return nil, err
	}
	s.URL, s.ln = l.URL, l
	return s, nil
}

// PayoutsURL is where payout requests go (VENDOR_PAYOUT_URL).
func (s *Server) PayoutsURL() string { return s.URL + "/payouts" }

// Close stops serving; held answers are released at once.
func (s *Server) Close(ctx context.Context) error {
	s.once.Do(func() { close(s.closing) })
	return s.ln.Close(ctx)
}

// Handler is the simulator's HTTP interface.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /payouts", s.pay)
	mux.HandleFunc("GET /payouts", s.list)
	mux.HandleFunc("GET /admin/mode", func(w http.ResponseWriter, _ *http.Request) {
		simserver.WriteJSON(w, http.StatusOK, s.Setting())
	})
	mux.HandleFunc("PUT /admin/mode", s.putMode)
	return mux
}

// Set switches the behaviour.
func (s *Server) Set(st Setting) error {
	if !modes[st.Mode] {
		return fmt.Errorf("unknown mode %q: use accept, decline, fail, hang, slow or timeout-after-processing", st.Mode)
	}
	if st.Count < 0 {
		return errors.New("count must not be negative")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.setting = st
	return nil
}

// Setting returns the current behaviour.
func (s *Server) Setting() Setting {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.setting
}

// Payouts returns every stored payout (paid or declined) in arrival order.
func (s *Server) Payouts() []Payout {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Payout, 0, len(s.order))
	for _, k := range s.order {
		p := *s.byKey[k]
		p.Attempts = s.attempts[k]
		out = append(out, p)
	}
	return out
}

// Attempts counts the requests that carried key.
func (s *Server) Attempts(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.attempts[key]
}

func (s *Server) putMode(w http.ResponseWriter, r *http.Request) {
	var st Setting
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&st); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_json", err.Error())
		return
	}
	if err := s.Set(st); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_mode", err.Error())
		return
	}
	simserver.WriteJSON(w, http.StatusOK, s.Setting())
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	key := r.URL.Query().Get("idempotency_key")
	all := s.Payouts()
	paid := []Payout{}
	for _, p := range all {
		if (key == "" || p.IdempotencyKey == key) && p.Status == "paid" {
			paid = append(paid, p)
		}
	}
	declined := 0
	for _, p := range all {
		if (key == "" || p.IdempotencyKey == key) && p.Status == "declined" {
			declined++
		}
	}
	s.mu.Lock()
	requests := s.requests
	if key != "" {
		requests = s.attempts[key]
	}
	s.mu.Unlock()
	sort.SliceStable(paid, func(i, j int) bool { return paid[i].CreatedAt.Before(paid[j].CreatedAt) })
	simserver.WriteJSON(w, http.StatusOK, map[string]any{"payouts": paid, "count": len(paid), "declined": declined, "requests": requests})
}

// take returns the setting for one payout request and counts it down.
func (s *Server) take() Setting {
	st := s.setting
	if s.setting.Count > 0 {
		s.setting.Count--
		if s.setting.Count == 0 {
			s.setting = Setting{Mode: Accept}
		}
	}
	return st
}

func (s *Server) pay(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	if key == "" || len(key) > 255 {
		writeError(w, http.StatusBadRequest, "missing_idempotency_key", "send an Idempotency-Key header of 1-255 bytes")
		return
	}
	var req request
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 16<<10)).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_json", err.Error())
		return
	}
	if req.VendorID == "" || req.AmountCents <= 0 {
		writeError(w, http.StatusBadRequest, "invalid_request", "vendor_id and a positive amount_cents are required")
		return
	}
	s.mu.Lock()
	s.requests++
	s.attempts[key]++
	st := s.take()
	s.mu.Unlock()

	switch st.Mode {
	case Fail:
		writeError(w, http.StatusServiceUnavailable, "unavailable", "payout service unavailable (simulated)")
		return
	case Hang:
		s.hold(r.Context(), st.Delay, defaultHoldDelay)
		writeError(w, http.StatusGatewayTimeout, "timeout", "payout service hung (simulated)")
		return
	case Slow:
		if !s.hold(r.Context(), st.Delay, defaultSlowDelay) {
			return
		}
	}
	status, p, err := s.process(key, req, st.Mode == Decline)
	if err != nil {
		writeError(w, status, "idempotency_key_reused", err.Error())
		return
	}
	if st.Mode == TimeoutAfterProcessing {
		// The payment is made; the answer is held until the client gave up.
		s.hold(r.Context(), st.Delay, defaultHoldDelay)
	}
	if p.Status == "declined" {
		simserver.WriteJSON(w, status, map[string]any{"error": map[string]string{
			"code": "declined", "message": "the payout was declined (simulated)"}, "idempotency_key": key})
		return
	}
	simserver.WriteJSON(w, status, p)
}

// process pays (or declines) a new key, or returns what the key got before.
func (s *Server) process(key string, req request, decline bool) (int, Payout, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p, ok := s.byKey[key]; ok {
		if p.VendorID != req.VendorID || p.AmountCents != req.AmountCents {
			return http.StatusUnprocessableEntity, Payout{}, fmt.Errorf("idempotency key %q was used with other parameters", key)
		}
		out := *p
		out.Attempts = s.attempts[key]
		if p.Status == "declined" {
			return http.StatusPaymentRequired, out, nil
		}
		return http.StatusOK, out, nil
	}
	p := &Payout{IdempotencyKey: key, Status: "paid", VendorID: req.VendorID, AmountCents: req.AmountCents,
		Currency: req.Currency, Reference: req.Reference, CouponID: req.CouponID, UseID: req.UseID,
		OrderID: req.OrderID, CreatedAt: time.Now().UTC()}
	status := http.StatusOK
	if decline {
		p.Status, status = "declined", http.StatusPaymentRequired
	} else {
		s.next++
		p.PayoutID = fmt.Sprintf("po_%08d", s.next)
	}
	s.byKey[key] = p
	s.order = append(s.order, key)
	out := *p
	out.Attempts = s.attempts[key]
	return status, out, nil
}

// hold waits for delay (or def when zero), the client going away, or Close.
// It reports whether the wait ran its course.
func (s *Server) hold(ctx context.Context, delay Duration, def time.Duration) bool {
	d := time.Duration(delay)
	if d <= 0 {
		d = def
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-s.closing:
		return false
	}
}

func writeError(w http.ResponseWriter, status int, code, message string) {
	simserver.WriteJSON(w, status, map[string]any{"error": map[string]string{"code": code, "message": message}})
}
