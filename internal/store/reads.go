package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is the part of a pgx pool the store's queries use; *pgxpool.Pool,
// a pgx.Tx and a pgx.Conn all have it.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ErrNotFound wraps pgx.ErrNoRows: no row with the key asked for.
var ErrNotFound = pgx.ErrNoRows

// ErrVendorNotFound: a coupon type named a vendor that does not exist.
var ErrVendorNotFound = errors.New("vendor not found")

// The read models below are what the API answers with (their JSON is the
// API's, see api/openapi.json). Fields marked "API" are filled by the API,
// not read from the table.

// Course is a row of courses, with the seats left.
type Course struct {
	ID        string `json:"id"`
	Title     string `json:"title"`
	Capacity  int    `json:"capacity"`
	Credits   int    `json:"credits"`
	Enrolled  int    `json:"enrolled"`
	Available int    `json:"available"`
	// Waitlisted is the length of the course's waitlist.
	Waitlisted int       `json:"waitlisted"`
	CreatedAt  time.Time `json:"created_at"`
}

// InsertCourse creates a course; created is false when the ID is taken.
func InsertCourse(ctx context.Context, db DB, id, title string, capacity, credits int) (created bool, err error) {
	tag, err := db.Exec(ctx, `
		INSERT INTO courses (id, title, capacity, credits) VALUES ($1, $2, $3, $4)
		ON CONFLICT (id) DO NOTHING`, id, title, capacity, credits)
	if err != nil {
		return false, fmt.Errorf("insert course %s: %w", id, err)
	}
	return tag.RowsAffected() == 1, nil
}

// LoadCourse reads a course.
func LoadCourse(ctx context.Context, db DB, id string) (Course, error) {
	var got Course
	err := db.QueryRow(ctx, `SELECT id, title, capacity, credits, enrolled, waitlisted, created_at FROM courses WHERE id = $1`, id).
		Scan(&got.ID, &got.Title, &got.Capacity, &got.Credits, &got.Enrolled, &got.Waitlisted, &got.CreatedAt)
	got.Available = got.Capacity - got.Enrolled
	return got, err
}

// ErrBelowEnrolled: a capacity below the seats already taken.
var ErrBelowEnrolled = errors.New("capacity below the enrolled count")

// SetCapacity changes a course's capacity; never below its enrolled count
// (ErrBelowEnrolled), and ErrNotFound for no such course. It answers the
// capacity before the change. Seats a raise frees belong to the waitlist:
// the caller starts its promotion.
func SetCapacity(ctx context.Context, db DB, id string, capacity int) (before int, err error) {
	err = db.QueryRow(ctx, `
		WITH old AS (SELECT id, capacity, enrolled FROM courses WHERE id = $1 FOR UPDATE)
		UPDATE courses c SET capacity = $2 FROM old
		WHERE c.id = old.id AND old.enrolled <= $2
		RETURNING old.capacity`, id, capacity).Scan(&before)
	if errors.Is(err, pgx.ErrNoRows) {
		if _, lerr := LoadCourse(ctx, db, id); lerr != nil {
			return 0, lerr
		}
		return 0, ErrBelowEnrolled
	}
	if err != nil {
		return 0, fmt.Errorf("set the capacity of %s: %w", id, err)
	}
	return before, nil
}

// Enrollment is a row of enrollments.
type Enrollment struct {
	ID          string     `json:"id"`
	CourseID    string     `json:"course_id"`
	StudentID   string     `json:"student_id"`
	Status      string     `json:"status"`
	WorkflowID  string     `json:"workflow_id"`
	RunID       string     `json:"run_id"`
	WorkflowURL string     `json:"workflow_url,omitempty"` // API
	RequestedAt *time.Time `json:"requested_at,omitempty"`
	RecordedAt  *time.Time `json:"recorded_at,omitempty"`
	PublishedAt *time.Time `json:"published_at,omitempty"`
	ConfirmedAt *time.Time `json:"confirmed_at,omitempty"`
	CancelledAt *time.Time `json:"cancelled_at,omitempty"`
	FailedAt    *time.Time `json:"failed_at,omitempty"`
	// Position is a waitlisted enrollment's place in its course's queue
	// (1: next to be promoted); WaitlistedAt and PromotedAt say when it
	// joined and left the queue for a seat.
	Position     *int       `json:"position,omitempty"`
	WaitlistedAt *time.Time `json:"waitlisted_at,omitempty"`
	PromotedAt   *time.Time `json:"promoted_at,omitempty"`
}

