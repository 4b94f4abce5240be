-- +goose Up

-- The reads people make next: a student's enrollments (newest first), a
-- course's roster (in request order, optionally by status), a user's
-- coupons (newest first) and a recipient's inbox (newest first, optionally
-- unread only). Each list pages by a keyset that one of these indexes
-- serves in order, so a page costs the same on the first page as on the
-- thousandth.
CREATE INDEX enrollments_student ON enrollments (student_id, requested_at DESC, id DESC);
CREATE INDEX enrollments_roster ON enrollments (course_id, requested_at, id);
-- (course_id, status) was a prefix of this one; the roster by status uses it.
DROP INDEX enrollments_course;
CREATE INDEX enrollments_course ON enrollments (course_id, status, requested_at, id);

CREATE INDEX coupons_user ON coupons (user_id, issued_at DESC, id DESC);

ALTER TABLE notifications ADD COLUMN read_at timestamptz;
-- Nothing read (recipient, occurred_at); the inbox pages by delivery order.
DROP INDEX notifications_recipient;
CREATE INDEX notifications_inbox ON notifications (recipient, seq DESC);
CREATE INDEX notifications_unread ON notifications (recipient, seq DESC) WHERE read_at IS NULL;
-- A notification's ID in the API is its seq.
CREATE UNIQUE INDEX notifications_seq ON notifications (seq);

-- +goose Down
DROP INDEX notifications_seq;
DROP INDEX notifications_unread;
DROP INDEX notifications_inbox;
CREATE INDEX notifications_recipient ON notifications (recipient, occurred_at);
ALTER TABLE notifications DROP COLUMN read_at;
DROP INDEX coupons_user;
DROP INDEX enrollments_course;
CREATE INDEX enrollments_course ON enrollments (course_id, status);
DROP INDEX enrollments_roster;
DROP INDEX enrollments_student;
