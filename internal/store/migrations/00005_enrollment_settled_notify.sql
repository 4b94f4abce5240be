-- +goose Up

-- An enrollment that leaves 'reserved' (confirmed, dead-lettered, failed,
-- cancelled) is announced on the channel enrollment_settled with its ID as
-- the payload, whichever statement moved it: the API's ?wait=confirmed
-- waits on this, one LISTEN connection per API process (store.ListenSettled),
-- instead of polling the row. The notification is sent when the
-- transaction commits, so a listener that reads the row then sees the new
-- status.
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

-- +goose Down
DROP TRIGGER enrollments_settled ON enrollments;
DROP FUNCTION notify_enrollment_settled();