// LoadEnrollment reads an enrollment.
func LoadEnrollment(ctx context.Context, db DB, id string) (Enrollment, error) {
	var e Enrollment
	err := db.QueryRow(ctx, `
		SELECT e.id, e.course_id, e.student_id, e.status, e.workflow_id, e.run_id,
		       e.requested_at, e.recorded_at, e.published_at, e.confirmed_at, e.cancelled_at, e.failed_at,
		       e.waitlisted_at, e.promoted_at
		FROM enrollments e WHERE e.id = $1`, id).
		Scan(&e.ID, &e.CourseID, &e.StudentID, &e.Status, &e.WorkflowID, &e.RunID,
			&e.RequestedAt, &e.RecordedAt, &e.PublishedAt, &e.ConfirmedAt, &e.CancelledAt, &e.FailedAt,
			&e.WaitlistedAt, &e.PromotedAt)
	if err != nil || e.Status != EnrollmentWaitlisted {
		return e, err
	}
	pos, err := WaitlistPosition(ctx, db, id)
	e.Position = &pos
	return e, err
}

// WaitlistPosition is a waitlisted enrollment's place in its course's queue
// now (1: promoted next), served by enrollments_waitlist.
func WaitlistPosition(ctx context.Context, db DB, id string) (int, error) {
	var pos int
	err := db.QueryRow(ctx, `
		SELECT count(*) FROM enrollments w, enrollments e
		WHERE e.id = $1 AND w.course_id = e.course_id AND w.holds = 'place' AND w.waitlist_seq <= e.waitlist_seq`, id).Scan(&pos)
	if err != nil {
		return 0, fmt.Errorf("position of %s on its waitlist: %w", id, err)
	}
	return pos, nil
}

// DeadLetter is a row of dead_letters.
type DeadLetter struct {
	ID           int64           `json:"id"`
	EventID      string          `json:"event_id"`
	EventType    string          `json:"event_type"`
	Topic        string          `json:"topic"`
	Key          string          `json:"key"`
	Payload      json.RawMessage `json:"payload"`
	WorkflowID   string          `json:"workflow_id"`
	RunID        string          `json:"run_id"`
	WorkflowURL  string          `json:"workflow_url,omitempty"` // API
	EnrollmentID *string         `json:"enrollment_id,omitempty"`
	Stage        string          `json:"stage"` // publish (a saga's event) or consume (a notification)
	Error        string          `json:"error"`
	Rounds       int             `json:"rounds"`
	Status       string          `json:"status"`
	CreatedAt    time.Time       `json:"created_at"`
	UpdatedAt    time.Time       `json:"updated_at"`
}

const deadLetterColumns = `id, event_id, event_type, topic, message_key, payload, workflow_id, run_id,
	enrollment_id, stage, error, rounds, status, created_at, updated_at`

func scanDeadLetter(row pgx.Row) (DeadLetter, error) {
	var d DeadLetter
	err := row.Scan(&d.ID, &d.EventID, &d.EventType, &d.Topic, &d.Key, &d.Payload, &d.WorkflowID, &d.RunID,
		&d.EnrollmentID, &d.Stage, &d.Error, &d.Rounds, &d.Status, &d.CreatedAt, &d.UpdatedAt)
	return d, err
}

// ListDeadLetters returns the newest dead letters, at most limit, of the
// given status and stage ("" for any).
func ListDeadLetters(ctx context.Context, db DB, status, stage string, limit int) ([]DeadLetter, error) {
	rows, err := db.Query(ctx, `SELECT `+deadLetterColumns+` FROM dead_letters
		WHERE ($1 = '' OR status = $1) AND ($3 = '' OR stage = $3) ORDER BY id DESC LIMIT $2`, status, limit, stage)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadLetter, error) { return scanDeadLetter(r) })
}

// LoadDeadLetter reads a dead letter.
func LoadDeadLetter(ctx context.Context, db DB, id int64) (DeadLetter, error) {
	return scanDeadLetter(db.QueryRow(ctx, `SELECT `+deadLetterColumns+` FROM dead_letters WHERE id = $1`, id))
}

// OpenDeadLetters counts the dead letters waiting for an operator.
func OpenDeadLetters(ctx context.Context, db DB) (int64, error) {
	var n int64
	err := db.QueryRow(ctx, `SELECT count(*) FROM dead_letters WHERE status = '`+DeadLetterOpen+`'`).Scan(&n)
	return n, err
}

