-- Reading, checking and (once, in migration 0003) chaining a run's event log on
-- PostgreSQL (keel.store.postgres.log). Times are read as keel.core.chain.chain_time
-- text and data as its stored JSON text: the bytes the chain hashed.

-- name: run_chain_head
SELECT last_seq, last_hash, snapshot FROM runs WHERE id = %(id)s

-- name: run_head_hash
SELECT last_hash FROM runs WHERE id = %(id)s

-- name: read_events
-- The run's head and its events from %(from)s on (the event before the ones a reader
-- wants, whose stored hash the next chains to), in one statement: one snapshot.
SELECT r.last_seq, r.last_hash, e.seq, e.event_id, e.type,
       to_char(e.recorded_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'),
       e.data::text, e.hash
FROM runs r
LEFT JOIN LATERAL (
    SELECT seq, event_id, type, recorded_at, data, hash FROM events
    WHERE run_id = r.id AND seq >= %(from)s ORDER BY seq LIMIT %(limit)s
) e ON true
WHERE r.id = %(id)s

-- name: log_rows
-- Every event of a run, for keel verify (read through a server-side cursor).
SELECT seq, event_id, type,
       to_char(recorded_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'),
       data::text, hash
FROM events WHERE run_id = %(id)s ORDER BY seq

-- name: run_ids
SELECT id FROM runs ORDER BY position

-- name: runs_to_chain
SELECT id, last_seq, snapshot::text FROM runs ORDER BY position

-- name: events_to_chain
SELECT seq, event_id, type,
       to_char(recorded_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'),
       data::text
FROM events WHERE run_id = %(id)s ORDER BY seq

-- name: set_event_hash
UPDATE events SET hash = %(hash)s WHERE run_id = %(id)s AND seq = %(seq)s

-- name: set_run_chain
UPDATE runs SET last_hash = %(hash)s, snapshot = %(snapshot)s::json WHERE id = %(id)s
