package activities

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/claimflow/claimflow/internal/store"
	"github.com/claimflow/claimflow/internal/tracing"
	"github.com/claimflow/claimflow/workflows"
)

type claimKey struct{ course, student string }

// existingClaimsSQL finds the enrollments a batch's claims already have,
// and whether each one's event is out: our own from an earlier attempt
// ($1), or another active one of the same student in the course ($2, $3).
// Two index lookups joined by UNION: an OR across them would make Postgres
// scan every enrollment for every batch.
// Each is one index probe per claim, driven by the claims: as a plain join
// or "= ANY" the planner may instead scan or sort the table (a merge join
// over every active enrollment took half a second per batch at 50,000
// enrollments, and grew with the table). Both are LATERAL subqueries with
// LIMIT, which cannot be flattened into such a join; the primary key and
// the unique index allow one row each. TestExistingClaimsProbe holds the plan.
const existingClaimsSQL = `
	SELECT e.id, e.course_id, e.student_id, e.status, e.published
	FROM unnest($1::text[]) AS k(id)
	CROSS JOIN LATERAL (
		SELECT a.id, a.course_id, a.student_id, a.status, a.published_at IS NOT NULL AS published FROM enrollments a
		WHERE a.id = k.id
		LIMIT 1) e
	UNION
	SELECT e.id, e.course_id, e.student_id, e.status, e.published
	FROM unnest($2::text[], $3::text[]) AS r(course_id, student_id)
	CROSS JOIN LATERAL (
		SELECT a.id, a.course_id, a.student_id, a.status, a.published_at IS NOT NULL AS published FROM enrollments a
		WHERE a.course_id = r.course_id AND a.student_id = r.student_id
		  AND a.holds IS NOT NULL
		LIMIT 1) e`

// ReserveSeats decides a whole batch of claims in one transaction. The
// course rows are locked in ID order, so concurrent batches serialise per
// course without deadlocks, and the decisions are made in arrival order:
// the first claims get the last seats. Retrying after a commit whose result
// was lost finds the batch's own rows and answers the same.
//
// The transaction takes two round trips to Postgres, each a pipeline: one
// opens it, locks the courses and reads the claims' enrollments; the other
// writes the decisions and commits. At low load each round trip costs more
// in wake-ups of idle processes than in work, and the course locks are held
// for one round trip less.
func (a *Activities) ReserveSeats(ctx context.Context, in workflows.ReserveSeatsInput) (workflows.ReserveSeatsResult, error) {
	res := workflows.ReserveSeatsResult{Decisions: make([]workflows.Decision, len(in.Claims))}
	// The claims' request traces: this span decides them all.
	if tracing.On() {
		for _, c := range in.Claims {
			tracing.LinkTo(ctx, c.TraceParent)
		}
	}
	conn, err := a.DB.Acquire(ctx)
	if err != nil {
		return res, fmt.Errorf("reserve seats: acquire a database connection: %w", err)
	}
	defer conn.Release()
	if err := a.reserveSeats(ctx, conn, in, &res); err != nil {
		rollback(ctx, conn)
		return res, err
	}
	return res, nil
}

