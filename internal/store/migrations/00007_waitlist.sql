-- +goose Up

-- The waitlist. A claim that finds its course full and asks to wait is an
-- enrollment in status 'waitlisted' with a place in its course's queue
-- (waitlist_seq, first come first served). When a seat frees, the head of
-- the queue is promoted (promotion_seq numbers the promotions) in the same kind of transaction that takes a seat:
-- status 'reserved', promoted_at, and promoted_by naming the step that
-- freed the seat, so a retried promotion finds its own promotions again.
ALTER TABLE enrollments DROP CONSTRAINT enrollments_status_check;
ALTER TABLE enrollments ADD CONSTRAINT enrollments_status_check
    CHECK (status IN ('reserved', 'confirmed', 'dead_lettered', 'failed', 'cancelled', 'waitlisted'));
ALTER TABLE enrollments
    ADD COLUMN waitlist_seq   bigint,
    ADD COLUMN waitlisted_at  timestamptz,
    ADD COLUMN promoted_at    timestamptz,
    ADD COLUMN promoted_by    text,
    ADD COLUMN promotion_seq  bigint;

-- A waitlisted student holds a place as an enrolled one holds a seat: one
-- active enrollment per student and course, waiting or not.
DROP INDEX enrollments_one_active_per_student;
CREATE UNIQUE INDEX enrollments_one_active_per_student
    ON enrollments (course_id, student_id)
    WHERE status IN ('reserved', 'confirmed', 'dead_lettered', 'waitlisted');

-- The queue of a course, head first.
CREATE INDEX enrollments_waitlist ON enrollments (course_id, waitlist_seq) WHERE status = 'waitlisted';
CREATE INDEX enrollments_promoted_by ON enrollments (promoted_by) WHERE promoted_by IS NOT NULL;

-- waitlisted counts the queue, as enrolled counts the seats taken. The
-- tails number the course's places and promotions in order; they move only
-- under the course row's lock, so numbers follow arrival exactly.
ALTER TABLE courses
    ADD COLUMN waitlisted     integer NOT NULL DEFAULT 0 CHECK (waitlisted >= 0),
    ADD COLUMN waitlist_tail  bigint NOT NULL DEFAULT 0,
    ADD COLUMN promotion_tail bigint NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE courses DROP COLUMN promotion_tail, DROP COLUMN waitlist_tail, DROP COLUMN waitlisted;
DROP INDEX enrollments_promoted_by;
DROP INDEX enrollments_waitlist;
DROP INDEX enrollments_one_active_per_student;
CREATE UNIQUE INDEX enrollments_one_active_per_student
    ON enrollments (course_id, student_id)
    WHERE status IN ('reserved', 'confirmed', 'dead_lettered');
ALTER TABLE enrollments
    DROP COLUMN promotion_seq, DROP COLUMN promoted_by, DROP COLUMN promoted_at,
    DROP COLUMN waitlisted_at, DROP COLUMN waitlist_seq;
ALTER TABLE enrollments DROP CONSTRAINT enrollments_status_check;
ALTER TABLE enrollments ADD CONSTRAINT enrollments_status_check
    CHECK (status IN ('reserved', 'confirmed', 'dead_lettered', 'failed', 'cancelled'));
