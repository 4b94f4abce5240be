package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/claimflow/claimflow/internal/kafka"
	"github.com/claimflow/claimflow/workflows"
)

// Schema names where an arm keeps its rows and events. Both arms use the
// same column names: status, requested_at, recorded_at, published_at,
// confirmed_at.
type Schema struct {
	Courses     string
	Enrollments string
	Topic       string
}

// ClaimflowSchema is claimflow's own.
var ClaimflowSchema = Schema{Courses: "courses", Enrollments: "enrollments", Topic: workflows.EnrollmentTopic}

// StageLatency is one stage from the database timestamps, in milliseconds.
type StageLatency struct {
	Count int     `json:"count"`
	Avg   float64 `json:"avg"`
	P50   float64 `json:"p50"`
	P95   float64 `json:"p95"`
}

// Stages are the user's SQL stage latencies: requested → recorded (object
// created → DB recorded), recorded → published (DB recorded → processed),
// requested → confirmed (created → processed and DB updated), and
// published → confirmed (processed → DB updated).
type Stages struct {
	RequestedToRecorded  StageLatency `json:"requested_to_recorded"`
	RecordedToPublished  StageLatency `json:"recorded_to_published"`
	RequestedToConfirmed StageLatency `json:"requested_to_confirmed"`
	PublishedToConfirmed StageLatency `json:"published_to_confirmed"`
}

// stageLatencies computes the stages with percentile_cont over the run's
// enrollments (NULL timestamps drop out of their stage).
func stageLatencies(ctx context.Context, db *pgxpool.Pool, sc Schema, courses []string) (Stages, error) {
	var st Stages
	cols := []struct {
		expr string
		dst  *StageLatency
	}{
		{"recorded_at - requested_at", &st.RequestedToRecorded},
		{"published_at - recorded_at", &st.RecordedToPublished},
		{"confirmed_at - requested_at", &st.RequestedToConfirmed},
		{"confirmed_at - published_at", &st.PublishedToConfirmed},
	}
	var sel []string
	var dst []any
	for i, c := range cols {
		v := fmt.Sprintf("d%d", i)
		sel = append(sel, fmt.Sprintf(`count(%[1]s), coalesce(avg(%[1]s), 0),
			coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY %[1]s), 0),
			coalesce(percentile_cont(0.95) WITHIN GROUP (ORDER BY %[1]s), 0)`, v))
		dst = append(dst, &c.dst.Count, &c.dst.Avg, &c.dst.P50, &c.dst.P95)
	}
	var exprs []string
	for i, c := range cols {
		exprs = append(exprs, fmt.Sprintf("(extract(epoch FROM %s) * 1000)::float8 AS d%d", c.expr, i))
	}
	// Table names come from this package's constants, never from input.
	q := `WITH e AS (SELECT ` + strings.Join(exprs, ", ") + ` FROM ` + sc.Enrollments + ` WHERE course_id = ANY($1))
		SELECT ` + strings.Join(sel, ", ") + ` FROM e`
	if err := db.QueryRow(ctx, q, courses).Scan(dst...); err != nil {
		return st, fmt.Errorf("stage latencies from %s: %w", sc.Enrollments, err)
	}
	for _, c := range cols {
		c.dst.Avg, c.dst.P50, c.dst.P95 = round3(c.dst.Avg), round3(c.dst.P50), round3(c.dst.P95)
	}
	return st, nil
}