// rollback ends a transaction that failed half-way, so the connection goes
// back to the pool clean; if it cannot, the pool drops the connection.
func rollback(ctx context.Context, conn *pgxpool.Conn) {
	if conn.Conn().PgConn().TxStatus() == 'I' {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	_, _ = conn.Exec(ctx, "ROLLBACK")
}

func (a *Activities) reserveSeats(ctx context.Context, conn *pgxpool.Conn, in workflows.ReserveSeatsInput, res *workflows.ReserveSeatsResult) error {
	var (
		courseIDs, ids, students []string
		claimCourses             []string
	)
	for _, c := range in.Claims {
		ids = append(ids, c.EnrollmentID)
		claimCourses = append(claimCourses, c.CourseID)
		students = append(students, c.StudentID)
		if !slices.Contains(courseIDs, c.CourseID) {
			courseIDs = append(courseIDs, c.CourseID)
		}
	}
	slices.Sort(courseIDs)

	available := map[string]int{}
	queues := map[string]*queue{}
	// Enrollments that already exist: our own from an earlier attempt, or
	// another active one of the same student.
	own := map[string]string{} // id → status
	holders := map[claimKey]string{}

	read := &pgx.Batch{}
	read.Queue("BEGIN")
	read.Queue(`SELECT id, capacity - enrolled, capacity, waitlisted, waitlist_tail FROM courses WHERE id = ANY($1) ORDER BY id FOR UPDATE`, courseIDs).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var id string
			var free, capacity int
			q := &queue{}
			if err := rows.Scan(&id, &free, &capacity, &q.waiting, &q.tail); err != nil {
				return fmt.Errorf("lock courses %v: %w", courseIDs, err)
			}
			available[id] = free
			q.room = a.waitlistLimit(capacity) - q.waiting
			queues[id] = q
		}
		return nil
	})
	read.Queue(existingClaimsSQL, ids, claimCourses, students).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var id, course, student, status string
			var published bool
			if err := rows.Scan(&id, &course, &student, &status, &published); err != nil {
				return fmt.Errorf("look up existing enrollments: %w", err)
			}
			if slices.Contains(ids, id) {
				own[id] = status
				if published {
					res.Published = append(res.Published, id)
				}
			}
			if status == "reserved" || status == "confirmed" || status == "dead_lettered" || status == "waitlisted" {
				holders[claimKey{course, student}] = id
			}
		}
		return nil
	})
	if err := conn.SendBatch(ctx, read).Close(); err != nil {
		return fmt.Errorf("lock courses %v and look up the claims' enrollments: %w", courseIDs, err)
	}

	var ins, wl newRows
	taken := map[string]int{}
	for i, c := range in.Claims {
		d := &res.Decisions[i]
		d.EnrollmentID = c.EnrollmentID
		key := claimKey{c.CourseID, c.StudentID}
		if status, ok := own[c.EnrollmentID]; ok {
			switch status {
			case "failed", "cancelled":
				d.Status, d.Refusal = workflows.StatusRefused, workflows.RefusalEnrollmentInactive
				d.Message = fmt.Sprintf("enrollment %s is already %s", c.EnrollmentID, status)
			case "waitlisted":
				d.Status = workflows.StatusWaitlisted
				var err error
				if d.Position, err = store.WaitlistPosition(ctx, conn, c.EnrollmentID); err != nil {
					return err
				}
			default:
				d.Status = workflows.StatusReserved
			}
			continue
		}
		free, exists := available[c.CourseID]
		switch holder := holders[key]; {
		case !exists:
			d.Status, d.Refusal = workflows.StatusRefused, workflows.RefusalCourseNotFound
			d.Message = fmt.Sprintf("course %q does not exist", c.CourseID)
		case holder != "":
			d.Status, d.Refusal, d.EnrollmentID = workflows.StatusRefused, workflows.RefusalAlreadyEnrolled, holder
			d.Message = fmt.Sprintf("student %q is already enrolled in %q", c.StudentID, c.CourseID)
		case (free <= 0 || queues[c.CourseID].waiting > 0) && c.Waitlist:
			// Full, or a promotion is on its way to the free seat: the
			// claim queues behind those already waiting.
			q := queues[c.CourseID]
			if q.room <= 0 {
				d.Status, d.Refusal = workflows.StatusRefused, workflows.RefusalWaitlistFull
				d.Message = fmt.Sprintf("course %q is full and so is its waitlist", c.CourseID)
				continue
			}
			q.room--
			q.waiting++
			q.tail++
			q.joined++
			d.Status, d.Position = workflows.StatusWaitlisted, q.waiting
			holders[key] = c.EnrollmentID
			wl.add(c, in)
			wl.seqs = append(wl.seqs, q.tail)
		case free <= 0 || queues[c.CourseID].waiting > 0:
			d.Status, d.Refusal = workflows.StatusRefused, workflows.RefusalCourseFull
			d.Message = fmt.Sprintf("course %q has no seat left", c.CourseID)
		default:
			d.Status = workflows.StatusReserved
			available[c.CourseID] = free - 1
			holders[key] = c.EnrollmentID
			taken[c.CourseID]++
			ins.add(c, in)
		}
	}

	write := &pgx.Batch{}
	queueWaitlisted(write, queues, wl)
	if len(ins.ids) > 0 {
		write.Queue(`
			INSERT INTO enrollments (id, course_id, student_id, status, workflow_id, run_id, requested_at, recorded_at, batch_id, occurred_at)
			SELECT id, course_id, student_id, 'reserved', workflow_id, run_id, requested_at, clock_timestamp(), batch_id, occurred_at
			FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::timestamptz[], $7::text[], $8::timestamptz[])
			     AS r(id, course_id, student_id, workflow_id, run_id, requested_at, batch_id, occurred_at)`,
			ins.ids, ins.courses, ins.students, ins.workflows, ins.runs, ins.requested, ins.batches, ins.occurred)
		var takenCourses []string
		var takenCounts []int32
		for course, n := range taken {
			takenCourses = append(takenCourses, course)
			takenCounts = append(takenCounts, int32(n))
		}
		write.Queue(`
			UPDATE courses c SET enrolled = c.enrolled + t.n
			FROM unnest($1::text[], $2::int[]) AS t(id, n) WHERE c.id = t.id`, takenCourses, takenCounts)
	}
	write.Queue("COMMIT")
	if err := conn.SendBatch(ctx, write).Close(); err != nil {
		// A concurrent single-enrollment run may have won a pair between
		// our read and the insert; the retry sees it as a holder.
		return fmt.Errorf("record %d reserved and %d waitlisted enrollments and take their places: %w", len(ins.ids), len(wl.ids), err)
	}
	return nil
}

