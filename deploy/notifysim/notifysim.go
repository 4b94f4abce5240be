// Package notifysim is a notification webhook for the local stack and the
// tests: it takes the consumer's batches (activities.WebhookRequest), dedupes
// on the event ID as a receiver must, and can be switched at run time to
// fail or slow down, so the consumer's retry path is driven by real failed
// HTTP calls rather than by a flag inside the consumer.
//
//	POST /notifications   a batch; 200 with a result per event, or 503 in an outage
//	GET  /notifications   ?event_id=ID: that event's attempts and delivery
//	GET  /admin/stats     counters; ?topic=T for one topic's
//	GET  /admin/mode      the current behaviour
//	PUT  /admin/mode      {"mode","delay"?,"event_ids"?,"count"?,"attempts"?} switches it
//
// Modes:
//
//	healthy   every event is accepted (the default)
//	slow      every request waits delay (default 500ms), then as healthy
//	failing   without event_ids, count or attempts: an outage, every request
//	          answers 503. Otherwise events are rejected one by one: only
//	          the listed event_ids, or only the next count distinct events;
//	          attempts > 0 rejects each such event on its first attempts
//	          attempts only (attempts alone: every event, first attempts).
//
// Attempts are counted per event from the moment the mode was set. A delay
// may be given with any mode.
package notifysim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/claimflow/claimflow/activities"
)

// Mode is how the simulator answers.
type Mode string

const (
	Healthy Mode = "healthy"
	Slow    Mode = "slow"
	Failing Mode = "failing"
)

const defaultSlowDelay = 500 * time.Millisecond

// Setting is the simulator's behaviour.
type Setting struct {
	Mode     Mode     `json:"mode"`
	Delay    Duration `json:"delay,omitempty"`
	EventIDs []string `json:"event_ids,omitempty"`
	Count    int      `json:"count,omitempty"`
	Attempts int      `json:"attempts,omitempty"`
}

// Duration reads and writes "250ms" style JSON strings (or nanoseconds).
type Duration time.Duration

func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		var n int64
		if err := json.Unmarshal(b, &n); err != nil {
			return errors.New(`delay must be a duration such as "250ms"`)
		}
		*d = Duration(n)
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("delay: %w", err)
	}
	*d = Duration(v)
	return nil
}

// Stats counts what the simulator saw.
type Stats struct {
	// Requests received (per topic: requests holding one of its events),
	// and of them answered 503 (outage).
	Requests int `json:"requests"`
	Outages  int `json:"outages"`
	// Received counts notifications in answered requests, Rejected those
	// refused, Delivered distinct events accepted, Duplicates events accepted
	// again (a redelivery this receiver deduped).
	Received   int `json:"received"`
	Rejected   int `json:"rejected"`
	Delivered  int `json:"delivered"`
	Duplicates int `json:"duplicates"`
}

// Event is what the simulator knows of one event ID.
type Event struct {
	EventID   string    `json:"event_id"`
	Topic     string    `json:"topic"`
	Attempts  int       `json:"attempts"`
	Delivered bool      `json:"delivered"`
	FirstAt   time.Time `json:"first_at"`
	// DeliveredAt is when it was first accepted.
	DeliveredAt time.Time `json:"delivered_at,omitzero"`
	LastError   string    `json:"last_error,omitempty"`
}

// Server is a running simulator. State is in memory: a restart forgets
// what was delivered.
type Server struct {
	// URL is the base URL; notifications go to URL+"/notifications".
	URL string

	mu        sync.Mutex
	setting   Setting
	failing   map[string]bool // event IDs rejected in this setting
	countLeft int
	attempts  map[string]int // per event, since the setting was set
	events    map[string]*Event
	total     Stats
	byTopic   map[string]*Stats

	srv  *http.Server
	done chan struct{}
}

// New returns a simulator that is not listening; use Handler (tests) or Start.
func New() *Server {
	return &Server{
		setting:  Setting{Mode: Healthy},
		attempts: map[string]int{},
		events:   map[string]*Event{},
		byTopic:  map[string]*Stats{},
	}
}

// Start serves a new simulator on addr ("127.0.0.1:0" picks a free port).
func Start(addr string) (*Server, error) {
	s := New()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("notification simulator: listen on %s: %w", addr, err)
	}
	s.URL = "http://" + ln.Addr().String()
	s.srv = &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 5 * time.Second}
	s.done = make(chan struct{})
	go func() {
		defer close(s.done)
		_ = s.srv.Serve(ln)
	}()
	return s, nil
}

// WebhookURL is what NOTIFY_WEBHOOK_URL points to.
func (s *Server) WebhookURL() string { return s.URL + "/notifications" }

// Close stops serving after the requests in flight.
func (s *Server) Close(ctx context.Context) error {
	if s.srv == nil {
		return nil
	}
	err := s.srv.Shutdown(ctx)
	<-s.done
	return err
}

