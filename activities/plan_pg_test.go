package activities

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/claimflow/claimflow/dev/pgtest"
)

// TestExistingClaimsProbe: a batch's look-up of existing enrollments probes
// the one-active-per-student index once per claim, whatever the table
// holds. A plan that sorts the enrollments (a merge join over every active
// one) made each batch's ReserveSeats take half a second at 50,000
// enrollments and grow with the table.
func TestExistingClaimsProbe(t *testing.T) {
	db, p := testDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := db.Exec(ctx, `INSERT INTO courses (id, title, capacity)
		SELECT $1 || '-c' || g, 'course ' || g, 100000 FROM generate_series(0, 99) g`, p); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO enrollments (id, course_id, student_id, status, workflow_id, run_id, requested_at, recorded_at)
		SELECT $1 || '-e' || g, $1 || '-c' || (g % 100), $1 || '-s' || g, 'confirmed', 'wf', 'run', now(), now()
		FROM generate_series(0, 59999) g`, p); err != nil {
		t.Fatal(err)
	}
	// Only the owner may ANALYZE; the planner then knows the table's size.
	ownerURL, _ := pgtest.URLs(t)
	owner, err := pgx.Connect(ctx, ownerURL)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close(context.Background())
	if _, err := owner.Exec(ctx, "ANALYZE enrollments"); err != nil {
		t.Fatal(err)
	}

	// A batch of 400 new claims, as at 2,000 requests/s.
	var ids, courses, students []string
	for i := range 400 {
		ids = append(ids, fmt.Sprintf("%s-new%d", p, i))
		courses = append(courses, fmt.Sprintf("%s-c%d", p, i%100))
		students = append(students, fmt.Sprintf("%s-x%d", p, i))
	}
	conn, err := db.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	var raw []byte
	if err := conn.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+existingClaimsSQL, ids, courses, students).Scan(&raw); err != nil {
		t.Fatal(err)
	}
	plan, err := pgtest.ParsePlan(raw)
	if err != nil {
		t.Fatalf("plan %s: %v", raw, err)
	}
	var nodes, indexes []string
	plan.Walk(func(n pgtest.PlanNode) {
		nodes = append(nodes, n.NodeType)
		if n.IndexName != "" {
			indexes = append(indexes, n.IndexName)
		}
	})
	if slices.Contains(nodes, "Merge Join") || slices.Contains(nodes, "Hash Join") || slices.Contains(nodes, "Seq Scan") ||
		!slices.Contains(indexes, "enrollments_one_active_per_student") {
		t.Errorf("want one probe of enrollments_one_active_per_student per claim (a nested loop), no join over the table; nodes %v on indexes %v:\n%s",
			nodes, indexes, raw)
	}
}
