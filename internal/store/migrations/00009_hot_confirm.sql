-- +goose Up

-- A claim's confirm (reserved → confirmed, as its event is published) is a
-- HOT update: its new row version goes on the same page and adds no index
-- entry. Postgres makes an update HOT only when no column an index holds,
-- as a key or in its predicate, changes value, and when the page has room.
-- Before this, four indexes held status, so each confirm added an entry to
-- each index the row fell under (5 per claim): at 2,000 claims/s for ten
-- minutes the indexes outgrew shared_buffers and autovacuum's passes grew
-- from 0.1 to 5 s (docs/performance.md, "The full scenario").
--
-- So no index holds status, published_at, confirmed_at or updated_at:
--   * holds, computed from status, is what an enrollment holds: a seat
--     (reserved, confirmed, dead-lettered), a place in its course's queue
--     (waitlisted), or nothing (NULL: failed, cancelled). It does not change
--     when a reservation is confirmed, so the indexes that need to know
--     whether an enrollment is active or waiting filter on it instead;
--   * the roster by status reads enrollments_roster and filters
--     (enrollments_course, which led with the same course_id, is gone);
--   * the reservations still open are rows of enrollment_reservations, kept
--     by the triggers below, instead of a partial index on status.
-- A desk confirms a whole batch in one statement, so every row of a page
-- may need its new version there at once, before the old ones can be
-- pruned: fillfactor 50 leaves each page half free for them (at 80, 29 %
-- of a batch's confirms were HOT; at 50, 98 %: TestConfirmIsHOT).
ALTER TABLE enrollments SET (fillfactor = 50);
ALTER TABLE enrollments ADD COLUMN holds text
    GENERATED ALWAYS AS (CASE WHEN status IN ('reserved', 'confirmed', 'dead_lettered') THEN 'seat'
                              WHEN status = 'waitlisted' THEN 'place' END) STORED
    CHECK (holds IN ('seat', 'place'));

DROP INDEX enrollments_one_active_per_student;
CREATE UNIQUE INDEX enrollments_one_active_per_student
    ON enrollments (course_id, student_id) WHERE holds IS NOT NULL;
DROP INDEX enrollments_waitlist;
CREATE INDEX enrollments_waitlist ON enrollments (course_id, waitlist_seq) WHERE holds = 'place';
DROP INDEX enrollments_course;
DROP INDEX enrollments_reserved;

-- The enrollments in status 'reserved': few at any time, since a desk
-- confirms a batch in the workflow task that reserves it. Only the
-- triggers write it; the runtime role reads it.
CREATE TABLE enrollment_reservations (
    id text PRIMARY KEY
);
INSERT INTO enrollment_reservations (id) SELECT id FROM enrollments WHERE status = 'reserved';

-- One statement-level trigger per kind of statement, so that a batch's
-- insert or confirm runs each of these statements once, not once a row.
-- They run as the schema's owner (SECURITY DEFINER): the runtime role
-- deletes no row itself.
-- +goose StatementBegin
CREATE FUNCTION enrollments_inserted() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public AS $$
BEGIN
    INSERT INTO enrollment_reservations (id) SELECT id FROM inserted WHERE status = 'reserved';
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- An enrollment that leaves 'reserved' (confirmed, dead-lettered, failed,
-- cancelled) is also announced on the channel enrollment_settled with its
-- ID as the payload, whichever statement moved it: the API's
-- ?wait=confirmed waits on this, one LISTEN connection per API process
-- (store.ListenSettled), instead of polling the row. The notification is
-- sent when the transaction commits, so a listener that reads the row then
-- sees the new status.
-- +goose StatementBegin
CREATE FUNCTION enrollments_updated() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public AS $$
BEGIN
    DELETE FROM enrollment_reservations r USING before_rows o, after_rows n
        WHERE r.id = o.id AND n.id = o.id AND o.status = 'reserved' AND n.status <> 'reserved';
    INSERT INTO enrollment_reservations (id)
        SELECT n.id FROM before_rows o JOIN after_rows n ON n.id = o.id
        WHERE n.status = 'reserved' AND o.status <> 'reserved';
    PERFORM pg_notify('enrollment_settled', n.id)
        FROM before_rows o JOIN after_rows n ON n.id = o.id
        WHERE o.status = 'reserved' AND n.status <> 'reserved';
    RETURN NULL;
END
$$;
-- +goose StatementEnd

DROP TRIGGER enrollments_settled ON enrollments;
DROP FUNCTION notify_enrollment_settled();
CREATE TRIGGER enrollments_inserted AFTER INSERT ON enrollments
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION enrollments_inserted();
CREATE TRIGGER enrollments_updated AFTER UPDATE ON enrollments
    REFERENCING OLD TABLE AS before_rows NEW TABLE AS after_rows
    FOR EACH STATEMENT EXECUTE FUNCTION enrollments_updated();

-- +goose Down
DROP TRIGGER enrollments_updated ON enrollments;
DROP TRIGGER enrollments_inserted ON enrollments;
DROP FUNCTION enrollments_updated();
DROP FUNCTION enrollments_inserted();
-- +goose StatementBegin
CREATE FUNCTION notify_enrollment_settled() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('enrollment_settled', NEW.id);
    RETURN NULL;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER enrollments_settled
    AFTER UPDATE OF status ON enrollments
    FOR EACH ROW
    WHEN (OLD.status = 'reserved' AND NEW.status <> 'reserved')
    EXECUTE FUNCTION notify_enrollment_settled();
DROP TABLE enrollment_reservations;
CREATE INDEX enrollments_reserved ON enrollments (recorded_at) WHERE status = 'reserved';
CREATE INDEX enrollments_course ON enrollments (course_id, status, requested_at, id);
DROP INDEX enrollments_waitlist;
CREATE INDEX enrollments_waitlist ON enrollments (course_id, waitlist_seq) WHERE status = 'waitlisted';
DROP INDEX enrollments_one_active_per_student;
CREATE UNIQUE INDEX enrollments_one_active_per_student
    ON enrollments (course_id, student_id)
    WHERE status IN ('reserved', 'confirmed', 'dead_lettered', 'waitlisted');
ALTER TABLE enrollments DROP COLUMN holds;
ALTER TABLE enrollments RESET (fillfactor);
