package store

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// MaxPageLimit bounds one page of any list; DefaultPageLimit is a page
// when the client names no limit.
const (
	MaxPageLimit     = 200
	DefaultPageLimit = 50
)

// ErrBadCursor: an ?after= value that no list of ours handed out.
var ErrBadCursor = errors.New("not a cursor this list handed out")

// Page is one request's slice of a list: at most Limit rows after the
// row the cursor After names (empty: from the start).
type Page struct {
	Limit int
	After string
}

// keyset is the position of a row in a list ordered by (at, id).
type keyset struct {
	At time.Time
	ID string
}

// encode makes an opaque cursor; microseconds are Postgres's precision,
// so the position round-trips exactly.
func (k keyset) encode() string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(k.At.UnixMicro(), 10) + ":" + k.ID))
}

// The times a cursor may name: the sentinels of the lists' two ends and
// every row between them. PostgreSQL refuses times before 4713 BC, so a
// tampered time would otherwise reach the query as an error.
var (
	firstCursorTime = time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)
	lastCursorTime  = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)
)

// maxCursorIDBytes bounds a cursor's ID (the API takes IDs of 64 bytes
// and makes UUIDs; a cursor is at most 512 bytes anyway).
const maxCursorIDBytes = 256

// decodeKeyset reads a cursor; "" is the start of the list, which is
// before (ascending) or after (descending) every row. Only what encode
// makes is a cursor: the same bytes back (no padding, no line breaks, no
// sign or leading zero), a time within the sentinels and an ID of valid
// UTF-8 without control characters, so nothing the database would refuse
// gets past this (ErrBadCursor, the API's 400).
func decodeKeyset(s string, descending bool) (keyset, error) {
	if s == "" {
		if descending {
			return keyset{At: lastCursorTime}, nil
		}
		return keyset{At: firstCursorTime}, nil
	}
	raw, err := base64.RawURLEncoding.Strict().DecodeString(s)
	if err != nil {
		return keyset{}, ErrBadCursor
	}
	micros, id, ok := strings.Cut(string(raw), ":")
	us, err := strconv.ParseInt(micros, 10, 64)
	if !ok || err != nil || !validCursorID(id) ||
		us < firstCursorTime.UnixMicro() || us > lastCursorTime.UnixMicro() {
		return keyset{}, ErrBadCursor
	}
	k := keyset{At: time.UnixMicro(us).UTC(), ID: id}
	if k.encode() != s {
		return keyset{}, ErrBadCursor
	}
	return k, nil
}

func validCursorID(id string) bool {
	if id == "" || len(id) > maxCursorIDBytes || !utf8.ValidString(id) {
		return false
	}
	return strings.IndexFunc(id, unicode.IsControl) < 0
}

// decodeSeq reads a cursor of a list ordered by a sequence number: a
// positive int64 as encodeSeq writes it, nothing else.
func decodeSeq(s string) (int64, error) {
	if s == "" {
		return 1<<63 - 1, nil
	}
	raw, err := base64.RawURLEncoding.Strict().DecodeString(s)
	if err != nil {
		return 0, ErrBadCursor
	}
	n, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil || n < 1 || encodeSeq(n) != s {
		return 0, ErrBadCursor
	}
	return n, nil
}

func encodeSeq(n int64) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(n, 10)))
}

// limitOf bounds a page; the API has already refused values out of range.
func limitOf(p Page) int {
	if p.Limit < 1 {
		return DefaultPageLimit
	}
	return min(p.Limit, MaxPageLimit)
}

// page trims the one extra row a query fetched to learn whether there is
// a next page, and names the cursor of the last row kept.
func page[T any](rows []T, limit int, cursor func(T) string) ([]T, string) {
	if len(rows) <= limit {
		return rows, ""
	}
	rows = rows[:limit]
	return rows, cursor(rows[limit-1])
}

const enrollmentColumns = `id, course_id, student_id, status, workflow_id, run_id,
	requested_at, recorded_at, published_at, confirmed_at, cancelled_at, failed_at`

