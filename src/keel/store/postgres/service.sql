-- What `keel serve` asks of the PostgreSQL store (keel.store.postgres.service): pages of
-- runs, counts, the queue depth, and API tokens.

-- name: page_runs
-- One page of runs, newest first, in a stable order (created_at DESC, id DESC), each with
-- the rows a reader checks (as runs.sql run_state). The filters below are appended where
-- the comment stands, only those asked for, so each combination is its own statement
-- and the planner picks the index that serves it (runs_page, runs_page_by_status,
-- runs_page_by_creator, runs_page_by_parent: an equality, then the keyset range, then
-- the order, scanned backwards).
SELECT r.id, r.last_seq, r.last_hash, r.snapshot,
       (SELECT json_agg(json_build_array(
                e.seq, e.event_id, e.type,
                to_char(e.recorded_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'),
                e.data::text, e.hash) ORDER BY e.seq)
        FROM events e
        WHERE e.run_id = r.id
          AND e.seq >= greatest(least(r.last_seq, (r.snapshot->>'last_seq')::bigint) - 1, 1)),
       r.created_at
FROM runs r
WHERE TRUE /* filters */
ORDER BY r.created_at DESC, r.id DESC
LIMIT %(limit)s

-- name: page_if_status
AND r.status = %(status)s

-- name: page_if_parent
AND r.parent_id = %(parent_id)s

-- name: page_if_creator
AND r.creator = %(creator)s

-- name: page_if_top_level
AND r.parent_id IS NULL

-- name: page_if_before
-- Strictly after the previous page's last run (the cursor) in the page order.
AND (r.created_at, r.id) < (%(before_at)s::timestamptz, %(before_id)s::text)

-- name: count_runs_by_status
SELECT status, count(*) FROM runs GROUP BY status

-- name: queue_depth
-- Queued runs a worker may claim (a child run, with a task, is executed by whoever
-- claims its task) plus the pending tasks a claim could take now: the ready side of
-- tasks.sql claim_pick_next (every blocker completed, its run not waiting for a person,
-- a child's or handoff's task only once its run is linked).
SELECT
    (SELECT count(*) FROM runs WHERE status = 'queued' AND task_id IS NULL)
  + (SELECT count(*) FROM tasks r
     WHERE r.status = 'pending' AND r.open_blockers = 0
       AND (r.run_id IS NULL OR NOT EXISTS (
            SELECT 1 FROM runs w WHERE w.id = r.run_id AND w.status = 'waiting'))
       AND (r.run_id IS NOT NULL
            OR (r.options->>'child_of' IS NULL AND r.options->>'handoff_from' IS NULL))
       AND NOT EXISTS (
            SELECT 1 FROM task_dependencies d JOIN tasks b ON b.id = d.blocker_id
            WHERE d.task_id = r.id AND b.status <> 'completed'))

-- name: create_token
-- A new name, or a revoked one reused (its row replaced); no row back: a live token
-- already has that name (a concurrent creator of the same name waits for the first to
-- commit, then finds it live).
INSERT INTO api_tokens (name, token_hash, created_at) VALUES (%(name)s, %(hash)s, now())
ON CONFLICT (name) DO UPDATE
SET token_hash = excluded.token_hash, created_at = excluded.created_at,
    revoked_at = NULL, last_used_at = NULL
WHERE api_tokens.revoked_at IS NOT NULL
RETURNING name, created_at, revoked_at, last_used_at

-- name: list_tokens
SELECT name, created_at, revoked_at, last_used_at FROM api_tokens ORDER BY created_at, name

-- name: revoke_token
UPDATE api_tokens SET revoked_at = now()
WHERE name = %(name)s AND revoked_at IS NULL
RETURNING name, created_at, revoked_at, last_used_at

-- name: token_by_hash
SELECT name, created_at, revoked_at, last_used_at FROM api_tokens
WHERE token_hash = %(hash)s AND revoked_at IS NULL
