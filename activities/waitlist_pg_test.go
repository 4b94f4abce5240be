package activities

// The waitlist's guards, contended on the real database: positions are
// first come first served, the bound holds, promotions go head first into
// free seats only, a retried promotion finds its own, and nobody holds a
// place and a seat in one course.

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/claimflow/claimflow/internal/store"
	"github.com/claimflow/claimflow/workflows"
)

// queueOf is a course's waitlist, head first, and its counter.
func queueOf(t *testing.T, db *pgxpool.Pool, course string) (ids []string, counter int) {
	t.Helper()
	ctx := context.Background()
	rows, err := db.Query(ctx, `SELECT id FROM enrollments WHERE course_id = $1 AND status = 'waitlisted' ORDER BY waitlist_seq`, course)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := db.QueryRow(ctx, `SELECT waitlisted FROM courses WHERE id = $1`, course).Scan(&counter); err != nil {
		t.Fatal(err)
	}
	return ids, counter
}

func TestWaitlistSingleClaims(t *testing.T) {
	db, p := testDB(t)
	a := testActivities(t, db)
	a.WaitlistPerSeat = 2
	ctx := context.Background()
	course := p + "c"
	addCourse(t, db, course, 2)
	wl := func(e string) seatClaim {
		in := seatInput(p, e, course, e)
		in.Waitlist = true
		return in
	}
	for _, e := range []string{"s1", "s2"} {
		if res, err := reserveSeat(ctx, a, wl(e)); err != nil || res.Position != 0 {
			t.Fatalf("%s on a free seat: %+v %v", e, res, err)
		}
	}
	// Full: without the flag course_full, with it a place; the fifth place
	// is beyond 2 × capacity.
	if _, err := reserveSeat(ctx, a, seatInput(p, "plain", course, "plain")); refusalOf(err) != string(workflows.RefusalCourseFull) {
		t.Errorf("a plain claim on a full course: %v", err)
	}
	for i, e := range []string{"w1", "w2", "w3", "w4"} {
		res, err := reserveSeat(ctx, a, wl(e))
		if err != nil || res.Position != i+1 {
			t.Fatalf("%s: %+v %v, want position %d", e, res, err, i+1)
		}
		// A retry answers the same place.
		if again, err := reserveSeat(ctx, a, wl(e)); err != nil || again.Position != i+1 {
			t.Fatalf("%s retried: %+v %v", e, again, err)
		}
	}
	if _, err := reserveSeat(ctx, a, wl("w5")); refusalOf(err) != string(workflows.RefusalWaitlistFull) {
		t.Errorf("the fifth place: %v, want waitlist_full", err)
	}
	// A student on the waitlist is already claimed for the course.
	if _, err := reserveSeat(ctx, a, seatInput(p, "w1-again", course, "w1")); refusalOf(err) != string(workflows.RefusalAlreadyEnrolled) {
		t.Errorf("w1 enrolling again: %v", err)
	}

	// w2 leaves; cancelling s1 frees a seat; the promotion takes the head.
	left, err := a.CancelEnrollment(ctx, workflows.CancelEnrollmentInput{EnrollmentID: p + "w2"})
	if err != nil || !left.LeftWaitlist || left.FreedSeat || left.Status != workflows.StatusCancelled {
		t.Fatalf("w2 leaves: %+v %v", left, err)
	}
	if err := a.MarkConfirmed(ctx, p+"s1"); err != nil {
		t.Fatal(err)
	}
	freed, err := a.CancelEnrollment(ctx, workflows.CancelEnrollmentInput{EnrollmentID: p + "s1"})
	if err != nil || !freed.FreedSeat {
		t.Fatalf("s1 cancels: %+v %v", freed, err)
	}
	// While the seat waits for its promotion, a new claim cannot take it.
	if _, err := reserveSeat(ctx, a, seatInput(p, "jumper", course, "jumper")); refusalOf(err) != string(workflows.RefusalCourseFull) {
		t.Errorf("a claim jumping the queue: %v", err)
	}
	by := p + "s1:cancelled"
	var got []workflows.PromoteWaitlistResult
	var mu sync.Mutex
	concurrently(4, func(int) { // the same step retried, at once
		res, err := a.PromoteWaitlist(ctx, workflows.PromoteWaitlistInput{CourseID: course, By: by})
		if err != nil {
			t.Error(err)
			return
		}
		mu.Lock()
		got = append(got, res)
		mu.Unlock()
	})
	for _, res := range got {
		if len(res.Promoted) != 1 || res.Promoted[0].EnrollmentID != p+"w1" || res.Promoted[0].StudentID != "w1" {
			t.Errorf("promotion by %s: %+v, want w1 alone", by, res)
		}
	}
	queue, counter := queueOf(t, db, course)
	if want := []string{p + "w3", p + "w4"}; !slices.Equal(queue, want) || counter != 2 {
		t.Errorf("queue after one promotion: %v (counter %d), want %v", queue, counter, want)
	}
	assertSeats(t, db, course, 2)
	// A promotion with no free seat promotes nobody.
	if res, err := a.PromoteWaitlist(ctx, workflows.PromoteWaitlistInput{CourseID: course, By: p + "other"}); err != nil || len(res.Promoted) != 0 {
		t.Errorf("promotion without a free seat: %+v %v", res, err)
	}
}