// queue is a course's waitlist while a batch decides: places left, people
// waiting, the last place's number, and how many this batch added.
type queue struct {
	room, waiting, joined int
	tail                  int64
}

// newRows are the columns of the enrollments a batch writes, one entry per
// claim: the arrays its INSERT unnests.
type newRows struct {
	ids, courses, students, workflows, runs, batches []string
	requested, occurred                              []time.Time
	seqs                                             []int64 // waitlist places; waitlisted rows only
}

func (r *newRows) add(c workflows.EnrollmentInput, in workflows.ReserveSeatsInput) {
	r.ids = append(r.ids, c.EnrollmentID)
	r.courses = append(r.courses, c.CourseID)
	r.students = append(r.students, c.StudentID)
	r.workflows = append(r.workflows, in.WorkflowID)
	r.runs = append(r.runs, in.RunID)
	r.requested = append(r.requested, c.RequestedAt)
	r.batches = append(r.batches, c.BatchID)
	r.occurred = append(r.occurred, c.OccurredAt)
}

// queueWaitlisted queues the statements that write the batch's waitlisted
// enrollments with their places and count them on their courses.
func queueWaitlisted(b *pgx.Batch, queues map[string]*queue, wl newRows) {
	if len(wl.ids) == 0 {
		return
	}
	b.Queue(`
		INSERT INTO enrollments (id, course_id, student_id, status, workflow_id, run_id, requested_at, recorded_at, batch_id, waitlist_seq, waitlisted_at)
		SELECT id, course_id, student_id, 'waitlisted', workflow_id, run_id, requested_at, clock_timestamp(), batch_id, seq, clock_timestamp()
		FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::timestamptz[], $7::text[], $8::bigint[])
		     AS r(id, course_id, student_id, workflow_id, run_id, requested_at, batch_id, seq)`,
		wl.ids, wl.courses, wl.students, wl.workflows, wl.runs, wl.requested, wl.batches, wl.seqs)
	var cs []string
	var ns []int32
	for id, q := range queues {
		if q.joined > 0 {
			cs = append(cs, id)
			ns = append(ns, int32(q.joined))
		}
	}
	b.Queue(`
		UPDATE courses c SET waitlisted = c.waitlisted + t.n, waitlist_tail = c.waitlist_tail + t.n
		FROM unnest($1::text[], $2::int[]) AS t(id, n) WHERE c.id = t.id`, cs, ns)
}

