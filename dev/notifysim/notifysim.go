// Package notifysim is a notification webhook for the local stack and the
// tests: it takes the consumer's batches (consumer.WebhookRequest), dedupes
// on the event ID as a receiver must, and can be switched at run time to
// fail or slow down, so the consumer's retry path is driven by real failed
// HTTP calls rather than by a flag inside the consumer.
//
//	POST /notifications   a batch; 200 with a result per event, or 503 in an outage
//	GET  /notifications   ?event_id=ID: that event's attempts and delivery
//	GET  /admin/stats     counters; ?topic=T for one topic's
//	GET  /admin/deliveries every delivery attempt in arrival order, and their
//	                      summary per idempotency key; ?topic=T for one topic's
//	GET  /admin/mode      the current behaviour
//	PUT  /admin/mode      {"mode","delay"?,"event_ids"?,"count"?,"attempts"?,"lose_answers"?} switches it
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
// may be given with any mode, and so may lose_answers: the next that many
// requests are applied as the mode says, but answered 503, as an answer lost
// on its way back; the sender must send them again under the same keys.
//
// Every attempt is also kept in a ledger (Deliveries), with the idempotency
// key (the event ID) and a digest of the notification as sent, so a test
// can tell a re-send (same key, same body: the consumer's at-least-once)
// from a double effect (the key accepted twice) or an unstable key (same
// key, another body). Summarize reads the ledger without trusting the
// simulator's own dedupe.
//
// Memory is bounded: the simulator remembers the Retain most recent event
// IDs (first seen last) with their ledger entries and forgets older ones,
// counting them in Stats.Forgotten. A forgotten event that comes again
// counts as a new one, so a test that reads the ledger keeps its events
// within Retain.
package notifysim

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/claimflow/claimflow/consumer"
	"github.com/claimflow/claimflow/dev/simserver"
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
	// LoseAnswers: the next this many requests take effect but are answered
	// 503, so the sender re-sends what the receiver already took.
	LoseAnswers int `json:"lose_answers,omitempty"`
}

// Duration is a JSON duration ("250ms", or nanoseconds).
type Duration = simserver.Duration

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
	// Forgotten counts events dropped from memory, oldest first, to keep
	// the last Retain (all topics' total only).
	Forgotten int `json:"forgotten,omitempty"`
}

// Retain is how many event IDs a simulator remembers, with their ledger
// entries: enough for any test's ledger, and a bound on the memory of a
// `claimflow dev` that has delivered millions of events.
const Retain = 50_000

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

// Result is what the simulator answered for one notification.
type Result string

const (
	Accepted  Result = "accepted"  // taken: the effect happened
	Duplicate Result = "duplicate" // its key was taken before: deduped, no effect
	Rejected  Result = "rejected"  // refused (simulated failure)
	Outage    Result = "outage"    // the whole request answered 503
)

// Delivery is one attempt to deliver one notification.
type Delivery struct {
	// Key is the idempotency key the sender gave (the event ID).
	Key   string    `json:"key"`
	Topic string    `json:"topic"`
	At    time.Time `json:"at"`
	// Body is the SHA-256 of the notification as received, re-encoded:
	// copies of one event must carry the same body under the same key.
	Body   string `json:"body_sha256"`
	Result Result `json:"result"`
}

// Ledger sums up deliveries per idempotency key.
type Ledger struct {
	// Keys distinct idempotency keys; Attempts every delivery of them.
	Keys     int `json:"keys"`
	Attempts int `json:"attempts"`
	// Effects counts accepted deliveries; with a receiver that dedupes it
	// equals the keys that were ever accepted.
	Effects int `json:"effects"`
	// Resent counts deliveries of a key after it had been accepted: the
	// sender's at-least-once (a crash between the answer and its record).
	Resent int `json:"resent"`
	// Retried counts deliveries of a key after a refusal and before it was
	// accepted: the sender's retry policy at work.
	Retried int `json:"retried"`
	// DoubleEffects lists keys accepted more than once; BodyChanged keys
	// sent with more than one body. Both must be empty.
	DoubleEffects []string `json:"double_effects,omitempty"`
	BodyChanged   []string `json:"body_changed,omitempty"`
}

// OK is the webhook half of the delivery guarantee: every key took effect
// at most once and always carried the same body.
func (l Ledger) OK() bool { return len(l.DoubleEffects) == 0 && len(l.BodyChanged) == 0 }

