package activities

// The enrollment guards, contended where they live: the activities are
// called directly (no API, no Temporal) from many goroutines at once, and
// every claim is sent again with the same input, as an activity retry does.
// The assertions read the database alone.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/claimflow/claimflow/workflows"
)

func addCourse(t *testing.T, db *pgxpool.Pool, id string, capacity int) {
	t.Helper()
	if _, err := db.Exec(context.Background(), `INSERT INTO courses (id, title, capacity) VALUES ($1, $1, $2)`, id, capacity); err != nil {
		t.Fatalf("create course %s: %v", id, err)
	}
}

type courseState struct {
	capacity, enrolled, active int
}

// seats reads a course's counter and its active enrollments.
func seats(t *testing.T, db *pgxpool.Pool, course string) courseState {
	t.Helper()
	var s courseState
	err := db.QueryRow(context.Background(), `
		SELECT c.capacity, c.enrolled,
			(SELECT count(*) FROM enrollments e WHERE e.course_id = c.id AND e.status IN ('reserved', 'confirmed', 'dead_lettered'))
		FROM courses c WHERE c.id = $1`, course).Scan(&s.capacity, &s.enrolled, &s.active)
	if err != nil {
		t.Fatalf("read course %s: %v", course, err)
	}
	return s
}

// assertSeats checks the course's counter against its rows and its capacity,
// and that it holds want active enrollments.
func assertSeats(t *testing.T, db *pgxpool.Pool, course string, want int) {
	t.Helper()
	s := seats(t, db, course)
	if s.enrolled != s.active {
		t.Errorf("course %s: enrolled = %d but %d active enrollments", course, s.enrolled, s.active)
	}
	if s.active > s.capacity {
		t.Errorf("course %s oversold: %d active enrollments, capacity %d", course, s.active, s.capacity)
	}
	if s.active != want {
		t.Errorf("course %s: %d active enrollments, want %d", course, s.active, want)
	}
}

// activeOf counts a student's active enrollments in a course.
func activeOf(t *testing.T, db *pgxpool.Pool, course, student string) int {
	t.Helper()
	var n int
	err := db.QueryRow(context.Background(), `
		SELECT count(*) FROM enrollments
		WHERE course_id = $1 AND student_id = $2 AND status IN ('reserved', 'confirmed', 'dead_lettered')`,
		course, student).Scan(&n)
	if err != nil {
		t.Fatalf("count enrollments of %s in %s: %v", student, course, err)
	}
	return n
}

func statusOf(t *testing.T, db *pgxpool.Pool, enrollmentID string) string {
	t.Helper()
	var s string
	if err := db.QueryRow(context.Background(), `SELECT status FROM enrollments WHERE id = $1`, enrollmentID).Scan(&s); err != nil {
		t.Fatalf("status of %s: %v", enrollmentID, err)
	}
	return s
}

func seatInput(prefix, enrollment, course, student string) seatClaim {
	return seatClaim{
		EnrollmentID: prefix + enrollment, CourseID: course, StudentID: student,
		WorkflowID: "enrollment-" + prefix + enrollment, RunID: "run-1", RequestedAt: time.Now(),
	}
}

// outcome is what one call answered: "ok", a refusal type, or "error: ...".
func outcome(err error) string {
	if err == nil {
		return "ok"
	}
	if r := refusalOf(err); r != "" {
		return r
	}
	return "error: " + err.Error()
}

// transient says whether Temporal would retry err and a retry can succeed:
// a deadlock or serialization failure, a unique violation of a concurrent
// insert, or an activity's own "changed concurrently".
func transient(err error) bool {
	switch pgCode(err) {
	case "40P01", "40001", pgUniqueViolation:
		return true
	}
	return err != nil && strings.Contains(err.Error(), "changed concurrently")
}

// untilAnswered calls fn, with the same input, until it answers something
// other than a transient error, as Temporal's retry policy would.
func untilAnswered(fn func() error) error {
	var err error
	for range 50 {
		if err = fn(); !transient(err) {
			return err
		}
	}
	return fmt.Errorf("still transient after 50 attempts: %w", err)
}

