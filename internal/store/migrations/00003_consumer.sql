-- +goose Up

-- One row per consumed event whose notification was delivered. The event ID
-- is the consumer's idempotency key: a redelivered event finds its row and
-- changes nothing, so the row doubles as the "processed events" record.
CREATE TABLE notifications (
    event_id         text PRIMARY KEY,
    event_type       text NOT NULL,
    -- the student or user the notification is for (data.student_id or
    -- data.user_id); NULL when the event names nobody
    recipient        text,
    topic            text NOT NULL,
    kafka_partition  integer NOT NULL,
    kafka_offset     bigint NOT NULL,
    message_key      text NOT NULL,
    payload          jsonb NOT NULL,
    occurred_at      timestamptz,
    -- consumer: applied inline by the consumer; workflow: applied by the
    -- DeliverEvent run after the inline attempt failed
    path             text NOT NULL CHECK (path IN ('consumer', 'workflow')),
    -- delivery attempts it took, the consumer's inline attempt included
    attempts         integer NOT NULL DEFAULT 1,
    -- delivery order: compared with offsets it shows which events of a key
    -- arrived after later ones (those that went through the retry path)
    seq              bigserial NOT NULL,
    delivered_at     timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- A recipient's inbox, in the order things happened.
CREATE INDEX notifications_recipient ON notifications (recipient, occurred_at);
-- The audit reads one topic's rows.
CREATE INDEX notifications_topic ON notifications (topic, kafka_partition, kafka_offset);

-- Dead letters now come from two places: a publish that exhausted its retries
-- (the enrollment sagas) and a consumed event whose notification could not
-- be delivered (DeliverEvent). One event can be dead-lettered at both stages,
-- so the unique key becomes (event_id, stage); existing rows are publishes.
ALTER TABLE dead_letters
    ADD COLUMN stage text NOT NULL DEFAULT 'publish' CHECK (stage IN ('publish', 'consume'));
ALTER TABLE dead_letters DROP CONSTRAINT dead_letters_event_id_key;
ALTER TABLE dead_letters ADD CONSTRAINT dead_letters_event_id_stage_key UNIQUE (event_id, stage);

-- +goose Down
DELETE FROM dead_letters WHERE stage = 'consume';
ALTER TABLE dead_letters DROP CONSTRAINT dead_letters_event_id_stage_key;
ALTER TABLE dead_letters ADD CONSTRAINT dead_letters_event_id_key UNIQUE (event_id);
ALTER TABLE dead_letters DROP COLUMN stage;
DROP TABLE notifications;