// Summarize counts, from the deliveries alone, what happened per key.
func Summarize(ds []Delivery) Ledger {
	type perKey struct {
		body               string
		attempts, accepted int
		changed            bool
	}
	keys := map[string]*perKey{}
	var order []string
	var l Ledger
	for _, d := range ds {
		k := keys[d.Key]
		if k == nil {
			k = &perKey{body: d.Body}
			keys[d.Key] = k
			order = append(order, d.Key)
		}
		if d.Body != k.body {
			k.changed = true
		}
		switch {
		case k.accepted > 0:
			l.Resent++
		case k.attempts > 0:
			l.Retried++
		}
		k.attempts++
		l.Attempts++
		if d.Result == Accepted {
			l.Effects++
			k.accepted++
		}
	}
	l.Keys = len(keys)
	for _, key := range order {
		k := keys[key]
		if k.accepted > 1 {
			l.DoubleEffects = append(l.DoubleEffects, key)
		}
		if k.changed {
			l.BodyChanged = append(l.BodyChanged, key)
		}
	}
	return l
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
	loseLeft  int
	attempts  map[string]int // per event, since the setting was set
	events    map[string]*event
	ledger    []delivery
	// topics interns the topic names events and deliveries refer to.
	topics   []string
	topicIdx map[string]uint16
	total    Stats
	byTopic  map[string]*Stats
	// order lists event IDs first seen first; order[head:] are remembered.
	order  []string
	head   int
	retain int

	ln *simserver.Listener
}

// New returns a simulator that is not listening; use Handler (tests) or Start.
func New() *Server {
	return &Server{
		setting:  Setting{Mode: Healthy},
		attempts: map[string]int{},
		events:   map[string]*event{},
		topicIdx: map[string]uint16{},
		byTopic:  map[string]*Stats{},
		retain:   Retain,
	}
}

// remember records a new event ID and forgets the oldest beyond retain.
// Called with mu held.
func (s *Server) remember(id string) {
	s.order = append(s.order, id)
	for len(s.order)-s.head > s.retain {
		old := s.order[s.head]
		s.order[s.head] = ""
		s.head++
		delete(s.events, old)
		delete(s.attempts, old)
		s.total.Forgotten++
	}
	if s.head > 0 && s.head >= max(s.retain/4, 1) {
		// Compact once a quarter of retain is forgotten: the ledger holds
		// the deliveries of at most 1.25 × retain events, and the work per
		// event stays constant.
		s.order = slices.Clone(s.order[s.head:])
		s.head = 0
		s.ledger = slices.DeleteFunc(s.ledger, func(d delivery) bool { return s.events[d.key] == nil })
	}
}

// event is what the simulator keeps of one event ID, and delivery of one
// attempt: compact, since the Retain events of a loaded `claimflow dev`
// are a large share of its heap. Event and Delivery are their exported
// forms.
type event struct {
	id          string // the map key, order and ledger entries share it
	firstAt     int64  // Unix nanoseconds
	deliveredAt int64  // 0 until accepted
	lastError   string
	attempts    int32
	topic       uint16 // index in Server.topics
	delivered   bool
}

type delivery struct {
	key    string // the event's id
	at     int64  // Unix nanoseconds
	body   [sha256.Size]byte
	topic  uint16
	result uint8 // index in results
}

// Values of delivery.result, and the Result each stands for.
const (
	resAccepted uint8 = iota
	resDuplicate
	resRejected
	resOutage
)

var results = [...]Result{resAccepted: Accepted, resDuplicate: Duplicate, resRejected: Rejected, resOutage: Outage}

// topic interns a topic name. Called with mu held.
func (s *Server) topic(name string) uint16 {
	if i, ok := s.topicIdx[name]; ok {
		return i
	}
	i := uint16(len(s.topics))
	s.topics = append(s.topics, strings.Clone(name))
	s.topicIdx[s.topics[i]] = i
	return i
}

func (s *Server) exportEvent(e *event) Event {
	out := Event{EventID: e.id, Topic: s.topics[e.topic], Attempts: int(e.attempts), Delivered: e.delivered,
		FirstAt: time.Unix(0, e.firstAt), LastError: e.lastError}
	if e.deliveredAt != 0 {
		out.DeliveredAt = time.Unix(0, e.deliveredAt)
	}
	return out
}

func (s *Server) exportDelivery(d delivery) Delivery {
	return Delivery{Key: d.key, Topic: s.topics[d.topic], At: time.Unix(0, d.at), Body: hex.EncodeToString(d.body[:]), Result: results[d.result]}
}

// Start serves a new simulator on addr ("127.0.0.1:0" picks a free port).
func Start(addr string) (*Server, error) {
	s := New()
	l, err := simserver.Listen("notification simulator", addr, s.Handler())
	if err != nil {
		return nil, err
	}
	s.URL, s.ln = l.URL, l
	return s, nil
}

// WebhookURL is what NOTIFY_WEBHOOK_URL points to.
func (s *Server) WebhookURL() string { return s.URL + "/notifications" }

// Close stops serving after the requests in flight.
func (s *Server) Close(ctx context.Context) error {
	return s.ln.Close(ctx)
}