// Vendor is a row of vendors with its latest payouts.
type Vendor struct {
	ID           string    `json:"id"`
	Name         string    `json:"name"`
	BalanceCents int64     `json:"balance_cents"`
	PayoutCount  int       `json:"payout_count"`
	Payouts      []Payout  `json:"payouts"`
	CreatedAt    time.Time `json:"created_at"`
}

// Payout is a row of the payouts ledger.
type Payout struct {
	LedgerID         int64     `json:"ledger_id"`
	IdempotencyKey   string    `json:"idempotency_key"`
	CouponID         string    `json:"coupon_id"`
	UseID            string    `json:"use_id"`
	VendorID         string    `json:"vendor_id"`
	AmountCents      int64     `json:"amount_cents"`
	ProviderPayoutID string    `json:"provider_payout_id"`
	OrderID          *string   `json:"order_id,omitempty"`
	RecordedAt       time.Time `json:"recorded_at"`
}

const payoutColumns = `id, idempotency_key, coupon_id, use_id, vendor_id, amount_cents, provider_payout_id, order_id, recorded_at`

func scanPayout(row pgx.Row) (Payout, error) {
	var p Payout
	err := row.Scan(&p.LedgerID, &p.IdempotencyKey, &p.CouponID, &p.UseID, &p.VendorID, &p.AmountCents,
		&p.ProviderPayoutID, &p.OrderID, &p.RecordedAt)
	return p, err
}

// InsertVendor creates a vendor; created is false when the ID is taken.
func InsertVendor(ctx context.Context, db DB, id, name string) (created bool, err error) {
	tag, err := db.Exec(ctx, `INSERT INTO vendors (id, name) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING`, id, name)
	if err != nil {
		return false, fmt.Errorf("insert vendor %s: %w", id, err)
	}
	return tag.RowsAffected() == 1, nil
}

// LoadVendor returns the vendor with its balance and its latest 100 payouts.
func LoadVendor(ctx context.Context, db DB, id string) (Vendor, error) {
	var v Vendor
	err := db.QueryRow(ctx, `
		SELECT id, name, balance_cents, created_at, (SELECT count(*) FROM payouts WHERE vendor_id = $1)
		FROM vendors WHERE id = $1`, id).
		Scan(&v.ID, &v.Name, &v.BalanceCents, &v.CreatedAt, &v.PayoutCount)
	if err != nil {
		return v, err
	}
	rows, err := db.Query(ctx, `SELECT `+payoutColumns+` FROM payouts WHERE vendor_id = $1 ORDER BY id DESC LIMIT 100`, id)
	if err != nil {
		return v, err
	}
	v.Payouts, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Payout, error) { return scanPayout(r) })
	return v, err
}

// CouponType is a row of coupon_types, with the stock left.
type CouponType struct {
	ID          string    `json:"id"`
	VendorID    string    `json:"vendor_id"`
	Name        string    `json:"name"`
	Stock       int       `json:"stock"`
	Issued      int       `json:"issued"`
	Remaining   int       `json:"remaining"`
	PayoutCents int64     `json:"payout_cents"`
	CreatedAt   time.Time `json:"created_at"`
}

// InsertCouponType creates a coupon type; created is false when the ID is
// taken, and the error is ErrVendorNotFound when the vendor does not exist.
func InsertCouponType(ctx context.Context, db DB, t CouponType) (created bool, err error) {
	tag, err := db.Exec(ctx, `
		INSERT INTO coupon_types (id, vendor_id, name, stock, payout_cents) VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (id) DO NOTHING`, t.ID, t.VendorID, t.Name, t.Stock, t.PayoutCents)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23503" {
		return false, ErrVendorNotFound
	}
	if err != nil {
		return false, fmt.Errorf("insert coupon type %s: %w", t.ID, err)
	}
	return tag.RowsAffected() == 1, nil
}

// LoadCouponType reads a coupon type.
func LoadCouponType(ctx context.Context, db DB, id string) (CouponType, error) {
	var t CouponType
	err := db.QueryRow(ctx, `
		SELECT id, vendor_id, name, stock, issued, payout_cents, created_at FROM coupon_types WHERE id = $1`, id).
		Scan(&t.ID, &t.VendorID, &t.Name, &t.Stock, &t.Issued, &t.PayoutCents, &t.CreatedAt)
	t.Remaining = t.Stock - t.Issued
	return t, err
}

