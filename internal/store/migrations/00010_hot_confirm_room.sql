-- +goose Up

-- Fillfactor 50 left room for a batch's confirms but not quite: a row's
-- confirmed version is wider than its reserved one (published_at and
-- confirmed_at, NULL before, take 16 bytes; 'confirmed' is one character
-- longer than 'reserved'), so the last row of a page to be confirmed often
-- found no room and went to another page, non-HOT: 4.2 % of confirms at
-- 2,000 claims/s, about one a page. Each of those left a dead item pointer
-- that only a vacuum's index pass removes, and PostgreSQL skips that pass
-- only while under 2 % of a table's pages hold one. So every autovacuum of
-- enrollments scanned all six of its indexes, a pass that grows with them
-- (docs/performance.md, "The full scenario"). At 45 every confirm is HOT
-- (100 % at 2,000 claims/s), for 3 % more heap pages.
ALTER TABLE enrollments SET (fillfactor = 45);

-- +goose Down
ALTER TABLE enrollments SET (fillfactor = 50);
