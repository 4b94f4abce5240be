package store_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/claimflow/claimflow/dev/pgtest"
	"github.com/claimflow/claimflow/internal/store"
)

// TestMain (pgtest.Main) is in roles_pg_test.go.

// The list fixture: 100,000 rows each of enrollments, coupons and
// notifications under one prefix, loaded once for the package's tests.
const (
	listRows     = 100_000
	listStudents = 20_000 // each student: 5 enrollments, 5 coupons, 5 notifications
	listCourses  = 997    // coprime with listStudents: one enrollment per (course, student)
	listTypes    = 97
)

var listFixture struct {
	once   sync.Once
	prefix string
	err    error
}

// loadLists fills the fixture: enrollment i is student s<i mod 20000>'s in
// course c<i mod 997>, requested at base + i ms; every 10th is cancelled;
// coupon i is user s<i mod 20000>'s of type t<i mod 97>; notification i is
// for s<i mod 20000>, unread when i is odd.
func loadLists(t *testing.T) (*pgxpool.Pool, string) {
	t.Helper()
	db, prefix := pgtest.DB(t)
	listFixture.once.Do(func() {
		listFixture.prefix = prefix
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		for _, q := range []string{
			`INSERT INTO courses (id, title, capacity)
			 SELECT $1 || '-c' || g, 'course ' || g, 1000 FROM generate_series(0, 996) g`,
			`INSERT INTO enrollments (id, course_id, student_id, status, workflow_id, run_id, requested_at, recorded_at)
			 SELECT $1 || '-e' || g, $1 || '-c' || (g % 997), $1 || '-s' || (g % 20000),
			        CASE WHEN g % 10 = 0 THEN 'cancelled' ELSE 'confirmed' END, 'wf', 'run',
			        timestamptz '2026-01-01' + g * interval '1 millisecond', timestamptz '2026-01-01' + g * interval '1 millisecond'
			 FROM generate_series(0, 99999) g`,
			`INSERT INTO vendors (id, name) VALUES ($1 || '-v', 'vendor')`,
			`INSERT INTO coupon_types (id, vendor_id, name, stock, issued, payout_cents)
			 SELECT $1 || '-t' || g, $1 || '-v', 'type ' || g, 100000, 0, 100 FROM generate_series(0, 96) g`,
			`INSERT INTO coupons (id, type_id, user_id, status, workflow_id, run_id, requested_at, issued_at, revoked_at)
			 SELECT $1 || '-k' || g, $1 || '-t' || (g % 97), $1 || '-s' || (g % 20000),
			        CASE WHEN g % 10 = 0 THEN 'revoked' ELSE 'issued' END, 'wf', 'run',
			        timestamptz '2026-01-01' + g * interval '1 millisecond', timestamptz '2026-01-01' + g * interval '1 millisecond',
			        CASE WHEN g % 10 = 0 THEN timestamptz '2026-02-01' END
			 FROM generate_series(0, 99999) g`,
			`INSERT INTO notifications (event_id, event_type, recipient, topic, kafka_partition, kafka_offset, message_key, payload, occurred_at, path, read_at)
			 SELECT $1 || '-n' || g, 'enrollment.confirmed', $1 || '-s' || (g % 20000), 'enrollment.events', 0, g, 'k',
			        jsonb_build_object('n', g), timestamptz '2026-01-01' + g * interval '1 millisecond', 'consumer',
			        CASE WHEN g % 2 = 0 THEN timestamptz '2026-03-01' END
			 FROM generate_series(0, 99999) g ORDER BY g`,
		} {
			if _, err := db.Exec(ctx, q, prefix); err != nil {
				listFixture.err = fmt.Errorf("%.60s…: %w", q, err)
				return
			}
		}
		// Only a table's owner may ANALYZE it; the pool is the runtime role's.
		ownerURL, _ := pgtest.URLs(t)
		owner, err := pgx.Connect(ctx, ownerURL)
		if err != nil {
			listFixture.err = err
			return
		}
		defer owner.Close(ctx)
		if _, err := owner.Exec(ctx, `ANALYZE courses, enrollments, vendors, coupon_types, coupons, notifications`); err != nil {
			listFixture.err = fmt.Errorf("analyze: %w", err)
		}
	})
	if listFixture.err != nil {
		t.Fatal(listFixture.err)
	}
	return db, listFixture.prefix
}