// countGranted checks that every attempt of one request answered alike
// (got[r] holds request r's attempts) and that each answer is "ok" or the
// one refusal allowed, and counts the requests granted.
func countGranted(t *testing.T, who string, got [][]string, refusal workflows.Refusal) (ok int) {
	t.Helper()
	for r, attempts := range got {
		for _, o := range attempts {
			if o != attempts[0] {
				t.Errorf("%s %d: attempts of one request answered %v", who, r, attempts)
				break
			}
		}
		switch attempts[0] {
		case "ok":
			ok++
		case string(refusal):
		default:
			t.Errorf("%s %d: %s, want ok or %s", who, r, attempts[0], refusal)
		}
	}
	return ok
}

// concurrently runs fn(i) for i in [0, n) on n goroutines started together.
func concurrently(n int, fn func(i int)) {
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			fn(i)
		}()
	}
	close(start)
	wg.Wait()
}

// Many students claim the last seats at once, each claim sent twice at the
// same time and once more afterwards (activity retries of the same input):
// exactly capacity claims hold a seat, the others are refused course_full,
// every attempt of one claim answers the same, and the counter matches the
// rows.
func TestReserveSeatNeverOversells(t *testing.T) {
	db, p := testDB(t)
	a := testActivities(t, db)
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		capacity int
		students int
	}{
		{"last seat", 1, 12},
		{"few seats", 3, 20},
		{"more seats than half the claims", 9, 16},
		{"no seat", 0, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			course := p + sanitize(tc.name)
			addCourse(t, db, course, tc.capacity)
			const copies = 2
			got := make([][]string, tc.students)
			for i := range got {
				got[i] = make([]string, copies+1)
			}
			concurrently(tc.students*copies, func(i int) {
				in := seatInput(p, fmt.Sprintf("%s-e%d", course, i/copies), course, fmt.Sprintf("s%d", i/copies))
				_, err := reserveSeat(ctx, a, in)
				got[i/copies][i%copies] = outcome(err)
			})
			for s := range tc.students {
				in := seatInput(p, fmt.Sprintf("%s-e%d", course, s), course, fmt.Sprintf("s%d", s))
				_, err := reserveSeat(ctx, a, in)
				got[s][copies] = outcome(err)
			}
			ok := countGranted(t, "student", got, workflows.RefusalCourseFull)
			if ok != tc.capacity {
				t.Errorf("%d claims hold a seat, want %d (the capacity)", ok, tc.capacity)
			}
			assertSeats(t, db, course, tc.capacity)
		})
	}
}