// FailFastWindow is how long after a failed send a FailFast publish is
// refused without trying: long enough that an outage costs each batch no
// wait, short enough that the fast path is back within seconds of recovery.
const FailFastWindow = 2 * time.Second

// sendFailedWithin says whether a batch send failed within window, and how
// long ago.
func (a *Activities) sendFailedWithin(window time.Duration) (ago time.Duration, failed bool) {
	at := a.lastSendFailure.Load()
	if at == 0 {
		return 0, false
	}
	ago = time.Since(time.Unix(0, at))
	return ago, ago < window
}

// PublishBatch sends the batch's events in one call and stamps published_at
// on each acknowledged enrollment. Events of enrollments already stamped are
// not sent again, so a retry sends only what is missing; it looks them up
// unless the input knows them (PublishedKnown).
func (a *Activities) PublishBatch(ctx context.Context, in workflows.PublishBatchInput) error {
	if len(in.Messages) != len(in.EnrollmentIDs) {
		return fmt.Errorf("publish batch: %d messages for %d enrollments", len(in.Messages), len(in.EnrollmentIDs))
	}
	if ago, failed := a.sendFailedWithin(FailFastWindow); in.FailFast && failed {
		return fmt.Errorf("publish batch: not sent, the broker failed a send %s ago", ago.Round(time.Millisecond))
	}
	done := map[string]bool{}
	var published []string
	for _, id := range in.Published {
		if slices.Contains(in.EnrollmentIDs, id) {
			published = append(published, id)
		}
	}
	if !in.PublishedKnown {
		rows, err := a.DB.Query(ctx, `SELECT id FROM enrollments WHERE id = ANY($1) AND published_at IS NOT NULL`, in.EnrollmentIDs)
		if err != nil {
			return fmt.Errorf("check which events are out: %w", err)
		}
		if published, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
			return fmt.Errorf("check which events are out: %w", err)
		}
	}
	for _, id := range published {
		done[id] = true
	}

	var msgs []*sarama.ProducerMessage
	for i, m := range in.Messages {
		if done[in.EnrollmentIDs[i]] {
			continue
		}
		payload, err := json.Marshal(m.Event)
		if err != nil {
			return fmt.Errorf("encode event %s: %w", m.Event.ID, err)
		}
		msgs = append(msgs, &sarama.ProducerMessage{
			Topic: m.Topic,
			Key:   sarama.StringEncoder(m.Key),
			Value: sarama.ByteEncoder(payload),
			Headers: []sarama.RecordHeader{
				{Key: []byte("event_id"), Value: []byte(m.Event.ID)},
				{Key: []byte("type"), Value: []byte(m.Event.Type)},
			},
			Metadata: in.EnrollmentIDs[i],
		})
	}
	if len(msgs) == 0 {
		if in.Confirm {
			return a.recordPublished(ctx, published, true)
		}
		return nil
	}
	ctx, span := produceSpan(ctx, msgs[0].Topic, len(msgs))
	if tracing.On() {
		for _, m := range msgs {
			tracing.Inject(ctx, m)
		}
	}
	began := time.Now()
	sendErr := a.Producer.SendMessages(msgs)
	endSpan(span, sendErr)
	if sendErr != nil {
		a.lastSendFailure.Store(time.Now().UnixNano())
	}
	failed := map[string]bool{}
	var perrs sarama.ProducerErrors
	switch {
	case sendErr == nil:
	case errors.As(sendErr, &perrs):
		for _, pe := range perrs {
			if id, ok := pe.Msg.Metadata.(string); ok {
				failed[id] = true
			}
		}
	default:
		for _, m := range msgs {
			failed[m.Metadata.(string)] = true
		}
	}
	var acked []string
	for _, m := range msgs {
		id := m.Metadata.(string)
		if failed[id] {
			a.Metrics.observePublish(m.Topic, began, sendErr)
			continue
		}
		acked = append(acked, id)
		a.Metrics.observePublish(m.Topic, began, nil)
	}
	if in.Confirm {
		// Those published by an earlier attempt are confirmed too.
		acked = append(acked, published...)
	}
	if err := a.recordPublished(ctx, acked, in.Confirm); err != nil {
		return err
	}
	if len(failed) > 0 {
		return fmt.Errorf("publish batch: %d of %d events not acknowledged: %w", len(failed), len(msgs), sendErr)
	}
	return nil
}

