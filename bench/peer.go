package bench

// The peer is what the user built instead of claimflow, reduced to its
// essentials: an HTTP handler that holds the seat, records the enrollment
// and writes an outbox row in one Postgres transaction, and a relay that
// publishes outbox rows with the same acks=all idempotent sarama producer
// claimflow uses and marks them sent. It gives the same guarantees (no
// oversell, one enrollment per student and course, every accepted
// enrollment's event published at least once with a deterministic event_id)
// on the same Postgres and Kafka, in its own tables and topic.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/claimflow/claimflow/internal/kafka"
	"github.com/claimflow/claimflow/workflows"
)

// PeerTopic is where the peer's relay publishes.
const PeerTopic = "peer.enrollment.events"

// PeerSchema is the peer's tables and topic.
var PeerSchema = Schema{Courses: "peer_courses", Enrollments: "peer_enrollments", Topic: PeerTopic}

const peerDDL = `
CREATE TABLE IF NOT EXISTS peer_courses (
    id          text PRIMARY KEY,
    title       text NOT NULL,
    capacity    integer NOT NULL CHECK (capacity >= 0),
    enrolled    integer NOT NULL DEFAULT 0 CHECK (enrolled >= 0 AND enrolled <= capacity),
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS peer_enrollments (
    id            text PRIMARY KEY,
    course_id     text NOT NULL REFERENCES peer_courses (id),
    student_id    text NOT NULL,
    status        text NOT NULL CHECK (status IN ('reserved', 'confirmed')),
    requested_at  timestamptz NOT NULL,
    recorded_at   timestamptz NOT NULL,
    published_at  timestamptz,
    confirmed_at  timestamptz,
    UNIQUE (course_id, student_id)
);
CREATE TABLE IF NOT EXISTS peer_outbox (
    id            bigserial PRIMARY KEY,
    event_id      text NOT NULL UNIQUE,
    enrollment_id text NOT NULL REFERENCES peer_enrollments (id),
    topic         text NOT NULL,
    message_key   text NOT NULL,
    payload       jsonb NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    published_at  timestamptz
);
CREATE INDEX IF NOT EXISTS peer_outbox_unsent ON peer_outbox (id) WHERE published_at IS NULL;
`

// ensurePeerSchema creates the peer's tables, serialized with an advisory
// lock so concurrent benches do not race on CREATE TABLE IF NOT EXISTS.
func ensurePeerSchema(ctx context.Context, db *pgxpool.Pool) error {
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(727274)`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, peerDDL); err != nil {
			return fmt.Errorf("create the peer's tables as MIGRATE_DATABASE_URL's role (the schema owner; the services' runtime role may not create tables): %w", err)
		}
		return nil
	})
}

// Peer is a running outbox peer: its API on Addr and its relay.
type Peer struct {
	Addr   string
	db     *pgxpool.Pool
	server *http.Server
	relay  *relay
	done   chan struct{}
}

// peerTablesFirst creates the peer's tables on peerDB (db when nil) before
// a run with two arms starts its first, claimflow's: a role that may not
// create them ends the run at once rather than after claimflow's minutes.
func peerTablesFirst(ctx context.Context, db, peerDB *pgxpool.Pool) error {
	if peerDB == nil {
		peerDB = db
	}
	if peerDB == nil {
		return errors.New("the outbox peer needs a database: set DB or PeerDB")
	}
	if err := ensurePeerSchema(ctx, peerDB); err != nil {
		return fmt.Errorf("the outbox peer, before either arm: %w", err)
	}
	return nil
}

// PeerOptions configures StartPeer.
type PeerOptions struct {
	DB    *pgxpool.Pool
	Kafka kafka.Config
	Log   *slog.Logger
	// Relays is the number of relay goroutines (each claims a batch with
	// FOR UPDATE SKIP LOCKED); Batch the rows per claim; Poll the pause
	// after an empty claim.
	Relays int
	Batch  int
	Poll   time.Duration
}

// StartPeer creates the peer's tables and topic, then serves its API on a
// free port of 127.0.0.1 and starts the relay.
func StartPeer(ctx context.Context, o PeerOptions) (*Peer, error) {
	if o.Relays <= 0 {
		o.Relays = 4
	}
	if o.Batch <= 0 {
		o.Batch = 200
	}
	if o.Poll <= 0 {
		o.Poll = 20 * time.Millisecond
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if err := ensurePeerSchema(ctx, o.DB); err != nil {
		return nil, err
	}
	// Same partitioning as claimflow's topic.
	if err := kafka.EnsureTopics(ctx, o.Kafka, []kafka.Topic{{Name: PeerTopic, Partitions: 12, Replicas: 1}}); err != nil {
		return nil, err
	}
	rl, err := startRelay(o)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		rl.Stop()
		return nil, err
	}
	p := &Peer{
		Addr:  ln.Addr().String(),
		db:    o.DB,
		relay: rl,
		done:  make(chan struct{}),
	}
	p.server = &http.Server{Handler: p.handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		defer close(p.done)
		if err := p.server.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			o.Log.Error("peer API stopped", "error", err)
		}
	}()
	return p, nil
}

// URL is the peer API's base URL.
func (p *Peer) URL() string { return "http://" + p.Addr }

// Stop lets in-flight requests finish, then stops the relay.
func (p *Peer) Stop(ctx context.Context) error {
	err := p.server.Shutdown(ctx)
	<-p.done
	p.relay.Stop()
	return err
}

func (p *Peer) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("POST /v1/courses", p.createCourse)
	mux.HandleFunc("POST /v1/courses/{id}/enrollments", p.enroll)
	mux.HandleFunc("GET /v1/enrollments/{id}", p.getEnrollment)
	return mux
}

var peerID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]string{"code": code, "message": msg}})
}

func (p *Peer) createCourse(w http.ResponseWriter, r *http.Request) {
	var req struct {
		ID       string `json:"id"`
		Title    string `json:"title"`
		Capacity int    `json:"capacity"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10)).Decode(&req); err != nil {
		writeErr(w, http.StatusBadRequest, "invalid_json", err.Error())
		return
	}
	if !peerID.MatchString(req.ID) || strings.TrimSpace(req.Title) == "" || req.Capacity < 0 {
		writeErr(w, http.StatusBadRequest, "invalid_field", "id, title and capacity >= 0 are required")
		return
	}
	tag, err := p.db.Exec(r.Context(), `INSERT INTO peer_courses (id, title, capacity) VALUES ($1, $2, $3)
		ON CONFLICT (id) DO NOTHING`, req.ID, req.Title, req.Capacity)
	if err != nil {
		writeErr(w, http.StatusInternalServerError, "internal", err.Error())
		return
	}
	if tag.RowsAffected() == 0 {
		writeErr(w, http.StatusConflict, "course_exists", "a course with this id already exists")
		return
	}
	writeJSON(w, http.StatusCreated, map[string]any{"id": req.ID, "title": req.Title, "capacity": req.Capacity})
}

