-- Reading, checking and (once, in migration 0003) chaining a run's event log on SQLite
-- (keel.store.sqlite.log). The rows themselves are read with runs.sql's read_events.

-- name: run_chain_head
SELECT last_seq, last_hash FROM runs WHERE id = ?

-- name: run_ids
SELECT id FROM runs ORDER BY created_at, rowid

-- name: runs_to_chain
-- (This and set_run_chain run in migration 0003, when the snapshot was still a runs column.)
SELECT id, last_seq, snapshot FROM runs ORDER BY rowid

-- name: events_to_chain
SELECT seq, event_id, type, recorded_at, data FROM events WHERE run_id = ? ORDER BY seq

-- name: set_event_hash
UPDATE events SET hash = ? WHERE run_id = ? AND seq = ?

-- name: set_run_chain
UPDATE runs SET last_hash = ?, snapshot = ? WHERE id = ?