// One student claims one course many times at once, under different
// enrollment IDs and each retried: one active enrollment, one seat, the
// other claims refused already_enrolled naming the holder. A retry of the
// holder's claim finds its own row (same recorded_at). Once the holder is
// released the student may enroll again, and the released claim's retry is
// refused without taking a seat.
func TestReserveSeatOneActivePerStudent(t *testing.T) {
	db, p := testDB(t)
	a := testActivities(t, db)
	ctx := context.Background()
	course := p + "c"
	addCourse(t, db, course, 50)
	// Other students hold seats, so a double release would show.
	for i := range 3 {
		if _, err := reserveSeat(ctx, a, seatInput(p, fmt.Sprintf("other%d", i), course, fmt.Sprintf("other%d", i))); err != nil {
			t.Fatal(err)
		}
	}

	const claims, copies = 10, 2
	results := make([]string, claims*copies)
	concurrently(claims*copies, func(i int) {
		results[i] = outcome(untilAnswered(func() error {
			_, err := reserveSeat(ctx, a, seatInput(p, fmt.Sprintf("e%d", i/copies), course, "s1"))
			return err
		}))
	})
	holder := ""
	for i := 0; i < len(results); i += copies {
		if results[i] != results[i+1] {
			t.Errorf("claim %d: attempts answered %s and %s", i/copies, results[i], results[i+1])
		}
		switch results[i] {
		case "ok":
			if holder != "" {
				t.Errorf("claims %s and e%d both hold a seat for s1", holder, i/copies)
			}
			holder = fmt.Sprintf("e%d", i/copies)
		case string(workflows.RefusalAlreadyEnrolled):
		default:
			t.Errorf("claim %d: %s", i/copies, results[i])
		}
	}
	if n := activeOf(t, db, course, "s1"); n != 1 {
		t.Fatalf("s1 has %d active enrollments in %s, want 1", n, course)
	}
	assertSeats(t, db, course, 4)
	if holder == "" {
		t.Fatal("no claim holds the seat")
	}

	// A retry of the holder's claim finds its own row.
	var recorded time.Time
	if err := db.QueryRow(ctx, `SELECT recorded_at FROM enrollments WHERE id = $1`, p+holder).Scan(&recorded); err != nil {
		t.Fatal(err)
	}
	if _, err := reserveSeat(ctx, a, seatInput(p, holder, course, "s1")); err != nil {
		t.Fatalf("retry of the holder's claim: %v", err)
	}
	var after time.Time
	if err := db.QueryRow(ctx, `SELECT recorded_at FROM enrollments WHERE id = $1`, p+holder).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if !after.Equal(recorded) {
		t.Errorf("the retry rewrote the holder's row: recorded_at %s, then %s", recorded, after)
	}
	// Another claim names the holder.
	_, err := reserveSeat(ctx, a, seatInput(p, "late", course, "s1"))
	if refusalOf(err) != string(workflows.RefusalAlreadyEnrolled) || !strings.Contains(fmt.Sprint(errDetails(err)), p+holder) {
		t.Errorf("a later claim of s1 = %v (holder %v), want already_enrolled naming %s", err, errDetails(err), p+holder)
	}
	assertSeats(t, db, course, 4)

	// Released, the student may enroll again; the released claim's retry
	// is refused and takes no seat.
	if err := a.ReleaseSeat(ctx, workflows.ReleaseSeatInput{EnrollmentID: p + holder}); err != nil {
		t.Fatal(err)
	}
	assertSeats(t, db, course, 3)
	if _, err := reserveSeat(ctx, a, seatInput(p, holder, course, "s1")); refusalOf(err) != string(workflows.RefusalEnrollmentInactive) {
		t.Errorf("retry of a released claim = %v, want %s", err, workflows.RefusalEnrollmentInactive)
	}
	if _, err := reserveSeat(ctx, a, seatInput(p, "again", course, "s1")); err != nil {
		t.Errorf("enroll again after the release: %v", err)
	}
	assertSeats(t, db, course, 4)
}

func errDetails(err error) string {
	var holder string
	var appErr interface {
		HasDetails() bool
		Details(...any) error
	}
	if errors.As(err, &appErr) && appErr.HasDetails() {
		_ = appErr.Details(&holder)
	}
	return holder
}