var (
	errCourseFull      = errors.New("course_full")
	errAlreadyEnrolled = errors.New("already_enrolled")
	errCourseNotFound  = errors.New("course_not_found")
)

// enroll is the whole claim in one transaction: the enrollment row (unique
// per course and student), the conditional seat UPDATE, and the outbox row
// carrying enrollment.confirmed. Commit means the event will be published.
func (p *Peer) enroll(w http.ResponseWriter, r *http.Request) {
	requestedAt := time.Now().UTC()
	courseID := r.PathValue("id")
	var req struct {
		StudentID string `json:"student_id"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10)).Decode(&req); err != nil {
		writeErr(w, http.StatusBadRequest, "invalid_json", err.Error())
		return
	}
	if !peerID.MatchString(courseID) || !peerID.MatchString(req.StudentID) {
		writeErr(w, http.StatusBadRequest, "invalid_field", "course and student_id must be 1-64 of A-Z a-z 0-9 _ . -")
		return
	}
	id, err := uuid.NewV7()
	if err != nil {
		writeErr(w, http.StatusInternalServerError, "internal", err.Error())
		return
	}
	enrollmentID := id.String()
	event := workflows.Event{
		ID:         workflows.EventID(enrollmentID, workflows.EventEnrollmentConfirmed),
		Type:       workflows.EventEnrollmentConfirmed,
		OccurredAt: requestedAt,
		Data:       map[string]any{"enrollment_id": enrollmentID, "course_id": courseID, "student_id": req.StudentID},
	}
	payload, err := json.Marshal(event)
	if err != nil {
		writeErr(w, http.StatusInternalServerError, "internal", err.Error())
		return
	}
	err = pgx.BeginFunc(r.Context(), p.db, func(tx pgx.Tx) error {
		tag, err := tx.Exec(r.Context(), `
			INSERT INTO peer_enrollments (id, course_id, student_id, status, requested_at, recorded_at)
			VALUES ($1, $2, $3, 'reserved', $4, clock_timestamp())
			ON CONFLICT (course_id, student_id) DO NOTHING`, enrollmentID, courseID, req.StudentID, requestedAt)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23503" {
			return errCourseNotFound
		}
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return errAlreadyEnrolled
		}
		tag, err = tx.Exec(r.Context(), `UPDATE peer_courses SET enrolled = enrolled + 1 WHERE id = $1 AND enrolled < capacity`, courseID)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return errCourseFull
		}
		_, err = tx.Exec(r.Context(), `INSERT INTO peer_outbox (event_id, enrollment_id, topic, message_key, payload)
			VALUES ($1, $2, $3, $4, $5)`, event.ID, enrollmentID, PeerTopic, courseID, payload)
		return err
	})
	switch {
	case errors.Is(err, errCourseFull), errors.Is(err, errAlreadyEnrolled):
		writeErr(w, http.StatusConflict, err.Error(), err.Error())
	case errors.Is(err, errCourseNotFound):
		writeErr(w, http.StatusNotFound, err.Error(), "no course with this id")
	case err != nil:
		writeErr(w, http.StatusInternalServerError, "internal", err.Error())
	default:
		writeJSON(w, http.StatusCreated, map[string]any{"id": enrollmentID, "course_id": courseID,
			"student_id": req.StudentID, "status": "reserved"})
	}
}

func (p *Peer) getEnrollment(w http.ResponseWriter, r *http.Request) {
	var e struct {
		ID          string     `json:"id"`
		CourseID    string     `json:"course_id"`
		StudentID   string     `json:"student_id"`
		Status      string     `json:"status"`
		RequestedAt time.Time  `json:"requested_at"`
		RecordedAt  time.Time  `json:"recorded_at"`
		PublishedAt *time.Time `json:"published_at,omitempty"`
		ConfirmedAt *time.Time `json:"confirmed_at,omitempty"`
	}
	err := p.db.QueryRow(r.Context(), `SELECT id, course_id, student_id, status, requested_at, recorded_at, published_at, confirmed_at
		FROM peer_enrollments WHERE id = $1`, r.PathValue("id")).
		Scan(&e.ID, &e.CourseID, &e.StudentID, &e.Status, &e.RequestedAt, &e.RecordedAt, &e.PublishedAt, &e.ConfirmedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		writeErr(w, http.StatusNotFound, "enrollment_not_found", "no enrollment with this id")
		return
	}
	if err != nil {
		writeErr(w, http.StatusInternalServerError, "internal", err.Error())
		return
	}
	writeJSON(w, http.StatusOK, e)
}
