-- +goose Up

-- Every effect committed in PostgreSQL can be traced to the run that
-- finishes it, so that a run that retries its step after a crash (the
-- commit done, the answer lost) recognises its own work.

-- A reservation names the batch that decided it and the time on its
-- events, so that a reservation whose deciding workflow task was lost (a
-- desk's task that committed it and never completed) can be finished by
-- its batch's run, which publishes the same event payload the desk would
-- have (workflows.RecoverReservations).
ALTER TABLE enrollments
    ADD COLUMN batch_id       text,
    ADD COLUMN occurred_at    timestamptz,
-- A cancellation names its run and what it cancelled (a seat or a place
-- on the waitlist), so that its retry goes on to free and tell as the
-- first attempt would have.
    ADD COLUMN cancelled_by   text,
    ADD COLUMN cancelled_from text;

-- The reservations still open, oldest first: few at any time, since a
-- desk confirms a batch in the workflow task that reserves it.
CREATE INDEX enrollments_reserved ON enrollments (recorded_at) WHERE status = 'reserved';

-- +goose Down
DROP INDEX enrollments_reserved;
ALTER TABLE enrollments DROP COLUMN cancelled_from, DROP COLUMN cancelled_by, DROP COLUMN occurred_at, DROP COLUMN batch_id;