// Batches decide many claims at once, several batches in flight on one
// course together with single claims, students appearing in two batches,
// and every batch retried with the same input at the same time and again
// afterwards: the course fills exactly, no student holds two seats, every
// attempt of a batch answers the same decisions, and releasing a batch
// twice frees its seats once.
func TestReserveSeatsNeverOversells(t *testing.T) {
	db, p := testDB(t)
	a := testActivities(t, db)
	ctx := context.Background()
	for _, tc := range []struct {
		name              string
		capacity, batches int
		perBatch, singles int
	}{
		{"last seat", 1, 4, 3, 2},
		{"demand twice the seats", 10, 4, 6, 4},
		{"seats left over", 40, 3, 5, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			course := p + sanitize(tc.name)
			addCourse(t, db, course, tc.capacity)
			inputs := make([]workflows.ReserveSeatsInput, tc.batches)
			students := map[string]bool{}
			for b := range inputs {
				inputs[b] = workflows.ReserveSeatsInput{WorkflowID: fmt.Sprintf("%sbatch-%s-%d", p, course, b), RunID: "run-1"}
				for c := range tc.perBatch {
					// The first claim of each batch is a student the next
					// batch claims too.
					student := fmt.Sprintf("b%d-s%d", b, c)
					if c == 0 && b > 0 {
						student = fmt.Sprintf("b%d-s%d", b-1, 1)
					}
					students[student] = true
					inputs[b].Claims = append(inputs[b].Claims, workflows.EnrollmentInput{
						EnrollmentID: fmt.Sprintf("%s%s-b%d-c%d", p, course, b, c), CourseID: course, StudentID: student,
						RequestedAt: time.Now(),
					})
				}
			}
			const copies = 2
			decisions := make([][]workflows.Decision, tc.batches*copies)
			singles := make([]string, tc.singles)
			concurrently(tc.batches*copies+tc.singles, func(i int) {
				if i >= tc.batches*copies {
					s := i - tc.batches*copies
					singles[s] = outcome(untilAnswered(func() error {
						_, err := reserveSeat(ctx, a, seatInput(p, fmt.Sprintf("%s-single%d", course, s), course, fmt.Sprintf("single%d", s)))
						return err
					}))
					return
				}
				err := untilAnswered(func() error {
					res, err := a.ReserveSeats(ctx, inputs[i/copies])
					decisions[i] = res.Decisions
					return err
				})
				if err != nil {
					t.Errorf("batch %d: %v", i/copies, err)
				}
			})
			reserved := 0
			for b := range inputs {
				again, err := a.ReserveSeats(ctx, inputs[b])
				if err != nil {
					t.Fatalf("batch %d retried: %v", b, err)
				}
				for c := 0; c < copies; c++ {
					if fmt.Sprint(decisions[b*copies+c]) != fmt.Sprint(again.Decisions) {
						t.Errorf("batch %d: attempts decided\n%v\n%v", b, decisions[b*copies+c], again.Decisions)
					}
				}
				for _, d := range again.Decisions {
					switch {
					case d.Status == workflows.StatusReserved:
						reserved++
					case d.Refusal == workflows.RefusalCourseFull, d.Refusal == workflows.RefusalAlreadyEnrolled:
					default:
						t.Errorf("batch %d: decision %+v", b, d)
					}
				}
			}
			for s, o := range singles {
				switch o {
				case "ok":
					reserved++
				case string(workflows.RefusalCourseFull):
				default:
					t.Errorf("single claim %d: %s", s, o)
				}
			}
			want := min(tc.capacity, len(students)+tc.singles)
			if reserved != want {
				t.Errorf("%d claims hold a seat, want %d", reserved, want)
			}
			assertSeats(t, db, course, want)
			for s := range students {
				if n := activeOf(t, db, course, s); n > 1 {
					t.Errorf("student %s holds %d seats", s, n)
				}
			}

			// Compensate the first batch twice at once, then once more.
			var ids []string
			for _, c := range inputs[0].Claims {
				ids = append(ids, c.EnrollmentID)
			}
			var mine int
			if err := db.QueryRow(ctx, `SELECT count(*) FROM enrollments WHERE id = ANY($1) AND status = 'reserved'`, ids).Scan(&mine); err != nil {
				t.Fatal(err)
			}
			concurrently(3, func(int) {
				if err := a.ReleaseSeats(ctx, ids); err != nil {
					t.Errorf("release batch 0: %v", err)
				}
			})
			if err := a.ReleaseSeats(ctx, ids); err != nil {
				t.Fatal(err)
			}
			assertSeats(t, db, course, want-mine)
		})
	}
}

// The compensations and the cancellation, run many times at once and again
// afterwards, give back exactly one seat per enrollment they end.
func TestReleasingTwiceFreesOneSeat(t *testing.T) {
	db, p := testDB(t)
	a := testActivities(t, db)
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		confirm bool // the enrollments are confirmed first
		release func(ids []string) error
		after   string // status the released enrollments end in
	}{
		{"ReleaseSeat", false, func(ids []string) error {
			for _, id := range ids {
				if err := a.ReleaseSeat(ctx, workflows.ReleaseSeatInput{EnrollmentID: id}); err != nil {
					return err
				}
			}
			return nil
		}, "failed"},
		{"ReleaseSeats", false, func(ids []string) error { return a.ReleaseSeats(ctx, ids) }, "failed"},
		{"CancelEnrollment", true, func(ids []string) error {
			for _, id := range ids {
				if _, err := a.CancelEnrollment(ctx, workflows.CancelEnrollmentInput{EnrollmentID: id}); err != nil {
					return err
				}
			}
			return nil
		}, "cancelled"},
		{"ReleaseSeat of a confirmed enrollment", true, func(ids []string) error {
			for _, id := range ids {
				if err := a.ReleaseSeat(ctx, workflows.ReleaseSeatInput{EnrollmentID: id}); err != nil {
					return err
				}
			}
			return nil
		}, "confirmed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			course := p + sanitize(tc.name)
			addCourse(t, db, course, 10)
			var ids []string
			for i := range 6 {
				in := seatInput(p, fmt.Sprintf("%s-e%d", course, i), course, fmt.Sprintf("s%d", i))
				if _, err := reserveSeat(ctx, a, in); err != nil {
					t.Fatal(err)
				}
				if tc.confirm {
					if err := a.MarkConfirmed(ctx, in.EnrollmentID); err != nil {
						t.Fatal(err)
					}
				}
				ids = append(ids, in.EnrollmentID)
			}
			release := ids[:2] // four keep their seats
			concurrently(4, func(int) {
				if err := untilAnswered(func() error { return tc.release(release) }); err != nil {
					t.Errorf("release: %v", err)
				}
			})
			if err := tc.release(release); err != nil {
				t.Fatalf("release again: %v", err)
			}
			freed := len(release)
			if tc.after == "confirmed" {
				freed = 0 // the compensation of a reservation leaves a confirmed seat alone
			}
			assertSeats(t, db, course, len(ids)-freed)
			for _, id := range release {
				if s := statusOf(t, db, id); s != tc.after {
					t.Errorf("%s is %s, want %s", id, s, tc.after)
				}
			}
		})
	}
}