// The lists' statements, each served in order by the index its comment
// names; TestListsUseTheirIndexes explains them over 100,000 rows.
const (
	// enrollments_student
	sqlStudentEnrollments = `
		SELECT ` + enrollmentColumns + ` FROM enrollments
		WHERE student_id = $1 AND (requested_at, id) < ($2, $3) AND ($4 = '' OR status = $4)
		ORDER BY requested_at DESC, id DESC LIMIT $5`
	// enrollments_roster
	sqlRoster = `
		SELECT ` + enrollmentColumns + ` FROM enrollments
		WHERE course_id = $1 AND (requested_at, id) > ($2, $3)
		ORDER BY requested_at, id LIMIT $4`
	// enrollments_roster, filtered: no index holds status, so that a claim's
	// confirm adds no index entry (migrations/00009_hot_confirm.sql). A
	// page of a status few enrollments of the course are in reads further
	// along the roster to fill up.
	sqlRosterByStatus = `
		SELECT ` + enrollmentColumns + ` FROM enrollments
		WHERE course_id = $1 AND status = $2 AND (requested_at, id) > ($3, $4)
		ORDER BY requested_at, id LIMIT $5`
	// coupons_user
	sqlUserCoupons = `
		SELECT c.id, c.type_id, t.name, t.vendor_id, c.user_id, c.status, c.use_id, c.order_id,
		       c.issued_at, c.using_at, c.used_at, c.revoked_at
		FROM coupons c JOIN coupon_types t ON t.id = c.type_id
		WHERE c.user_id = $1 AND (c.issued_at, c.id) < ($2, $3) AND ($4 = '' OR c.status = $4)
		ORDER BY c.issued_at DESC, c.id DESC LIMIT $5`
	// notifications_unread
	sqlInboxUnread = `
		SELECT event_id, event_type, topic, payload, occurred_at, delivered_at, read_at, seq
		FROM notifications WHERE recipient = $1 AND read_at IS NULL AND seq < $2
		ORDER BY seq DESC LIMIT $3`
	// notifications_inbox
	sqlInbox = `
		SELECT event_id, event_type, topic, payload, occurred_at, delivered_at, read_at, seq
		FROM notifications WHERE recipient = $1 AND seq < $2
		ORDER BY seq DESC LIMIT $3`
)

func scanEnrollments(rows pgx.Rows) ([]Enrollment, error) {
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Enrollment, error) {
		var e Enrollment
		err := r.Scan(&e.ID, &e.CourseID, &e.StudentID, &e.Status, &e.WorkflowID, &e.RunID,
			&e.RequestedAt, &e.RecordedAt, &e.PublishedAt, &e.ConfirmedAt, &e.CancelledAt, &e.FailedAt)
		return e, err
	})
}

func enrollmentCursor(e Enrollment) string {
	return keyset{At: *e.RequestedAt, ID: e.ID}.encode()
}

// StudentEnrollments lists a student's enrollments, newest request first,
// only those in status when it is not empty (served by enrollments_student).
func StudentEnrollments(ctx context.Context, db DB, studentID, status string, p Page) ([]Enrollment, string, error) {
	k, err := decodeKeyset(p.After, true)
	if err != nil {
		return nil, "", err
	}
	limit := limitOf(p)
	rows, err := db.Query(ctx, sqlStudentEnrollments, studentID, k.At, k.ID, status, limit+1)
	if err != nil {
		return nil, "", fmt.Errorf("list enrollments of student %s: %w", studentID, err)
	}
	got, err := scanEnrollments(rows)
	if err != nil {
		return nil, "", fmt.Errorf("list enrollments of student %s: %w", studentID, err)
	}
	out, next := page(got, limit, enrollmentCursor)
	return out, next, nil
}

// CourseRoster lists a course's enrollments in request order: all of them
// or those in status (both served by enrollments_roster).
func CourseRoster(ctx context.Context, db DB, courseID, status string, p Page) ([]Enrollment, string, error) {
	k, err := decodeKeyset(p.After, false)
	if err != nil {
		return nil, "", err
	}
	limit := limitOf(p)
	var rows pgx.Rows
	if status == "" {
		rows, err = db.Query(ctx, sqlRoster, courseID, k.At, k.ID, limit+1)
	} else {
		rows, err = db.Query(ctx, sqlRosterByStatus, courseID, status, k.At, k.ID, limit+1)
	}
	if err != nil {
		return nil, "", fmt.Errorf("list the roster of course %s: %w", courseID, err)
	}
	got, err := scanEnrollments(rows)
	if err != nil {
		return nil, "", fmt.Errorf("list the roster of course %s: %w", courseID, err)
	}
	out, next := page(got, limit, enrollmentCursor)
	return out, next, nil
}

// UserCoupon is one coupon of a user's list: the coupon, its type's name
// and vendor, and its use.
type UserCoupon struct {
	ID       string     `json:"id"`
	TypeID   string     `json:"type_id"`
	TypeName string     `json:"type_name"`
	VendorID string     `json:"vendor_id"`
	UserID   string     `json:"user_id"`
	Status   string     `json:"status"`
	UseID    *string    `json:"use_id,omitempty"`
	OrderID  *string    `json:"order_id,omitempty"`
	IssuedAt *time.Time `json:"issued_at"`
	UsingAt  *time.Time `json:"using_at,omitempty"`
	UsedAt   *time.Time `json:"used_at,omitempty"`
	// Revoked coupons are listed too: the user sees what happened.
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
}