func TestWaitlistBatchIsFirstComeFirstServed(t *testing.T) {
	db, p := testDB(t)
	a := testActivities(t, db)
	a.WaitlistPerSeat = 3
	ctx := context.Background()
	course := p + "c"
	addCourse(t, db, course, 5)
	// 8 batches of 5 claims race for 5 seats and 15 places.
	const batches, per = 8, 5
	var mu sync.Mutex
	positions := map[string]int{}
	concurrently(batches, func(b int) {
		in := workflows.ReserveSeatsInput{WorkflowID: fmt.Sprintf("batch-%d", b), RunID: "r"}
		for i := range per {
			s := fmt.Sprintf("%ss%d-%d", p, b, i)
			in.Claims = append(in.Claims, workflows.EnrollmentInput{EnrollmentID: s, CourseID: course, StudentID: s, Waitlist: true})
		}
		for attempt := 0; attempt < 2; attempt++ { // an activity retry answers the same
			res, err := a.ReserveSeats(ctx, in)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			for i, d := range res.Decisions {
				if d.Status == workflows.StatusWaitlisted {
					if prev, ok := positions[in.Claims[i].EnrollmentID]; ok && prev != d.Position && attempt == 1 {
						// positions may move forward only when someone ahead left
						t.Errorf("%s: position %d, then %d on a retry", in.Claims[i].EnrollmentID, prev, d.Position)
					}
					positions[in.Claims[i].EnrollmentID] = d.Position
				}
			}
			mu.Unlock()
		}
	})
	queue, counter := queueOf(t, db, course)
	if len(queue) != 15 || counter != 15 {
		t.Fatalf("waitlist of %d (counter %d), want 15", len(queue), counter)
	}
	for i, id := range queue {
		if positions[id] != i+1 {
			t.Errorf("%s is %dth in the queue but was told position %d", id, i+1, positions[id])
		}
	}
	assertSeats(t, db, course, 5)
	var refused int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM enrollments WHERE course_id = $1`, course).Scan(&refused); err != nil || refused != 20 {
		t.Errorf("%d rows for 40 claims, want 20 (5 seats + 15 places; the rest refused waitlist_full): %v", refused, err)
	}

	// Raise the capacity by 4: one promotion takes the first four, in order.
	if _, err := db.Exec(ctx, `UPDATE courses SET capacity = capacity + 4 WHERE id = $1`, course); err != nil {
		t.Fatal(err)
	}
	res, err := a.PromoteWaitlist(ctx, workflows.PromoteWaitlistInput{CourseID: course, By: "capacity-1"})
	if err != nil {
		t.Fatal(err)
	}
	var promoted []string
	for _, e := range res.Promoted {
		promoted = append(promoted, e.EnrollmentID)
	}
	if !slices.Equal(promoted, queue[:4]) {
		t.Errorf("promoted %v, want the head %v", promoted, queue[:4])
	}
	assertSeats(t, db, course, 9)
	// The batch that waitlisted them failing now takes nothing back from
	// promoted enrollments; failing before it answered takes its places.
	after, _ := queueOf(t, db, course)
	if err := a.ReleaseSeats(ctx, []string{after[0]}); err != nil {
		t.Fatal(err)
	}
	if q, c := queueOf(t, db, course); len(q) != 10 || c != 10 || slices.Contains(q, after[0]) {
		t.Errorf("after releasing a waitlisted claim: %v (counter %d)", q, c)
	}
	assertSeats(t, db, course, 9)
}

// TestAuditWaitlistSeesEachFault: the audit passes a sound course and
// names each broken invariant on a course broken on purpose.
func TestAuditWaitlistSeesEachFault(t *testing.T) {
	db, p := testDB(t)
	a := testActivities(t, db)
	a.WaitlistPerSeat = 2
	ctx := context.Background()
	course := p + "c"
	addCourse(t, db, course, 1)
	for _, e := range []string{"s1", "w1", "w2"} {
		in := seatInput(p, e, course, e)
		in.Waitlist = true
		if _, err := reserveSeat(ctx, a, in); err != nil {
			t.Fatal(err)
		}
	}
	audit := func() store.WaitlistReport {
		t.Helper()
		r, err := store.AuditWaitlist(ctx, db, p)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := audit(); !r.OK() || r.Waiting != 2 || r.Courses != 1 {
		t.Fatalf("a sound course: %+v", r)
	}
	// Promote the second in line by hand: FIFO broken, and the counters.
	if _, err := db.Exec(ctx, `UPDATE courses SET capacity = 2 WHERE id = $1`, course); err != nil {
		t.Fatal(err)
	}
	if r := audit(); len(r.FreeSeatsWhileWaiting) != 1 {
		t.Errorf("a free seat while two wait: %+v", r)
	}
	if _, err := db.Exec(ctx, `UPDATE enrollments SET status = 'reserved', promotion_seq = 1 WHERE id = $1`, p+"w2"); err != nil {
		t.Fatal(err)
	}
	if r := audit(); r.OutOfOrder != 1 || len(r.CounterMismatches) != 1 {
		t.Errorf("w2 promoted before w1, counters untouched: %+v", r)
	}
}