// Cancelling one confirmed enrollment many times at once changes it once.
func TestCancelEnrollmentChangesOnce(t *testing.T) {
	db, p := testDB(t)
	a := testActivities(t, db)
	ctx := context.Background()
	course := p + "c"
	addCourse(t, db, course, 3)
	for _, e := range []string{"keep", "cancel"} {
		in := seatInput(p, e, course, e)
		if _, err := reserveSeat(ctx, a, in); err != nil {
			t.Fatal(err)
		}
		if err := a.MarkConfirmed(ctx, in.EnrollmentID); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	changed := 0
	concurrently(8, func(int) {
		res, err := a.CancelEnrollment(ctx, workflows.CancelEnrollmentInput{EnrollmentID: p + "cancel"})
		if err != nil {
			t.Errorf("cancel: %v", err)
			return
		}
		if res.Status != workflows.StatusCancelled {
			t.Errorf("cancel answered %s", res.Status)
		}
		if res.Changed {
			mu.Lock()
			changed++
			mu.Unlock()
		}
	})
	if changed != 1 {
		t.Errorf("%d cancellations changed the enrollment, want 1", changed)
	}
	assertSeats(t, db, course, 1)

	// A cancellation run's retry after its commit (the answer lost) is told
	// what its first attempt did, so the run goes on to promote and tell;
	// another run is told nothing changed. Either way no second seat frees.
	for _, e := range []string{"seat", "queued"} {
		in := seatInput(p, e, course, e)
		if _, err := reserveSeat(ctx, a, in); err != nil {
			t.Fatal(err)
		}
		if e == "seat" {
			if err := a.MarkConfirmed(ctx, in.EnrollmentID); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := db.Exec(ctx, `UPDATE enrollments SET status = 'waitlisted', waitlist_seq = 1 WHERE id = $1`, p+"queued"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `UPDATE courses SET enrolled = enrolled - 1, waitlisted = waitlisted + 1 WHERE id = $1`, course); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		id               string
		freed, leftQueue bool
	}{{"seat", true, false}, {"queued", false, true}} {
		first, err := a.CancelEnrollment(ctx, workflows.CancelEnrollmentInput{EnrollmentID: p + tc.id, RunID: "run-" + tc.id})
		if err != nil {
			t.Fatal(err)
		}
		retry, err := a.CancelEnrollment(ctx, workflows.CancelEnrollmentInput{EnrollmentID: p + tc.id, RunID: "run-" + tc.id})
		if err != nil {
			t.Fatal(err)
		}
		other, err := a.CancelEnrollment(ctx, workflows.CancelEnrollmentInput{EnrollmentID: p + tc.id, RunID: "another-run"})
		if err != nil {
			t.Fatal(err)
		}
		want := workflows.CancelEnrollmentResult{Changed: true, CourseID: course, StudentID: tc.id, Status: workflows.StatusCancelled,
			FreedSeat: tc.freed, LeftWaitlist: tc.leftQueue}
		if first != want || retry != want {
			t.Errorf("%s: cancel %+v, its retry %+v; want both %+v", tc.id, first, retry, want)
		}
		if other.Changed {
			t.Errorf("%s: another run's cancellation %+v, want nothing changed", tc.id, other)
		}
	}
	assertSeats(t, db, course, 1)
}