// UserCoupons lists a user's coupons, newest first, only those in status
// when it is not empty (served by coupons_user).
func UserCoupons(ctx context.Context, db DB, userID, status string, p Page) ([]UserCoupon, string, error) {
	k, err := decodeKeyset(p.After, true)
	if err != nil {
		return nil, "", err
	}
	limit := limitOf(p)
	rows, err := db.Query(ctx, sqlUserCoupons, userID, k.At, k.ID, status, limit+1)
	if err != nil {
		return nil, "", fmt.Errorf("list coupons of user %s: %w", userID, err)
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (UserCoupon, error) {
		var c UserCoupon
		err := r.Scan(&c.ID, &c.TypeID, &c.TypeName, &c.VendorID, &c.UserID, &c.Status, &c.UseID, &c.OrderID,
			&c.IssuedAt, &c.UsingAt, &c.UsedAt, &c.RevokedAt)
		return c, err
	})
	if err != nil {
		return nil, "", fmt.Errorf("list coupons of user %s: %w", userID, err)
	}
	out, next := page(got, limit, func(c UserCoupon) string { return keyset{At: *c.IssuedAt, ID: c.ID}.encode() })
	return out, next, nil
}

// InboxItem is one notification as its recipient reads it.
type InboxItem struct {
	// ID is the notification's delivery sequence number: unique, and
	// safe in a URL path, where event IDs ("<claim>/<type>") are not.
	ID          int64           `json:"id"`
	EventID     string          `json:"event_id"`
	EventType   string          `json:"event_type"`
	Topic       string          `json:"topic"`
	Payload     json.RawMessage `json:"payload"`
	OccurredAt  *time.Time      `json:"occurred_at,omitempty"`
	DeliveredAt time.Time       `json:"delivered_at"`
	ReadAt      *time.Time      `json:"read_at,omitempty"`
	// Cursor names this item's place in the inbox, for "mark everything
	// up to here read".
	Cursor string `json:"cursor"`
}

// Inbox lists a recipient's notifications, newest delivered first; only
// unread ones when unreadOnly (served by notifications_inbox and
// notifications_unread).
func Inbox(ctx context.Context, db DB, recipient string, unreadOnly bool, p Page) ([]InboxItem, string, error) {
	after, err := decodeSeq(p.After)
	if err != nil {
		return nil, "", err
	}
	limit := limitOf(p)
	var rows pgx.Rows
	if unreadOnly {
		rows, err = db.Query(ctx, sqlInboxUnread, recipient, after, limit+1)
	} else {
		rows, err = db.Query(ctx, sqlInbox, recipient, after, limit+1)
	}
	if err != nil {
		return nil, "", fmt.Errorf("list notifications of %s: %w", recipient, err)
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (InboxItem, error) {
		var n InboxItem
		err := r.Scan(&n.EventID, &n.EventType, &n.Topic, &n.Payload, &n.OccurredAt, &n.DeliveredAt, &n.ReadAt, &n.ID)
		n.Cursor = encodeSeq(n.ID)
		return n, err
	})
	if err != nil {
		return nil, "", fmt.Errorf("list notifications of %s: %w", recipient, err)
	}
	out, next := page(got, limit, func(n InboxItem) string { return n.Cursor })
	return out, next, nil
}

// MarkRead marks one of recipient's notifications read (any recipient's
// when recipient is empty: an admin's call). found is false when there is
// no such notification of recipient (someone else's looks the same as a
// missing one); marking twice keeps the first read_at. The seq index
// (notifications_seq, the column's own) finds the row.
func MarkRead(ctx context.Context, db DB, recipient string, id int64) (item InboxItem, found bool, err error) {
	err = db.QueryRow(ctx, `
		UPDATE notifications SET read_at = coalesce(read_at, now())
		WHERE seq = $1 AND ($2 = '' OR recipient = $2)
		RETURNING event_id, event_type, topic, payload, occurred_at, delivered_at, read_at, seq`, id, recipient).
		Scan(&item.EventID, &item.EventType, &item.Topic, &item.Payload, &item.OccurredAt, &item.DeliveredAt, &item.ReadAt, &item.ID)
	if errors.Is(err, pgx.ErrNoRows) {
		return item, false, nil
	}
	if err != nil {
		return item, false, fmt.Errorf("mark notification %d read: %w", id, err)
	}
	item.Cursor = encodeSeq(item.ID)
	return item, true, nil
}

// MarkAllRead marks read every unread notification of recipient up to and
// including the one the cursor before names (empty: all of them), and
// says how many it marked.
func MarkAllRead(ctx context.Context, db DB, recipient, before string) (int64, error) {
	upTo := int64(1<<63 - 1)
	if before != "" {
		n, err := decodeSeq(before)
		if err != nil {
			return 0, err
		}
		upTo = n
	}
	tag, err := db.Exec(ctx, `
		UPDATE notifications SET read_at = now()
		WHERE recipient = $1 AND read_at IS NULL AND seq <= $2`, recipient, upTo)
	if err != nil {
		return 0, fmt.Errorf("mark notifications of %s read: %w", recipient, err)
	}
	return tag.RowsAffected(), nil
}