// TestListsUseTheirIndexes explains every list over the 100,000-row
// fixture: no sequential scan of a listed table, and the index the
// statement's comment names. (Where a page's rows are few, the planner may
// fetch them by that index and sort them, as cheap as reading them in
// order; and it may read the 97 coupon types whole for the join, the
// right plan for a catalogue that small.)
func TestListsUseTheirIndexes(t *testing.T) {
	db, p := loadLists(t)
	far := time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)
	args := map[string][]any{
		"student":          {p + "-s42", far, "", "confirmed", 51},
		"roster":           {p + "-c42", time.Time{}, "", 51},
		"roster by status": {p + "-c42", "confirmed", time.Time{}, "", 51},
		"coupons":          {p + "-s42", far, "", "", 51},
		"unread":           {p + "-s43", int64(1<<63 - 1), 51},
		"inbox":            {p + "-s42", int64(1<<63 - 1), 51},
	}
	for _, q := range store.ListQueries {
		t.Run(q.Name, func(t *testing.T) {
			var raw []byte
			if err := db.QueryRow(context.Background(), "EXPLAIN (FORMAT JSON) "+q.SQL, args[q.Name]...).Scan(&raw); err != nil {
				t.Fatal(err)
			}
			plan, err := pgtest.ParsePlan(raw)
			if err != nil {
				t.Fatalf("plan %s: %v", raw, err)
			}
			var types, indexes []string
			seq := false
			plan.Walk(func(n pgtest.PlanNode) {
				types = append(types, n.NodeType+" "+n.Relation)
				seq = seq || n.NodeType == "Seq Scan" && slices.Contains([]string{"enrollments", "coupons", "notifications"}, n.Relation)
				if n.IndexName != "" {
					indexes = append(indexes, n.IndexName)
				}
			})
			if seq || !slices.Contains(indexes, q.Index) {
				t.Errorf("want a scan of %s and no Seq Scan; the plan has nodes %v on indexes %v:\n%s", q.Index, types, indexes, raw)
			}
		})
	}
}

// pages reads a whole list a page of limit at a time.
func pages[T any](t *testing.T, limit int, read func(store.Page) ([]T, string, error)) [][]T {
	t.Helper()
	var out [][]T
	after := ""
	for range 1000 {
		got, next, err := read(store.Page{Limit: limit, After: after})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, got)
		if next == "" {
			return out
		}
		after = next
	}
	t.Fatal("the list never ended")
	return nil
}

func TestListsPage(t *testing.T) {
	db, p := loadLists(t)
	ctx := context.Background()
	ids := func(pp [][]store.Enrollment) (sizes []int, all []string) {
		for _, pg := range pp {
			sizes = append(sizes, len(pg))
			for _, e := range pg {
				all = append(all, e.ID)
			}
		}
		return sizes, all
	}

	// s7's enrollments are i = 7, 20007, 40007, 60007, 80007: newest first.
	got := pages(t, 2, func(pg store.Page) ([]store.Enrollment, string, error) {
		return store.StudentEnrollments(ctx, db, p+"-s7", "", pg)
	})
	sizes, all := ids(got)
	if want := []string{p + "-e80007", p + "-e60007", p + "-e40007", p + "-e20007", p + "-e7"}; !slices.Equal(all, want) || !slices.Equal(sizes, []int{2, 2, 1}) {
		t.Errorf("s7's enrollments in pages %v: %v, want %v", sizes, all, want)
	}
	// s0's: i = 0, 20000, … all multiples of 10: every one cancelled.
	if got, _, err := store.StudentEnrollments(ctx, db, p+"-s0", "confirmed", store.Page{}); err != nil || len(got) != 0 {
		t.Errorf("s0's confirmed enrollments: %v, %v; want none", got, err)
	}
	if got, _, err := store.StudentEnrollments(ctx, db, p+"-s0", "cancelled", store.Page{}); err != nil || len(got) != 5 {
		t.Errorf("s0's cancelled enrollments: %d, %v; want 5", len(got), err)
	}

	// c5's roster: i ≡ 5 (mod 997), in request order, whole and by status.
	var want, wantConfirmed []string
	for i := 5; i < listRows; i += listCourses {
		want = append(want, fmt.Sprintf("%s-e%d", p, i))
		if i%10 != 0 {
			wantConfirmed = append(wantConfirmed, fmt.Sprintf("%s-e%d", p, i))
		}
	}
	for _, tc := range []struct {
		status string
		want   []string
	}{{"", want}, {"confirmed", wantConfirmed}} {
		_, all = ids(pages(t, 7, func(pg store.Page) ([]store.Enrollment, string, error) {
			return store.CourseRoster(ctx, db, p+"-c5", tc.status, pg)
		}))
		if !slices.Equal(all, tc.want) {
			t.Errorf("c5's roster (status %q): %d rows %v…, want %d %v…", tc.status, len(all), all[:min(3, len(all))], len(tc.want), tc.want[:3])
		}
	}

	// s9's coupons: i = 9, 20009, …; none revoked (i % 10 = 9).
	coupons := pages(t, 3, func(pg store.Page) ([]store.UserCoupon, string, error) {
		return store.UserCoupons(ctx, db, p+"-s9", "", pg)
	})
	if len(coupons) != 2 || len(coupons[0]) != 3 || coupons[0][0].ID != p+"-k80009" || coupons[0][0].TypeName == "" || coupons[1][1].ID != p+"-k9" {
		t.Errorf("s9's coupons: %+v", coupons)
	}

	for _, bad := range []string{"!!", "bm90IGEgY3Vyc29y", "OjE"} {
		if _, _, err := store.StudentEnrollments(ctx, db, p+"-s7", "", store.Page{After: bad}); !errors.Is(err, store.ErrBadCursor) {
			t.Errorf("cursor %q: %v, want ErrBadCursor", bad, err)
		}
	}
}

