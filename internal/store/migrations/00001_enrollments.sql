-- +goose Up
CREATE TABLE courses (
    id          text PRIMARY KEY,
    title       text NOT NULL,
    capacity    integer NOT NULL CHECK (capacity >= 0),
    credits     integer NOT NULL DEFAULT 0 CHECK (credits >= 0),
    -- enrolled counts active enrollments; the CHECK is the last line of
    -- defence against overselling should any code path forget the guard.
    enrolled    integer NOT NULL DEFAULT 0 CHECK (enrolled >= 0 AND enrolled <= capacity),
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE enrollments (
    id            text PRIMARY KEY,
    course_id     text NOT NULL REFERENCES courses (id),
    student_id    text NOT NULL,
    status        text NOT NULL CHECK (status IN ('reserved', 'confirmed', 'dead_lettered', 'failed', 'cancelled')),
    workflow_id   text NOT NULL,
    run_id        text NOT NULL,
    requested_at  timestamptz NOT NULL,  -- the API received the request
    recorded_at   timestamptz NOT NULL,  -- the seat was committed here
    published_at  timestamptz,           -- Kafka acknowledged enrollment.confirmed
    confirmed_at  timestamptz,
    cancelled_at  timestamptz,
    failed_at     timestamptz,
    updated_at    timestamptz NOT NULL DEFAULT now()
);

-- One active enrollment per student and course, whatever the concurrency.
CREATE UNIQUE INDEX enrollments_one_active_per_student
    ON enrollments (course_id, student_id)
    WHERE status IN ('reserved', 'confirmed', 'dead_lettered');

CREATE INDEX enrollments_course ON enrollments (course_id, status);

CREATE TABLE dead_letters (
    id             bigserial PRIMARY KEY,
    -- one dead letter per event: a message that fails again reopens its row
    event_id       text NOT NULL UNIQUE,
    event_type     text NOT NULL,
    topic          text NOT NULL,
    message_key    text NOT NULL,
    payload        jsonb NOT NULL,
    workflow_id    text NOT NULL,
    run_id         text NOT NULL,
    enrollment_id  text,
    error          text NOT NULL,
    rounds         integer NOT NULL DEFAULT 1,
    status         text NOT NULL CHECK (status IN ('open', 'retrying', 'resolved', 'compensated', 'discarded')),
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX dead_letters_status ON dead_letters (status, id);

-- +goose Down
DROP TABLE dead_letters;
DROP TABLE enrollments;
DROP TABLE courses;