// Coupon is a row of coupons with its type's vendor and, once used, its
// payout.
type Coupon struct {
	ID             string     `json:"id"`
	TypeID         string     `json:"type_id"`
	VendorID       string     `json:"vendor_id,omitempty"`
	UserID         string     `json:"user_id"`
	Status         string     `json:"status"`
	UseID          *string    `json:"use_id,omitempty"`
	OrderID        *string    `json:"order_id,omitempty"`
	WorkflowID     string     `json:"workflow_id"`
	RunID          string     `json:"run_id"`
	WorkflowURL    string     `json:"workflow_url,omitempty"` // API
	UseWorkflowID  *string    `json:"use_workflow_id,omitempty"`
	UseRunID       *string    `json:"use_run_id,omitempty"`
	UseWorkflowURL string     `json:"use_workflow_url,omitempty"` // API
	RequestedAt    *time.Time `json:"requested_at,omitempty"`
	IssuedAt       *time.Time `json:"issued_at,omitempty"`
	UsingAt        *time.Time `json:"using_at,omitempty"`
	UsedAt         *time.Time `json:"used_at,omitempty"`
	RevokedAt      *time.Time `json:"revoked_at,omitempty"`
	Payout         *Payout    `json:"payout,omitempty"`
}

// LoadCoupon reads a coupon and, when it is used, its payout.
func LoadCoupon(ctx context.Context, db DB, id string) (Coupon, error) {
	var k Coupon
	err := db.QueryRow(ctx, `
		SELECT c.id, c.type_id, t.vendor_id, c.user_id, c.status, c.use_id, c.order_id, c.workflow_id, c.run_id,
		       c.use_workflow_id, c.use_run_id, c.requested_at, c.issued_at, c.using_at, c.used_at, c.revoked_at
		FROM coupons c JOIN coupon_types t ON t.id = c.type_id WHERE c.id = $1`, id).
		Scan(&k.ID, &k.TypeID, &k.VendorID, &k.UserID, &k.Status, &k.UseID, &k.OrderID, &k.WorkflowID, &k.RunID,
			&k.UseWorkflowID, &k.UseRunID, &k.RequestedAt, &k.IssuedAt, &k.UsingAt, &k.UsedAt, &k.RevokedAt)
	if err != nil || k.Status != CouponUsed {
		return k, err
	}
	p, err := scanPayout(db.QueryRow(ctx, `SELECT `+payoutColumns+` FROM payouts WHERE coupon_id = $1`, id))
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return k, err
	}
	if err == nil {
		k.Payout = &p
	}
	return k, nil
}

// Notification is a row of notifications as the audit reads it.
type Notification struct {
	EventID   string
	Topic     string
	Partition int32
	Offset    int64
	Key       string
	// Path is how it was delivered: inline by the consumer or by a
	// DeliverEvent run.
	Path      string
	Seq       int64
	EventType string
	Payload   string
}

// ListNotifications returns the notifications of events of topics.
func ListNotifications(ctx context.Context, db DB, topics []string) ([]Notification, error) {
	rows, err := db.Query(ctx, `
		SELECT event_id, topic, kafka_partition, kafka_offset, message_key, path, seq, event_type, payload::text
		FROM notifications WHERE topic = ANY($1)`, topics)
	if err != nil {
		return nil, fmt.Errorf("read notifications: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Notification, error) {
		var n Notification
		err := r.Scan(&n.EventID, &n.Topic, &n.Partition, &n.Offset, &n.Key, &n.Path, &n.Seq, &n.EventType, &n.Payload)
		return n, err
	})
	if err != nil {
		return nil, fmt.Errorf("read notifications: %w", err)
	}
	return out, nil
}

// ConsumeDeadLetterStatus returns the status of each event of topics that
// the consumer dead-lettered, by event ID.
func ConsumeDeadLetterStatus(ctx context.Context, db DB, topics []string) (map[string]string, error) {
	rows, err := db.Query(ctx, `SELECT event_id, status FROM dead_letters WHERE stage = '`+StageConsume+`' AND topic = ANY($1)`, topics)
	if err != nil {
		return nil, fmt.Errorf("read consume dead letters: %w", err)
	}
	defer rows.Close()
	parked := map[string]string{}
	for rows.Next() {
		var id, status string
		if err := rows.Scan(&id, &status); err != nil {
			return nil, fmt.Errorf("read consume dead letters: %w", err)
		}
		parked[id] = status
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read consume dead letters: %w", err)
	}
	return parked, nil
}