// Handler is the simulator's HTTP interface.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /notifications", s.receive)
	mux.HandleFunc("GET /notifications", func(w http.ResponseWriter, r *http.Request) {
		id := r.URL.Query().Get("event_id")
		e, ok := s.Event(id)
		if !ok {
			writeJSON(w, http.StatusNotFound, map[string]string{"error": "no such event_id"})
			return
		}
		writeJSON(w, http.StatusOK, e)
	})
	mux.HandleFunc("GET /admin/stats", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.Stats(r.URL.Query().Get("topic")))
	})
	mux.HandleFunc("GET /admin/mode", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, s.Setting())
	})
	mux.HandleFunc("PUT /admin/mode", func(w http.ResponseWriter, r *http.Request) {
		var st Setting
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&st); err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		if err := s.Set(st); err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, s.Setting())
	})
	return mux
}

// Set switches the behaviour and restarts the per-event attempt counts.
func (s *Server) Set(st Setting) error {
	switch st.Mode {
	case Healthy, Slow, Failing:
	default:
		return fmt.Errorf("unknown mode %q: use healthy, slow or failing", st.Mode)
	}
	if st.Count < 0 || st.Attempts < 0 || st.Delay < 0 {
		return errors.New("count, attempts and delay must not be negative")
	}
	if st.Mode == Slow && st.Delay == 0 {
		st.Delay = Duration(defaultSlowDelay)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.setting = st
	s.failing = map[string]bool{}
	for _, id := range st.EventIDs {
		s.failing[id] = true
	}
	s.countLeft = st.Count
	s.attempts = map[string]int{}
	return nil
}

// Setting is the current behaviour.
func (s *Server) Setting() Setting {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.setting
	st.EventIDs = slices.Clone(st.EventIDs)
	return st
}

// Stats are the counters of one topic, or of all with topic "".
func (s *Server) Stats(topic string) Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	if topic == "" {
		return s.total
	}
	if t, ok := s.byTopic[topic]; ok {
		return *t
	}
	return Stats{}
}

// Event is what the simulator knows of one event ID.
func (s *Server) Event(id string) (Event, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.events[id]
	if !ok {
		return Event{}, false
	}
	return *e, true
}

func (s *Server) receive(w http.ResponseWriter, r *http.Request) {
	var req activities.WebhookRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<20)).Decode(&req); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "body is not a notification batch: " + err.Error()})
		return
	}
	st := s.Setting()
	if st.Delay > 0 {
		select {
		case <-time.After(time.Duration(st.Delay)):
		case <-r.Context().Done():
			return
		}
	}
	resp, outage := s.apply(req)
	if outage {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "notification service unavailable (simulated outage)"})
		return
	}
	writeJSON(w, http.StatusOK, resp)
}

// apply decides each notification in order, under one lock, so that the
// counters and the dedupe set always agree.
func (s *Server) apply(req activities.WebhookRequest) (activities.WebhookResponse, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.total.Requests++
	st := s.setting
	outage := st.Mode == Failing && len(st.EventIDs) == 0 && st.Count == 0 && st.Attempts == 0
	if outage {
		s.total.Outages++
	}
	resp := activities.WebhookResponse{Results: make([]activities.WebhookResult, 0, len(req.Notifications))}
	now := time.Now()
	counted := map[string]bool{}
	for _, n := range req.Notifications {
		e := s.events[n.EventID]
		if e == nil {
			e = &Event{EventID: n.EventID, Topic: n.Topic, FirstAt: now}
			s.events[n.EventID] = e
		}
		e.Attempts++
		ts := s.byTopic[n.Topic]
		if ts == nil {
			ts = &Stats{}
			s.byTopic[n.Topic] = ts
		}
		if !counted[n.Topic] {
			counted[n.Topic] = true
			ts.Requests++
			if outage {
				ts.Outages++
			}
		}
		if outage {
			e.LastError = "outage"
			continue
		}
		s.total.Received++
		ts.Received++
		if s.rejects(n.EventID) {
			s.total.Rejected++
			ts.Rejected++
			e.LastError = fmt.Sprintf("rejected (simulated failure, attempt %d)", s.attempts[n.EventID])
			resp.Results = append(resp.Results, activities.WebhookResult{EventID: n.EventID, Status: activities.WebhookRejected,
				Error: e.LastError})
			continue
		}
		if e.Delivered {
			s.total.Duplicates++
			ts.Duplicates++
			resp.Results = append(resp.Results, activities.WebhookResult{EventID: n.EventID, Status: activities.WebhookDuplicate})
			continue
		}
		e.Delivered, e.DeliveredAt, e.LastError = true, now, ""
		s.total.Delivered++
		ts.Delivered++
		resp.Results = append(resp.Results, activities.WebhookResult{EventID: n.EventID, Status: activities.WebhookAccepted})
	}
	return resp, outage
}

// rejects counts an attempt at id and says whether this setting refuses it.
func (s *Server) rejects(id string) bool {
	st := s.setting
	if st.Mode != Failing {
		return false
	}
	s.attempts[id]++
	if !s.failing[id] {
		switch {
		case st.Count > 0 && s.countLeft > 0:
			// The next count distinct events fail.
			s.countLeft--
			s.failing[id] = true
		case len(st.EventIDs) == 0 && st.Count == 0:
			// attempts alone: every event fails its first attempts.
			s.failing[id] = true
		default:
			return false
		}
	}
	return st.Attempts == 0 || s.attempts[id] <= st.Attempts
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
