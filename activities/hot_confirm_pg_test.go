package activities

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/claimflow/claimflow/dev/pgtest"
	"github.com/claimflow/claimflow/workflows"
)

// TestConfirmIsHOT: a claim's confirm, the update that stamps published_at
// and moves it from reserved to confirmed, is a HOT update: its new row
// version is a heap-only tuple, on the page of the old one, and no index
// gets an entry for it (migrations/00009_hot_confirm.sql). When an index
// held status, each confirm added an entry to five indexes, and those grew
// past shared_buffers over ten minutes at 2,000 claims/s.
//
// The batches go as a desk sends them: reserve, then confirm, each its own
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
	for b := range batches {
		// IDs as long as a desk's.
		in := workflows.ReserveSeatsInput{WorkflowID: "enrollment-desk:0", RunID: "0193a5c4-7f2e-7b4e-9d61-3c8f1e2a4b5d"}
		var ids []string
		for i := range size {
			id := fmt.Sprintf("%se%d-%d", p, b, i)
			ids = append(ids, id)
			now := time.Now().UTC()
			in.Claims = append(in.Claims, workflows.EnrollmentInput{EnrollmentID: id, CourseID: course,
				StudentID: fmt.Sprintf("%ss%d-%d", p, b, i), RequestedAt: now, OccurredAt: now, BatchID: fmt.Sprintf("%sb%d", p, b)})
		}
		if _, err := a.ReserveSeats(ctx, in); err != nil {
			t.Fatal(err)
		}
		if err := a.recordPublished(ctx, ids, true); err != nil {
			t.Fatal(err)
		}
		all = append(all, ids...)
	}

	su, err := pgx.Connect(ctx, pgtest.SuperuserURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer su.Close(context.Background())
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
	// A confirm is not HOT when its page is full; fillfactor 50 leaves
	// room, but rows of other tests share the pages.
	if heapOnly < confirmed*9/10 {
		t.Errorf("only %d of %d confirms were HOT updates: an index holds a column the confirm changes, or the pages are full", heapOnly, confirmed)
	}
}
