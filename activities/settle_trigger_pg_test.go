package activities

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/claimflow/claimflow/dev/pgtest"
)

// TestSettleTriggerIsLinear: confirming a batch costs the trigger that keeps
// enrollment_reservations and sends enrollment_settled work in proportion
// to the batch (migrations/00011_linear_settle_trigger.sql).
//
// The trigger's statements are planned once per connection, for the
// transition tables of the first statement that fires it, and that plan is
// kept. A desk's connection may see a batch of one first, so this confirms
// one claim and then 400 on the same connection. When the trigger joined
// before_rows, after_rows and enrollment_reservations, the plan made for
// one row rescanned a transition table once per row: 400 claims visited
// 642,000 rows, and ten-minute runs spent up to 262 ms in it.
//
// auto_explain, loaded on the superuser's connection, sends the plan of
// every statement, the trigger's too, with the rows each node visited, to
// the client as a notice.
func TestSettleTriggerIsLinear(t *testing.T) {
	db, p := testDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	course := p + "course"
	addCourse(t, db, course, 100000)
	reserve := func(batch, n int) []string { return reserveWide(ctx, t, testActivities(t, db), p, course, batch, n) }
	one, batch, published := reserve(0, 1), reserve(1, 400), reserve(2, 3)

	cfg, err := pgxpool.ParseConfig(pgtest.SuperuserURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	var mu sync.Mutex
	var plans []pgtest.PlanNode
	var noticeErr error
	cfg.ConnConfig.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		// Only the trigger's statements: the UPDATE's own plan depends on
		// the size of the test's table.
		_, raw, ok := strings.Cut(n.Message, "plan:\n")
		if !ok || !strings.Contains(n.Where, "enrollments_updated()") {
			return
		}
		var logged struct{ Plan pgtest.PlanNode }
		mu.Lock()
		defer mu.Unlock()
		if err := json.Unmarshal([]byte(raw), &logged); err != nil {
			noticeErr = fmt.Errorf("read auto_explain's plan: %w", err)
			return
		}
		plans = append(plans, logged.Plan)
	}
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, `LOAD 'auto_explain';
			SET auto_explain.log_min_duration = 0; SET auto_explain.log_analyze = on;
			SET auto_explain.log_timing = off; SET auto_explain.log_nested_statements = on;
			SET auto_explain.log_format = json; SET auto_explain.log_level = notice`)
		return err
	}
	su, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer su.Close()

	listener := superuser(ctx, t)
	if _, err := listener.Exec(ctx, "LISTEN enrollment_settled"); err != nil {
		t.Fatal(err)
	}

	a := testActivities(t, db)
	a.DB = su
	if err := a.recordPublished(ctx, one, true); err != nil {
		t.Fatal(err)
	}
	if err := a.recordPublished(ctx, published, false); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	plans = nil
	mu.Unlock()
	if err := a.recordPublished(ctx, batch, true); err != nil {
		t.Fatal(err)
	}

	mu.Lock()
	if noticeErr != nil {
		t.Fatal(noticeErr)
	}
	var visited float64
	for _, plan := range plans {
		plan.Walk(func(n pgtest.PlanNode) { visited += n.RowsVisited() })
	}
	n := len(plans)
	mu.Unlock()
	t.Logf("confirming %d claims, the trigger ran %d statements that visited %.0f rows", len(batch), n, visited)
	if n == 0 {
		t.Fatal("auto_explain sent no plan of the trigger's statements")
	}
	if limit := 10 * float64(len(batch)); visited > limit {
		t.Errorf("confirming %d claims, the trigger visited %.0f rows, more than %.0f: a statement's work grows faster than the batch", len(batch), visited, limit)
	}

	// Whom it settled: the confirmed left enrollment_reservations and were
	// announced; the published but not confirmed stayed, unannounced.
	var left, stayed int
	if err := db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE id = ANY($1)), count(*) FILTER (WHERE id = ANY($2))
		FROM enrollment_reservations`, append(one, batch...), published).Scan(&left, &stayed); err != nil {
		t.Fatal(err)
	}
	if left != 0 || stayed != len(published) {
		t.Errorf("enrollment_reservations holds %d confirmed and %d still reserved enrollments, want 0 and %d", left, stayed, len(published))
	}
	want := map[string]bool{}
	for _, id := range append(one, batch...) {
		want[id] = true
	}
	unwanted := map[string]bool{}
	for _, id := range published {
		unwanted[id] = true
	}
	wait, stop := context.WithTimeout(ctx, 10*time.Second)
	defer stop()
	for len(want) > 0 {
		msg, err := listener.WaitForNotification(wait)
		if err != nil {
			t.Fatalf("%d confirmed enrollments not announced on enrollment_settled: %v", len(want), err)
		}
		if unwanted[msg.Payload] {
			t.Errorf("enrollment_settled announced %s, which is still reserved", msg.Payload)
		}
		delete(want, msg.Payload)
	}
}
