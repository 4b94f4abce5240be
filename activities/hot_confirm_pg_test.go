package activities

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/claimflow/claimflow/workflows"
)

// TestConfirmIsHOT: a claim's confirm, the update that stamps published_at
// and moves it from reserved to confirmed, is a HOT update: its new row
// version is a heap-only tuple, on the page of the old one, and no index
// gets an entry for it (migrations/00009_hot_confirm.sql). When an index
// held status, each confirm added an entry to five indexes, and those grew
// past shared_buffers over ten minutes at 2,000 claims/s.
//
// It tests the worst case for room on a page: every row of the page is
// confirmed while its old version stays. A batch's rows fill pages together
// and its confirm is one statement, so its old versions stay until it
// commits; an open snapshot keeps those of earlier batches too. At
// fillfactor 50 a page's last confirm then found no room, because the
// confirmed version is wider: 1,925 of these 2,000 confirms were HOT, 4.2 %
// not HOT at 2,000 claims/s. Each of those leaves a dead item pointer that
// makes every vacuum scan all indexes (00010_hot_confirm_room.sql).
//
// The batches go as desks send them: reserve, then confirm, each its own
// transaction. pageinspect, as the superuser, tells whether each row's current
// version is heap-only (HEAP_ONLY_TUPLE, 0x8000 in t_infomask2).
func TestConfirmIsHOT(t *testing.T) {
	db, p := testDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a := testActivities(t, db)
	course := p + "course"
	addCourse(t, db, course, 100000)
	const batches, size = 20, 100
	var all []string
	var batchIDs [][]string
	for b := range batches {
		ids := reserveWide(ctx, t, a, p, course, b, size)
		batchIDs = append(batchIDs, ids)
		all = append(all, ids...)
	}

	// A snapshot taken now sees every reserved version, so no confirm can
	// prune one to make room.
	holder, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(context.Background())
	if _, err := holder.Exec(ctx, "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"); err != nil {
		t.Fatal(err)
	}
	var held int
	if err := holder.QueryRow(ctx, "SELECT count(*) FROM enrollments WHERE id = ANY($1)", all).Scan(&held); err != nil || held != len(all) {
		t.Fatalf("the snapshot sees %d of %d enrollments (%v)", held, len(all), err)
	}
	for _, ids := range batchIDs {
		if err := a.recordPublished(ctx, ids, true); err != nil {
			t.Fatal(err)
		}
	}

	su := superuser(ctx, t)
	if _, err := su.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pageinspect"); err != nil {
		t.Fatal(err)
	}
	var confirmed, heapOnly int
	if err := su.QueryRow(ctx, `
		SELECT count(*), count(*) FILTER (WHERE (i.t_infomask2 & 32768) <> 0)
		FROM enrollments e
		CROSS JOIN LATERAL heap_page_items(get_raw_page('enrollments', (e.ctid::text::point)[0]::int)) i
		WHERE e.id = ANY($1) AND e.status = 'confirmed' AND i.lp = (e.ctid::text::point)[1]::int`, all).
		Scan(&confirmed, &heapOnly); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d of %d confirmed enrollments are heap-only tuples (HOT updates)", heapOnly, confirmed)
	if confirmed != batches*size {
		t.Fatalf("%d enrollments confirmed, want %d", confirmed, batches*size)
	}
	// Rows of other tests may share these pages; their updates need no
	// more room than these.
	if heapOnly != confirmed {
		t.Errorf("only %d of %d confirms were HOT updates: an index holds a column the confirm changes, or the pages are full", heapOnly, confirmed)
	}
}

// reserveWide reserves n seats on course in one desk batch, as the desks
// do, with rows as wide as the load's (UUID-long enrollment and batch
// IDs), and returns the enrollment IDs.
func reserveWide(ctx context.Context, t *testing.T, a *Activities, p, course string, batch, n int) []string {
	t.Helper()
	in := workflows.ReserveSeatsInput{WorkflowID: "enrollment-desk:0", RunID: "0193a5c4-7f2e-7b4e-9d61-3c8f1e2a4b5d"}
	var ids []string
	for i := range n {
		id := uuidLong(fmt.Sprintf("%se%04d-%04d-", p, batch, i))
		ids = append(ids, id)
		now := time.Now().UTC()
		in.Claims = append(in.Claims, workflows.EnrollmentInput{EnrollmentID: id, CourseID: course,
			StudentID: fmt.Sprintf("%ss%d-%d", p, batch, i), RequestedAt: now, OccurredAt: now, BatchID: uuidLong(fmt.Sprintf("%sb%04d-", p, batch))})
	}
	if _, err := a.ReserveSeats(ctx, in); err != nil {
		t.Fatal(err)
	}
	return ids
}

// uuidLong pads s to the 36 characters of a UUID, the length of the IDs the
// API and the desks give enrollments and batches.
func uuidLong(s string) string {
	if len(s) >= 36 {
		return s
	}
	return s + strings.Repeat("0", 36-len(s))
}