func TestInbox(t *testing.T) {
	db, p := loadLists(t)
	ctx := context.Background()
	// s11's notifications: i = 11, 20011, …, all odd, so all unread.
	me := p + "-s11"
	inbox := func(unread bool) []string {
		var out []string
		for _, pg := range pages(t, 2, func(pg store.Page) ([]store.InboxItem, string, error) {
			return store.Inbox(ctx, db, me, unread, pg)
		}) {
			for _, n := range pg {
				out = append(out, n.EventID)
			}
		}
		return out
	}
	all := []string{p + "-n80011", p + "-n60011", p + "-n40011", p + "-n20011", p + "-n11"}
	if got := inbox(true); !slices.Equal(got, all) {
		t.Fatalf("unread inbox %v, want %v", got, all)
	}
	newest, _, err := store.Inbox(ctx, db, me, false, store.Page{Limit: 1})
	if err != nil || len(newest) != 1 || newest[0].EventID != p+"-n80011" {
		t.Fatalf("newest: %+v, %v", newest, err)
	}
	// Someone else's notification looks missing and stays unread.
	if _, found, err := store.MarkRead(ctx, db, p+"-s12", newest[0].ID); err != nil || found {
		t.Errorf("s12 marking s11's notification: found %v, %v", found, err)
	}
	n, found, err := store.MarkRead(ctx, db, me, newest[0].ID)
	if err != nil || !found || n.ReadAt == nil || n.EventID != p+"-n80011" {
		t.Fatalf("mark read: %+v %v %v", n, found, err)
	}
	again, _, _ := store.MarkRead(ctx, db, me, newest[0].ID)
	if _, found, err := store.MarkRead(ctx, db, "", newest[0].ID); err != nil || !found {
		t.Errorf("an admin's mark (no recipient): found %v, %v", found, err)
	}
	if !again.ReadAt.Equal(*n.ReadAt) {
		t.Errorf("marking twice moved read_at from %s to %s", n.ReadAt, again.ReadAt)
	}
	if got := inbox(true); !slices.Equal(got, all[1:]) {
		t.Errorf("unread after one read: %v", got)
	}
	// Mark everything up to the 40011 one read: 40011, 20011, 11.
	items, _, _ := store.Inbox(ctx, db, me, false, store.Page{Limit: 3})
	marked, err := store.MarkAllRead(ctx, db, me, items[2].Cursor)
	if err != nil || marked != 3 {
		t.Errorf("mark all read before %s: %d, %v; want 3", items[2].EventID, marked, err)
	}
	if got := inbox(true); !slices.Equal(got, []string{p + "-n60011"}) {
		t.Errorf("unread after marking up to 40011: %v", got)
	}
	if got := inbox(false); !slices.Equal(got, all) {
		t.Errorf("whole inbox %v, want %v", got, all)
	}
}
