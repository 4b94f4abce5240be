package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// ReadsOptions describe `claimflow-bench reads`: a table of at least
// Enrollments enrollments of Students students (seeded straight into
// Postgres under a run ID, as a term's worth of history would be), then
// each student reading its own enrollments with its own token at Rate per
// second for Hold, so the per-subject read limit applies as in production.
type ReadsOptions struct {
	Enrollments int
	Students    int
	Rate        float64
	Hold        time.Duration
	Limit       int // page size of each read
	Timeout     time.Duration
	// Seed writes the rows (the schema owner's pool or the runtime role's:
	// both may INSERT).
	Seed *pgxpool.Pool
	// Token mints a token for a student.
	Token    func(student string) (string, error)
	Progress io.Writer
}

// ReadsResult is what the read bench measured.
type ReadsResult struct {
	RunID       string         `json:"run_id"`
	Enrollments int            `json:"enrollments"`
	TableRows   int64          `json:"table_rows"`
	Students    int            `json:"students"`
	Rate        float64        `json:"rate"`
	HoldS       float64        `json:"hold_s"`
	Requests    int            `json:"requests"`
	Status      map[string]int `json:"status"`
	Dropped     int            `json:"dropped"`
	Latency     LatencySummary `json:"latency_ms"`
	SeedS       float64        `json:"seed_s"`
}

// RunReads seeds the table, then drives the reads against base.
func RunReads(ctx context.Context, base string, o ReadsOptions) (*ReadsResult, error) {
	if o.Enrollments < 1 || o.Students < 1 || o.Rate <= 0 || o.Hold <= 0 || o.Limit < 1 || o.Limit > 200 {
		return nil, fmt.Errorf("reads: --enrollments, --students, --rate, --hold must be positive and --limit 1-200")
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	res := &ReadsResult{RunID: newRunID(), Enrollments: o.Enrollments, Students: o.Students, Rate: o.Rate, HoldS: o.Hold.Seconds(),
		Status: map[string]int{}}
	began := time.Now()
	// 997 courses, coprime with any student count that is a multiple of
	// 1,000, keep (course, student) pairs apart; requested_at spreads over
	// the last days so the list has an order to serve.
	if _, err := o.Seed.Exec(ctx, `
		INSERT INTO courses (id, title, capacity)
		SELECT $1 || '-c' || g, 'reads ' || g, 1000000 FROM generate_series(0, 996) g`, res.RunID); err != nil {
		return nil, fmt.Errorf("seed courses: %w", err)
	}
	if _, err := o.Seed.Exec(ctx, `
		INSERT INTO enrollments (id, course_id, student_id, status, workflow_id, run_id, requested_at, recorded_at, published_at, confirmed_at)
		SELECT $1 || '-e' || g, $1 || '-c' || (g % 997), $1 || '-s' || (g % $3::int),
		       CASE WHEN g % 10 = 0 THEN 'cancelled' ELSE 'confirmed' END, 'seeded', 'seeded',
		       now() - (g || ' seconds')::interval, now() - (g || ' seconds')::interval,
		       now() - (g || ' seconds')::interval, now() - (g || ' seconds')::interval
		FROM generate_series(0, $2::int - 1) g`, res.RunID, o.Enrollments, o.Students); err != nil {
		return nil, fmt.Errorf("seed enrollments: %w", err)
	}
	if _, err := o.Seed.Exec(ctx, `ANALYZE enrollments`); err != nil {
		fmt.Fprintf(o.Progress, "reads: ANALYZE enrollments: %v (the seeding role does not own the table; autovacuum will)\n", err)
	}
	if err := o.Seed.QueryRow(ctx, `SELECT count(*) FROM enrollments`).Scan(&res.TableRows); err != nil {
		return nil, err
	}
	res.SeedS = round3(time.Since(began).Seconds())
	fmt.Fprintf(o.Progress, "reads: seeded %d enrollments of %d students in %.1fs (table holds %d); reading at %g/s for %s\n",
		o.Enrollments, o.Students, res.SeedS, res.TableRows, o.Rate, o.Hold)

	// Tokens are minted ahead, so signing is not in the measured path.
	tokens := make([]string, o.Students)
	for i := range tokens {
		tok, err := o.Token(res.RunID + "-s" + strconv.Itoa(i))
		if err != nil {
			return nil, err
		}
		tokens[i] = tok
	}
	sc := Scenario{StartRate: o.Rate, Stages: []Stage{{Duration: o.Hold, Target: o.Rate}}, MaxVUs: int(o.Rate * o.Timeout.Seconds())}
	client := newHTTPClient(min(sc.MaxVUs, 2000), o.Timeout)
	defer client.CloseIdleConnections()
	var (
		mu  sync.Mutex
		lat []float64
	)
	d := &driver{sc: sc, clock: wallClock{start: time.Now()}}
	d.iteration = func(ctx context.Context, n int, _ time.Duration) {
		s := (n * 7919) % o.Students // a different student each time, all of them in turn
		req, err := http.NewRequestWithContext(ctx, http.MethodGet,
			base+"/v1/students/"+res.RunID+"-s"+strconv.Itoa(s)+"/enrollments?limit="+strconv.Itoa(o.Limit), nil)
		if err != nil {
			return
		}
		req.Header.Set("Authorization", "Bearer "+tokens[s])
		t0 := time.Now()
		resp, err := client.Do(req)
		code := "error"
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			code = strconv.Itoa(resp.StatusCode)
		}
		ms := float64(time.Since(t0).Microseconds()) / 1000
		mu.Lock()
		res.Status[code]++
		lat = append(lat, ms)
		mu.Unlock()
	}
	stats := d.run(ctx)
	res.Requests, res.Dropped = stats.Started, stats.Dropped
	res.Latency = Summarize(lat)
	return res, nil
}

// WriteReads prints the read bench's figures.
func WriteReads(w io.Writer, r *ReadsResult) {
	fmt.Fprintf(w, "\n== reads (run %s): GET /v1/students/{id}/enrollments, each student with its own token\n", r.RunID)
	fmt.Fprintf(w, "  table ...........: %d enrollments (%d seeded for %d students in %.1fs)\n", r.TableRows, r.Enrollments, r.Students, r.SeedS)
	fmt.Fprintf(w, "  load ............: %g/s for %.0fs: %d requests, %d dropped\n", r.Rate, r.HoldS, r.Requests, r.Dropped)
	fmt.Fprintf(w, "  status ..........: %s\n", statusLine(r.Status))
	l := r.Latency
	fmt.Fprintf(w, "  latency .........: p50=%s p95=%s p99=%s max=%s\n", fmtMS(l.P50), fmtMS(l.P95), fmtMS(l.P99), fmtMS(l.Max))
}