// drain waits until no enrollment of the run is still 'reserved' and their
// number stopped growing (claims answered 503 may still be on their way in),
// or until timeout. It reports whether the run drained.
func drain(ctx context.Context, db *pgxpool.Pool, sc Schema, courses []string, timeout time.Duration, progress func(reserved, total int)) (bool, error) {
	deadline := time.Now().Add(timeout)
	last, stable := -1, 0
	for {
		var reserved, total int
		err := db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'reserved'), count(*) FROM `+sc.Enrollments+
			` WHERE course_id = ANY($1)`, courses).Scan(&reserved, &total)
		if err != nil {
			return false, fmt.Errorf("drain %s: %w", sc.Enrollments, err)
		}
		if progress != nil {
			progress(reserved, total)
		}
		if reserved == 0 && total == last {
			stable++
		} else {
			stable = 0
		}
		last = total
		if stable >= 2 {
			return true, nil
		}
		if time.Now().After(deadline) {
			return false, nil
		}
		if !sleepCtx(ctx, time.Second) {
			return false, ctx.Err()
		}
	}
}

// Audit is the exactly-once check after the drain.
type Audit struct {
	// Lost: accepted enrollments (see Accepted) that are missing from the database or
	// not terminal (confirmed, failed, cancelled) after the drain.
	Lost int `json:"lost"`
	// DuplicateEvents: confirmed enrollments with copies of their
	// enrollment.confirmed event on the topic that differ: no consumer
	// deduping on the event ID could take them as one. Copies with the same
	// bytes are Redelivered: the topic is at-least-once (a worker that dies
	// between its publish and its workflow task's completion publishes
	// again, under the same event ID), and the consumer dedupes them
	// (docs/testing.md).
	DuplicateEvents int `json:"duplicate_events"`
	Redelivered     int `json:"redelivered"`
	// MissingEvents: confirmed enrollments with no such event.
	MissingEvents int `json:"missing_events"`
	// OversoldCourses: courses whose enrolled counter or confirmed
	// enrollments exceed their capacity.
	OversoldCourses int `json:"oversold_courses"`

	// Accepted is the number of enrollments clients were given: 201
	// answers, plus 409 already_enrolled answers to a Retry-After retry that
	// name the enrollment the first attempt's claim created.
	Accepted int `json:"accepted"`
	// Enrollments is the number of rows of the run's courses; Confirmed and
	// Pending (not terminal) split them.
	Enrollments int `json:"enrollments"`
	Confirmed   int `json:"confirmed"`
	Pending     int `json:"pending"`
	// UnansweredInDB: rows no client was told about (the answer was a 503
	// or timed out while the claim went on). Not lost: the seat is
	// recorded and its event published.
	UnansweredInDB int `json:"unanswered_in_db"`
	// Events is the number of enrollment.confirmed events of the run's
	// courses; UnexpectedEvents those whose enrollment is missing, failed or
	// cancelled, or whose event_id is not the deterministic one. (An event
	// of an enrollment still reserved is in flight: published, not yet
	// marked confirmed.)
	Events           int     `json:"events"`
	UnexpectedEvents int     `json:"unexpected_events"`
	Drained          bool    `json:"drained"`
	DrainS           float64 `json:"drain_s"`
	// Holders, when the arm can tell (Options.Holders), says who holds the
	// enrollments still reserved: only those are in flight.
	Holders *Holders `json:"holders,omitempty"`
}

// Holders splits the enrollments still reserved after the drain into those
// a live run holds (in flight) and those none does (orphaned: the recovery
// must finish them within its bound).
type Holders struct {
	InFlight int `json:"in_flight"`
	Orphaned int `json:"orphaned"`
	// Overdue orphans have waited longer than the recovery bound.
	Overdue      int      `json:"overdue"`
	OldestOrphan float64  `json:"oldest_orphan_s"`
	OrphanIDs    []string `json:"orphan_ids,omitempty"`
	BoundS       float64  `json:"recovery_bound_s"`
}

// OK reports whether the audit found nothing wrong.
func (a Audit) OK() bool {
	return a.Lost == 0 && a.DuplicateEvents == 0 && a.MissingEvents == 0 && a.OversoldCourses == 0 && a.UnexpectedEvents == 0 &&
		(a.Holders == nil || a.Holders.Overdue == 0)
}

// audit compares what the clients were told, what the database holds and
// what the topic carries.
func audit(ctx context.Context, db *pgxpool.Pool, kcfg kafka.Config, sc Schema, runPrefix string, courses, accepted []string) (Audit, error) {
	a := Audit{Accepted: len(accepted)}
	status := map[string]string{}
	confirmedPerCourse := map[string]int{}
	rows, err := db.Query(ctx, `SELECT id, course_id, status FROM `+sc.Enrollments+` WHERE course_id = ANY($1)`, courses)
	if err != nil {
		return a, fmt.Errorf("audit %s: %w", sc.Enrollments, err)
	}
	for rows.Next() {
		var id, course, st string
		if err := rows.Scan(&id, &course, &st); err != nil {
			rows.Close()
			return a, err
		}
		status[id] = st
		a.Enrollments++
		switch st {
		case "confirmed":
			a.Confirmed++
			confirmedPerCourse[course]++
		case "failed", "cancelled", "waitlisted": // settled (waitlisted: in its queue)
		default:
			a.Pending++
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return a, err
	}
	answered := make(map[string]bool, len(accepted))
	for _, id := range accepted {
		answered[id] = true
		switch status[id] {
		case "confirmed", "failed", "cancelled", "waitlisted":
		default:
			a.Lost++
		}
	}
	for id := range status {
		if !answered[id] {
			a.UnansweredInDB++
		}
	}

	cr, err := db.Query(ctx, `SELECT id, capacity, enrolled FROM `+sc.Courses+` WHERE id = ANY($1)`, courses)
	if err != nil {
		return a, fmt.Errorf("audit %s: %w", sc.Courses, err)
	}
	for cr.Next() {
		var id string
		var capacity, enrolled int
		if err := cr.Scan(&id, &capacity, &enrolled); err != nil {
			cr.Close()
			return a, err
		}
		if enrolled > capacity || confirmedPerCourse[id] > capacity {
			a.OversoldCourses++
		}
	}
	cr.Close()
	if err := cr.Err(); err != nil {
		return a, err
	}

	events, bad, err := confirmedEvents(ctx, kcfg, sc.Topic, runPrefix)
	if err != nil {
		return a, err
	}
	a.UnexpectedEvents = bad
	for id, ev := range events {
		n := ev.copies
		a.Events += n
		switch status[id] {
		// cancelled: confirmed, then given back by the churn.
		case "confirmed", "reserved", "dead_lettered", "cancelled":
		default:
			a.UnexpectedEvents += n
		}
	}
	for id, st := range status {
		if st != "confirmed" {
			continue
		}
		switch ev := events[id]; {
		case ev == nil:
			a.MissingEvents++
		case ev.differ:
			a.DuplicateEvents++
		default:
			a.Redelivered += ev.copies - 1
		}
	}
	return a, nil
}

// eventCopies are the copies of one enrollment's enrollment.confirmed
// event on the topic: how many, the first one's bytes, and whether any
// other copy's bytes differ.
type eventCopies struct {
	copies int
	first  []byte
	differ bool
}

func (e *eventCopies) add(value []byte) {
	if e.copies == 0 {
		e.first = value
	} else if !bytes.Equal(e.first, value) {
		e.differ = true
	}
	e.copies++
}

// confirmedEvents reads the whole topic from the start and collects the
// enrollment.confirmed events of courses whose ID starts with prefix (the
// message key is the course ID), per enrollment. bad counts events of those
// courses whose event_id is not the one derived from enrollment and type.
func confirmedEvents(ctx context.Context, kcfg kafka.Config, topic, prefix string) (map[string]*eventCopies, int, error) {
	kcfg.ClientID = "claimflow-bench-audit"
	cfg, err := kafka.SaramaConfig(kcfg)
	if err != nil {
		return nil, 0, err
	}
	cfg.Consumer.Fetch.Default = 4 << 20
	client, err := sarama.NewClient(kcfg.Brokers, cfg)
	if err != nil {
		return nil, 0, fmt.Errorf("connect to Kafka %v: %w", kcfg.Brokers, kafka.Explain(kcfg, cfg, err))
	}
	defer client.Close()
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		return nil, 0, err
	}
	defer consumer.Close()
	partitions, err := client.Partitions(topic)
	if err != nil {
		return nil, 0, fmt.Errorf("partitions of %s: %w", topic, err)
	}
	var (
		mu     sync.Mutex
		counts = map[string]*eventCopies{}
		bad    int
		wg     sync.WaitGroup
		errs   = make(chan error, len(partitions))
	)
	for _, p := range partitions {
		wg.Go(func() {
			newest, err := client.GetOffset(topic, p, sarama.OffsetNewest)
			if err != nil {
				errs <- err
				return
			}
			oldest, err := client.GetOffset(topic, p, sarama.OffsetOldest)
			if err != nil {
				errs <- err
				return
			}
			if newest <= oldest {
				return
			}
			pc, err := consumer.ConsumePartition(topic, p, oldest)
			if err != nil {
				errs <- err
				return
			}
			defer pc.Close()
			type copyOf struct {
				id    string
				value []byte
			}
			var local []copyOf
			localBad := 0
			for {
				select {
				case <-ctx.Done():
					errs <- ctx.Err()
					return
				case msg := <-pc.Messages():
					if strings.HasPrefix(string(msg.Key), prefix) {
						var e workflows.Event
						if err := json.Unmarshal(msg.Value, &e); err != nil {
							localBad++
						} else if e.Type == workflows.EventEnrollmentConfirmed {
							id, _ := e.Data["enrollment_id"].(string)
							if e.ID != workflows.EventID(id, e.Type) {
								localBad++
							} else {
								local = append(local, copyOf{id, msg.Value})
							}
						}
					}
					if msg.Offset >= newest-1 {
						mu.Lock()
						for _, c := range local {
							if counts[c.id] == nil {
								counts[c.id] = &eventCopies{}
							}
							counts[c.id].add(c.value)
						}
						bad += localBad
						mu.Unlock()
						return
					}
				case err := <-pc.Errors():
					errs <- fmt.Errorf("consume %s/%d: %w", topic, p, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, 0, err
	}
	return counts, bad, nil
}

// confirmedRate is confirmed enrollments per second from the run's first
// request to its last confirmation, so a backlog drained late counts late.
// sustainedWindow is the span over which the peak confirmation rate is
// taken: long enough that a burst of a few batches does not count.
const sustainedWindow = 10

// peakConfirmedRate is the highest confirmation rate held for
// sustainedWindow seconds: the rate the system sustains once the ramp is
// over, which the whole-run average (confirmedRate) understates.
func peakConfirmedRate(ctx context.Context, db *pgxpool.Pool, sc Schema, courses []string) (float64, error) {
	rows, err := db.Query(ctx, `SELECT extract(epoch FROM date_trunc('second', confirmed_at))::bigint, count(*)
		FROM `+sc.Enrollments+` WHERE course_id = ANY($1) AND confirmed_at IS NOT NULL GROUP BY 1 ORDER BY 1`, courses)
	if err != nil {
		return 0, fmt.Errorf("confirmations per second from %s: %w", sc.Enrollments, err)
	}
	perSecond := map[int64]int{}
	var first, last int64
	for rows.Next() {
		var sec int64
		var n int
		if err := rows.Scan(&sec, &n); err != nil {
			return 0, fmt.Errorf("confirmations per second: %w", err)
		}
		if len(perSecond) == 0 {
			first = sec
		}
		perSecond[sec], last = n, sec
	}
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("confirmations per second: %w", err)
	}
	return peakWindowRate(perSecond, first, last, sustainedWindow), nil
}

// peakWindowRate is the highest mean of window consecutive seconds (seconds
// missing from perSecond count 0) between first and last.
func peakWindowRate(perSecond map[int64]int, first, last int64, window int64) float64 {
	if len(perSecond) == 0 {
		return 0
	}
	if last-first+1 < window {
		window = last - first + 1
	}
	best, sum := 0, 0
	for sec := first; sec <= last; sec++ {
		sum += perSecond[sec]
		if sec-first >= window {
			sum -= perSecond[sec-window]
		}
		if sec-first >= window-1 {
			best = max(best, sum)
		}
	}
	return round3(float64(best) / float64(window))
}

func confirmedRate(ctx context.Context, db *pgxpool.Pool, sc Schema, courses []string) (float64, error) {
	var n int
	var span *float64
	err := db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'confirmed'),
		extract(epoch FROM max(confirmed_at) - min(requested_at))::float8
		FROM `+sc.Enrollments+` WHERE course_id = ANY($1)`, courses).Scan(&n, &span)
	if err != nil {
		return 0, fmt.Errorf("confirmed rate from %s: %w", sc.Enrollments, err)
	}
	if span == nil || *span <= 0 {
		return 0, nil
	}
	return round3(float64(n) / *span), nil
}