// Handler is the simulator's HTTP interface.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /notifications", s.receive)
	mux.HandleFunc("GET /notifications", func(w http.ResponseWriter, r *http.Request) {
		id := r.URL.Query().Get("event_id")
		e, ok := s.Event(id)
		if !ok {
			simserver.WriteJSON(w, http.StatusNotFound, map[string]string{"error": "no such event_id"})
			return
		}
		simserver.WriteJSON(w, http.StatusOK, e)
	})
	mux.HandleFunc("GET /admin/stats", func(w http.ResponseWriter, r *http.Request) {
		simserver.WriteJSON(w, http.StatusOK, s.Stats(r.URL.Query().Get("topic")))
	})
	mux.HandleFunc("GET /admin/deliveries", func(w http.ResponseWriter, r *http.Request) {
		ds := s.Deliveries(r.URL.Query().Get("topic"))
		simserver.WriteJSON(w, http.StatusOK, LedgerReport{Summary: Summarize(ds), Deliveries: ds})
	})
	mux.HandleFunc("GET /admin/mode", func(w http.ResponseWriter, _ *http.Request) {
		simserver.WriteJSON(w, http.StatusOK, s.Setting())
	})
	mux.HandleFunc("PUT /admin/mode", func(w http.ResponseWriter, r *http.Request) {
		var st Setting
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&st); err != nil {
			simserver.WriteJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		if err := s.Set(st); err != nil {
			simserver.WriteJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		simserver.WriteJSON(w, http.StatusOK, s.Setting())
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
	if st.Count < 0 || st.Attempts < 0 || st.Delay < 0 || st.LoseAnswers < 0 {
		return errors.New("count, attempts, lose_answers and delay must not be negative")
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
	s.loseLeft = st.LoseAnswers
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
	return s.exportEvent(e), true
}

// LedgerReport is the answer of GET /admin/deliveries.
type LedgerReport struct {
	Summary    Ledger     `json:"summary"`
	Deliveries []Delivery `json:"deliveries"`
}

// Deliveries returns every delivery attempt of one topic (all with ""), in
// the order they arrived.
func (s *Server) Deliveries(topic string) []Delivery {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Delivery, 0, len(s.ledger))
	for _, d := range s.ledger {
		if topic == "" || s.topics[d.topic] == topic {
			out = append(out, s.exportDelivery(d))
		}
	}
	return out
}

func (s *Server) receive(w http.ResponseWriter, r *http.Request) {
	var req consumer.WebhookRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<20)).Decode(&req); err != nil {
		simserver.WriteJSON(w, http.StatusBadRequest, map[string]string{"error": "body is not a notification batch: " + err.Error()})
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
	resp, outage, lost := s.apply(req)
	if outage {
		simserver.WriteJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "notification service unavailable (simulated outage)"})
		return
	}
	if lost {
		simserver.WriteJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "answer lost on its way back (simulated; the notifications were taken)"})
		return
	}
	simserver.WriteJSON(w, http.StatusOK, resp)
}

// apply decides each notification in order, under one lock, so that the
// counters and the dedupe set always agree.
func (s *Server) apply(req consumer.WebhookRequest) (resp consumer.WebhookResponse, outage, lost bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.total.Requests++
	st := s.setting
	outage = st.Mode == Failing && len(st.EventIDs) == 0 && st.Count == 0 && st.Attempts == 0
	if outage {
		s.total.Outages++
	} else if s.loseLeft > 0 {
		s.loseLeft--
		lost = true
	}
	resp = consumer.WebhookResponse{Results: make([]consumer.WebhookResult, 0, len(req.Notifications))}
	now := time.Now().UnixNano()
	counted := map[string]bool{}
	for _, n := range req.Notifications {
		topic := s.topic(n.Topic)
		e := s.events[n.EventID]
		if e == nil {
			e = &event{id: n.EventID, topic: topic, firstAt: now}
			s.events[e.id] = e
			s.remember(e.id)
		}
		d := delivery{key: e.id, topic: topic, at: now, body: bodyDigest(n)}
		e.attempts++
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
			e.lastError = "outage"
			d.result = resOutage
			s.ledger = append(s.ledger, d)
			continue
		}
		s.total.Received++
		ts.Received++
		if s.rejects(n.EventID) {
			s.total.Rejected++
			ts.Rejected++
			e.lastError = fmt.Sprintf("rejected (simulated failure, attempt %d)", s.attempts[n.EventID])
			resp.Results = append(resp.Results, consumer.WebhookResult{EventID: n.EventID, Status: consumer.WebhookRejected,
				Error: e.lastError})
			d.result = resRejected
			s.ledger = append(s.ledger, d)
			continue
		}
		if e.delivered {
			s.total.Duplicates++
			ts.Duplicates++
			resp.Results = append(resp.Results, consumer.WebhookResult{EventID: n.EventID, Status: consumer.WebhookDuplicate})
			d.result = resDuplicate
			s.ledger = append(s.ledger, d)
			continue
		}
		e.delivered, e.deliveredAt, e.lastError = true, now, ""
		s.total.Delivered++
		ts.Delivered++
		resp.Results = append(resp.Results, consumer.WebhookResult{EventID: n.EventID, Status: consumer.WebhookAccepted})
		d.result = resAccepted
		s.ledger = append(s.ledger, d)
	}
	return resp, outage, lost
}

// bodyDigest hashes a notification as decoded and encoded again, so the
// batch it came in and its position there do not matter.
func bodyDigest(n consumer.WebhookNotification) [sha256.Size]byte {
	b, err := json.Marshal(n)
	if err != nil {
		b = []byte("unencodable: " + err.Error())
	}
	return sha256.Sum256(b)
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
