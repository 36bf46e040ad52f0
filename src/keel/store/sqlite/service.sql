-- What `keel serve` asks of the SQLite store (keel.store.sqlite.service): pages of runs,
-- counts, the queue depth, and API tokens.

-- name: page_runs
-- One page of runs, newest first, in a stable order (created_at DESC, id DESC). The
-- filters below are appended where the comment stands, only those asked for, so each
-- combination is its own statement and SQLite picks the index that serves it
-- (runs_page, runs_page_by_status, runs_page_by_creator, runs_page_by_parent: an
-- equality, then the keyset range, then the order, walked backwards).
SELECT id, last_seq, created_at FROM runs
WHERE TRUE /* filters */
ORDER BY created_at DESC, id DESC
LIMIT :limit

-- name: page_if_status
AND status = :status

-- name: page_if_parent
AND parent_id = :parent_id

-- name: page_if_creator
AND creator = :creator

-- name: page_if_top_level
AND parent_id IS NULL

-- name: page_if_before
-- Strictly after the previous page's last run (the cursor) in the page order.
AND (created_at, id) < (:before_at, :before_id)

-- name: count_runs_by_status
SELECT status, count(*) FROM runs GROUP BY status

-- name: queue_depth
-- Queued runs a worker may claim (a child run, with a task, is executed by whoever
-- claims its task) plus the pending tasks a claim could take now: the ready side of
-- tasks.sql claim_candidate (no open blocker, its run not waiting for a person, a
-- child's or handoff's task only once its run is linked).
SELECT
    (SELECT count(*) FROM runs WHERE status = 'queued' AND task_id IS NULL)
  + (SELECT count(*) FROM tasks
     WHERE status = 'pending' AND open_blockers = 0
       AND (run_id IS NULL
            OR NOT EXISTS (SELECT 1 FROM runs r
                           WHERE r.id = tasks.run_id AND r.status = 'waiting'))
       AND (run_id IS NOT NULL
            OR (json_extract(options, '$.child_of') IS NULL
                AND json_extract(options, '$.handoff_from') IS NULL)))

-- name: create_token
-- A new name, or a revoked one reused (its row replaced); no row back: a live token
-- already has that name.
INSERT INTO api_tokens (name, token_hash, created_at) VALUES (:name, :hash, :at)
ON CONFLICT (name) DO UPDATE
SET token_hash = excluded.token_hash, created_at = excluded.created_at,
    revoked_at = NULL, last_used_at = NULL
WHERE api_tokens.revoked_at IS NOT NULL
RETURNING name, created_at, revoked_at, last_used_at

-- name: list_tokens
SELECT name, created_at, revoked_at, last_used_at FROM api_tokens ORDER BY created_at, name

-- name: revoke_token
UPDATE api_tokens SET revoked_at = :at
WHERE name = :name AND revoked_at IS NULL
RETURNING name, created_at, revoked_at, last_used_at

-- name: token_by_hash
SELECT name, created_at, revoked_at, last_used_at FROM api_tokens
WHERE token_hash = :hash AND revoked_at IS NULL