// recordPublished stamps published_at on acknowledged enrollments and, with
// confirm, ends them in the same statement.
func (a *Activities) recordPublished(ctx context.Context, ids []string, confirm bool) error {
	if len(ids) == 0 {
		return nil
	}
	var err error
	if confirm {
		_, err = a.DB.Exec(ctx, `
			UPDATE enrollments SET published_at = COALESCE(published_at, clock_timestamp()),
				confirmed_at = CASE WHEN status IN ('reserved', 'dead_lettered') THEN COALESCE(confirmed_at, clock_timestamp()) ELSE confirmed_at END,
				status = CASE WHEN status IN ('reserved', 'dead_lettered') THEN 'confirmed' ELSE status END,
				updated_at = now()
			WHERE id = ANY($1)`, ids)
	} else {
		_, err = a.DB.Exec(ctx, `
			UPDATE enrollments SET published_at = COALESCE(published_at, clock_timestamp()), updated_at = now()
			WHERE id = ANY($1)`, ids)
	}
	if err != nil {
		return fmt.Errorf("record %d published events: %w", len(ids), err)
	}
	return nil
}

// ConfirmBatch ends the published enrollments of a batch.
func (a *Activities) ConfirmBatch(ctx context.Context, ids []string) error {
	_, err := a.DB.Exec(ctx, `
		UPDATE enrollments SET status = 'confirmed', confirmed_at = COALESCE(confirmed_at, clock_timestamp()), updated_at = now()
		WHERE id = ANY($1) AND status IN ('reserved', 'dead_lettered')`, ids)
	if err != nil {
		return fmt.Errorf("confirm %d enrollments: %w", len(ids), err)
	}
	return nil
}

// ReleaseSeats is the compensation of ReserveSeats: every enrollment still
// reserved fails and gives its seat back; running it twice frees nothing more.
func (a *Activities) ReleaseSeats(ctx context.Context, ids []string) error {
	return pgx.BeginFunc(ctx, a.DB, func(tx pgx.Tx) error {
		// A batch that fails before it answered also takes back the places
		// its claims took on waitlists.
		if _, err := tx.Exec(ctx, `
			WITH held AS (
				SELECT id, course_id, status FROM enrollments
				WHERE id = ANY($1) AND status IN ('reserved', 'dead_lettered', 'waitlisted') FOR UPDATE
			), released AS (
				UPDATE enrollments e SET status = 'failed', failed_at = clock_timestamp(), updated_at = now()
				FROM held WHERE e.id = held.id
				RETURNING held.course_id, held.status AS was
			)
			UPDATE courses c SET enrolled = c.enrolled - r.seats, waitlisted = c.waitlisted - r.places
			FROM (SELECT course_id, count(*) FILTER (WHERE was <> 'waitlisted') AS seats, count(*) FILTER (WHERE was = 'waitlisted') AS places
			      FROM released GROUP BY course_id) r
			WHERE c.id = r.course_id`, ids); err != nil {
			return fmt.Errorf("release %d seats: %w", len(ids), err)
		}
		return nil
	})
}
