-- +goose Up

-- enrollments_updated() joined the statement's before_rows and after_rows
-- with enrollment_reservations in single statements. PL/pgSQL keeps the
-- plan it made for a connection's first such statement, and the planner,
-- with no statistics for transition tables, often made it for one row:
-- nested loops, kept for batches of hundreds. One rescanned after_rows
-- once per row of before_rows, the cost growing with the square of the
-- batch (a confirm of 193 rows compared 37,056 pairs, 27 ms); and when
-- autovacuum had just counted few rows in enrollment_reservations,
-- another read that table's whole primary key once per row, dead entries
-- and all, the cost growing with the rows deleted since its last vacuum
-- (216 rows read 163,330 buffers, 262 ms). Both grew as latency did,
-- since batches grow with it (docs/performance.md, "The full scenario").
--
-- Now each settled row costs one lookup by primary key, whatever the
-- statistics say: a row leaves 'reserved' exactly when its ID is deleted
-- from enrollment_reservations, which holds the IDs of the enrollments in
-- 'reserved' and nothing else, so the delete also says whom to notify. A
-- row that enters or stays in 'reserved' is inserted if absent.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION enrollments_updated() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public AS $$
DECLARE
    settled text;
BEGIN
    FOR settled IN SELECT id FROM after_rows WHERE status <> 'reserved' LOOP
        DELETE FROM enrollment_reservations WHERE id = settled;
        IF FOUND THEN
            PERFORM pg_notify('enrollment_settled', settled);
        END IF;
    END LOOP;
    INSERT INTO enrollment_reservations (id)
        SELECT id FROM after_rows WHERE status = 'reserved'
        ON CONFLICT (id) DO NOTHING;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION enrollments_updated() RETURNS trigger
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
