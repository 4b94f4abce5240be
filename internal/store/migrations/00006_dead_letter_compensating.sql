-- +goose Up

-- An operator's decision is marked on its row in the statement that takes
-- it (UPDATE … WHERE status = 'open'), so of two concurrent decisions only
-- one is taken. A retry is marked 'retrying', as the run marks it; a
-- compensate is marked 'compensating' until the run has compensated and
-- marks the row 'compensated' (or 'discarded').
ALTER TABLE dead_letters DROP CONSTRAINT dead_letters_status_check;
ALTER TABLE dead_letters ADD CONSTRAINT dead_letters_status_check
    CHECK (status IN ('open', 'retrying', 'compensating', 'resolved', 'compensated', 'discarded'));

-- +goose Down
UPDATE dead_letters SET status = 'open' WHERE status = 'compensating';
ALTER TABLE dead_letters DROP CONSTRAINT dead_letters_status_check;
ALTER TABLE dead_letters ADD CONSTRAINT dead_letters_status_check
    CHECK (status IN ('open', 'retrying', 'resolved', 'compensated', 'discarded'));
