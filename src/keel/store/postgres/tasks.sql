-- Every statement of the PostgreSQL task graph (keel.store.postgres.tasks speaks them).
-- Columns of a task row, in the order PostgresTasks reads them:
--   id, subject, description, status, owner, lease_token, lease_expires_at, attempt,
--   result, run_id, options, idempotency_key, created_at, updated_at, version, blocked_by
-- Reads add blocker_statuses (the statuses of blocked_by, same order). Each write is
-- one statement that changes the row and appends its event together, at one now();
-- a write that returns no row changed nothing, and the caller asks why.

-- name: create_task
WITH task AS (
    INSERT INTO tasks (id, subject, description, status, attempt, options, idempotency_key,
                       created_at, updated_at, version, blocked_by, open_blockers)
    VALUES (%(id)s, %(subject)s, %(description)s, 'pending', 0, %(options)s, %(key)s,
            now(), now(), 1, %(blocked_by)s, %(open_blockers)s)
    ON CONFLICT DO NOTHING
    RETURNING id, subject, description, status, owner, lease_token, lease_expires_at,
              attempt, result, run_id, options, idempotency_key, created_at, updated_at,
              version, blocked_by
), dependencies AS (
    INSERT INTO task_dependencies (task_id, blocker_id)
    SELECT task.id, blocker FROM task, unnest(%(blocked_by)s::text[]) AS blocker
), event AS (
    INSERT INTO task_events (task_id, seq, type, actor, recorded_at, data)
    SELECT id, 1, 'task_created', %(actor)s, created_at, %(data)s::json FROM task
)
SELECT * FROM task

-- name: notify_work
-- After a task is created ready: wake idle workers. Sent in the creation's pipeline as
-- its own transaction, committed without waiting for fsync, so creations do not
-- serialise on the notification queue (a lost wake-up only delays a poll).
SELECT pg_notify('keel_work', ''), set_config('synchronous_commit', 'off', true)

-- name: task_id_by_key
SELECT id FROM tasks WHERE idempotency_key = %(key)s

-- name: lock_blockers
-- The blockers' statuses, share-locked until commit: a concurrent completion of one
-- waits for this transaction, then sees the dependency it adds.
SELECT id, status FROM tasks WHERE id = ANY(%(ids)s::text[]) ORDER BY id FOR SHARE

-- name: graph_lock
-- Serialises dependency additions, so two of them cannot close a cycle together.
SELECT pg_advisory_xact_lock(1801807212)

-- name: lock_task
SELECT id, subject, description, status, owner, lease_token, lease_expires_at, attempt,
       result, run_id, options, idempotency_key, created_at, updated_at, version, blocked_by
FROM tasks WHERE id = %(id)s FOR UPDATE

-- name: blockers_of
SELECT blocked_by FROM tasks WHERE id = %(id)s

-- name: add_dependencies
WITH task AS (
    UPDATE tasks
    SET blocked_by = blocked_by || %(blocked_by)s::text[],
        open_blockers = open_blockers + %(open_added)s,
        updated_at = now(), version = version + 1
    WHERE id = %(id)s AND status = 'pending' AND version = %(version)s
    RETURNING id, subject, description, status, owner, lease_token, lease_expires_at,
              attempt, result, run_id, options, idempotency_key, created_at, updated_at,
              version, blocked_by
), dependencies AS (
    INSERT INTO task_dependencies (task_id, blocker_id)
    SELECT task.id, blocker FROM task, unnest(%(blocked_by)s::text[]) AS blocker
), event AS (
    INSERT INTO task_events (task_id, seq, type, actor, recorded_at, data)
    SELECT id, version, 'dependencies_added', %(actor)s, updated_at,
           json_build_object('blocked_by', %(blocked_by)s::text[])
    FROM task
)
SELECT * FROM task

-- name: get_task
SELECT id, subject, description, status, owner, lease_token, lease_expires_at, attempt,
       result, run_id, options, idempotency_key, created_at, updated_at, version, blocked_by,
       ARRAY(SELECT b.status FROM unnest(t.blocked_by) WITH ORDINALITY AS u (id, n)
             JOIN tasks b ON b.id = u.id ORDER BY u.n) AS blocker_statuses,
       (SELECT r.status FROM runs r WHERE r.id = t.run_id) AS run_status,
       lease_expires_at > now() AS lease_live
FROM tasks t WHERE id = %(id)s

-- name: list_tasks
SELECT id, subject, description, status, owner, lease_token, lease_expires_at, attempt,
       result, run_id, options, idempotency_key, created_at, updated_at, version, blocked_by,
       ARRAY(SELECT b.status FROM unnest(t.blocked_by) WITH ORDINALITY AS u (id, n)
             JOIN tasks b ON b.id = u.id ORDER BY u.n) AS blocker_statuses
FROM tasks t ORDER BY position

-- name: list_tasks_by_status
SELECT id, subject, description, status, owner, lease_token, lease_expires_at, attempt,
       result, run_id, options, idempotency_key, created_at, updated_at, version, blocked_by,
       ARRAY(SELECT b.status FROM unnest(t.blocked_by) WITH ORDINALITY AS u (id, n)
             JOIN tasks b ON b.id = u.id ORDER BY u.n) AS blocker_statuses
FROM tasks t WHERE status = %(status)s ORDER BY position

-- name: list_ready_tasks
SELECT id, subject, description, status, owner, lease_token, lease_expires_at, attempt,
       result, run_id, options, idempotency_key, created_at, updated_at, version, blocked_by,
       ARRAY(SELECT b.status FROM unnest(t.blocked_by) WITH ORDINALITY AS u (id, n)
             JOIN tasks b ON b.id = u.id ORDER BY u.n) AS blocker_statuses
FROM tasks t WHERE status = 'pending' AND open_blockers = 0 ORDER BY position

-- name: task_events
SELECT task_id, seq, type, actor, recorded_at, data
FROM task_events WHERE task_id = %(id)s ORDER BY seq

-- name: task_exists
SELECT 1 FROM tasks WHERE id = %(id)s

-- name: claim_pick_next
-- The next claimable task, in one statement: first an in-progress task whose lease
-- expired (reclaimed: task_reclaimed then task_claimed), else the oldest pending task
-- with every blocker completed (re-checked here; a pending task whose run waits for a
-- person is left alone). Each side is one index scan locking at most one row with
-- SKIP LOCKED, and the ready side runs only when no lease has expired (COALESCE
-- evaluates lazily), so exactly one row is locked and claimed.
WITH picked AS (
    SELECT t.id, t.status, t.owner, t.lease_token, t.lease_expires_at, t.version
    FROM tasks t
    WHERE t.id = COALESCE(
        (SELECT x.id FROM tasks x
         WHERE x.status = 'in_progress' AND x.lease_expires_at <= now()
         ORDER BY x.lease_expires_at
         LIMIT 1
         FOR UPDATE SKIP LOCKED),
        (SELECT r.id FROM tasks r
         WHERE r.status = 'pending' AND r.open_blockers = 0
           AND (r.run_id IS NULL OR NOT EXISTS (
                SELECT 1 FROM runs w WHERE w.id = r.run_id AND w.status = 'waiting'))
           -- a child's (or a handoff's) task is work only once its parent linked its run
           AND (r.run_id IS NOT NULL
                OR (r.options->>'child_of' IS NULL AND r.options->>'handoff_from' IS NULL))
           AND NOT EXISTS (
                SELECT 1 FROM task_dependencies d JOIN tasks b ON b.id = d.blocker_id
                WHERE d.task_id = r.id AND b.status <> 'completed')
         ORDER BY r.position
         LIMIT 1
         FOR UPDATE SKIP LOCKED))
    FOR UPDATE
)

-- name: claim_pick_by_id
-- claim_pick_next for one named task (waits for a concurrent writer of that row).
WITH picked AS (
    SELECT t.id, t.status, t.owner, t.lease_token, t.lease_expires_at, t.version
    FROM tasks t
    WHERE t.id = %(id)s
      AND ((t.status = 'pending' AND t.open_blockers = 0)
           OR (t.status = 'in_progress' AND t.lease_expires_at <= now()))
      AND (t.status = 'in_progress' OR t.run_id IS NULL
           OR NOT EXISTS (SELECT 1 FROM runs r WHERE r.id = t.run_id AND r.status = 'waiting'))
      AND NOT EXISTS (SELECT 1 FROM task_dependencies d JOIN tasks b ON b.id = d.blocker_id
                      WHERE d.task_id = t.id AND b.status <> 'completed')
    FOR UPDATE OF t
)

-- name: claim_apply
-- The rest of a claim, appended to a picker (claim_pick_next or claim_pick_by_id, each
-- a `WITH picked AS (...)`): record a reclaim, take the lease, record the claim.
, reclaimed AS (
    INSERT INTO task_events (task_id, seq, type, actor, recorded_at, data)
    SELECT id, version + 1, 'task_reclaimed', %(owner)s, now(),
           json_build_object('previous_owner', owner, 'previous_token', lease_token,
                             'lease_expired_at', keel_iso(lease_expires_at))
    FROM picked WHERE status = 'in_progress'
), claimed AS (
    UPDATE tasks t
    SET status = 'in_progress', owner = %(owner)s, lease_token = %(token)s,
        lease_expires_at = now() + make_interval(secs => %(lease)s),
        attempt = t.attempt + 1, updated_at = now(),
        version = p.version + CASE WHEN p.status = 'in_progress' THEN 2 ELSE 1 END
    FROM picked p
    WHERE t.id = p.id
    RETURNING t.id, t.subject, t.description, t.status, t.owner, t.lease_token,
              t.lease_expires_at, t.attempt, t.result, t.run_id, t.options,
              t.idempotency_key, t.created_at, t.updated_at, t.version, t.blocked_by
), event AS (
    INSERT INTO task_events (task_id, seq, type, actor, recorded_at, data)
    SELECT id, version, 'task_claimed', owner, updated_at,
           json_build_object('owner', owner, 'token', lease_token, 'attempt', attempt,
                             'lease_expires_at', keel_iso(lease_expires_at))
    FROM claimed
)
SELECT * FROM claimed

-- name: heartbeat_task
-- Extend the lease of the current, unexpired holder (owner and token) and record it.
-- Committed asynchronously (no fsync wait): a heartbeat lost in a server crash only
-- makes the lease the database granted shorter, which fences its holder sooner; no
-- one ever relied on the longer lease.
WITH task AS (
    UPDATE tasks
    SET lease_expires_at = now() + make_interval(secs => %(lease)s),
        updated_at = now(), version = version + 1
    WHERE id = %(id)s AND status = 'in_progress' AND owner = %(owner)s
      AND lease_token = %(token)s AND lease_expires_at > now()
    RETURNING id, subject, description, status, owner, lease_token, lease_expires_at,
              attempt, result, run_id, options, idempotency_key, created_at, updated_at,
              version, blocked_by
), event AS (
    INSERT INTO task_events (task_id, seq, type, actor, recorded_at, data)
    SELECT id, version, 'task_heartbeat', %(owner)s, updated_at,
           json_build_object('lease_expires_at', keel_iso(lease_expires_at))
    FROM task
)
SELECT task.* FROM task, (SELECT set_config('synchronous_commit', 'off', true)) AS async

-- name: complete_task
SELECT id, subject, description, status, owner, lease_token, lease_expires_at, attempt,
       result, run_id, options, idempotency_key, created_at, updated_at, version, blocked_by
FROM keel_complete_task(%(id)s, %(owner)s, %(token)s, %(result)s)

-- name: fail_task
WITH task AS (
    UPDATE tasks
    SET status = 'failed', result = %(reason)s, lease_token = NULL, lease_expires_at = NULL,
        updated_at = now(), version = version + 1
    WHERE id = %(id)s AND status = 'in_progress' AND owner = %(owner)s
      AND (%(token)s::text IS NULL OR lease_token = %(token)s) AND lease_expires_at > now()
    RETURNING id, subject, description, status, owner, lease_token, lease_expires_at,
              attempt, result, run_id, options, idempotency_key, created_at, updated_at,
              version, blocked_by
), event AS (
    INSERT INTO task_events (task_id, seq, type, actor, recorded_at, data)
    SELECT id, version, 'task_failed', %(owner)s, updated_at,
           json_build_object('reason', %(reason)s::text)
    FROM task
)
SELECT * FROM task

-- name: release_task
-- The holder gives the task back to pending; a reason (e.g. its run ended) is recorded.
WITH task AS (
    UPDATE tasks
    SET status = 'pending', owner = NULL, lease_token = NULL, lease_expires_at = NULL,
        updated_at = now(), version = version + 1
    WHERE id = %(id)s AND status = 'in_progress' AND owner = %(owner)s
      AND lease_token = %(token)s AND lease_expires_at > now()
    RETURNING id, subject, description, status, owner, lease_token, lease_expires_at,
              attempt, result, run_id, options, idempotency_key, created_at, updated_at,
              version, blocked_by
), event AS (
    INSERT INTO task_events (task_id, seq, type, actor, recorded_at, data)
    SELECT id, version, 'task_released', %(owner)s, updated_at,
           CASE WHEN %(reason)s::text IS NULL THEN '{}'::json
                ELSE json_build_object('reason', %(reason)s::text) END
    FROM task
)
SELECT * FROM task

-- name: link_task_run
WITH task AS (
    UPDATE tasks
    SET run_id = %(run_id)s, updated_at = now(), version = version + 1
    WHERE id = %(id)s AND status = 'in_progress' AND owner = %(owner)s
      AND lease_token = %(token)s AND lease_expires_at > now()
    RETURNING id, subject, description, status, owner, lease_token, lease_expires_at,
              attempt, result, run_id, options, idempotency_key, created_at, updated_at,
              version, blocked_by
), event AS (
    INSERT INTO task_events (task_id, seq, type, actor, recorded_at, data)
    SELECT id, version, 'run_linked', %(owner)s, updated_at,
           json_build_object('run_id', %(run_id)s::text)
    FROM task
)
SELECT * FROM task

-- name: reopen_task
WITH task AS (
    UPDATE tasks
    SET status = 'pending', owner = NULL, lease_token = NULL, lease_expires_at = NULL,
        result = NULL, updated_at = now(), version = version + 1
    WHERE id = %(id)s AND status = 'failed'
    RETURNING id, subject, description, status, owner, lease_token, lease_expires_at,
              attempt, result, run_id, options, idempotency_key, created_at, updated_at,
              version, blocked_by
), event AS (
    INSERT INTO task_events (task_id, seq, type, actor, recorded_at, data)
    SELECT id, version, 'task_reopened', %(actor)s, updated_at, '{}'::json FROM task
)
SELECT * FROM task

-- name: existing_ids
SELECT id FROM tasks WHERE id = ANY(%(ids)s::text[])

-- name: cancel_task
-- Withdraw a task for good, under the rule of keel.core.tasks.check_cancel: pending or
-- failed by anyone, in progress by its owner or by anyone once the lease lapsed. No
-- row: refused (or raced), and the caller asks why. The event names what it was.
WITH old AS (
    SELECT id, status, owner FROM tasks WHERE id = %(id)s FOR UPDATE
), task AS (
    UPDATE tasks t
    SET status = 'cancelled', result = %(reason)s, lease_token = NULL,
        lease_expires_at = NULL, updated_at = now(), version = t.version + 1
    FROM old
    WHERE t.id = old.id
      AND (old.status IN ('pending', 'failed')
           OR (old.status = 'in_progress'
               AND (old.owner = %(actor)s OR t.lease_expires_at <= now())))
    RETURNING t.id, t.subject, t.description, t.status, t.owner, t.lease_token,
              t.lease_expires_at, t.attempt, t.result, t.run_id, t.options,
              t.idempotency_key, t.created_at, t.updated_at, t.version, t.blocked_by,
              old.status AS previous_status, old.owner AS previous_owner
), event AS (
    INSERT INTO task_events (task_id, seq, type, actor, recorded_at, data)
    SELECT id, version, 'task_cancelled', %(actor)s, updated_at,
           CASE WHEN previous_status = 'in_progress'
                THEN json_build_object('reason', %(reason)s::text,
                                       'previous_status', previous_status,
                                       'previous_owner', previous_owner)
                ELSE json_build_object('reason', %(reason)s::text,
                                       'previous_status', previous_status) END
    FROM task
)
SELECT id, subject, description, status, owner, lease_token, lease_expires_at, attempt,
       result, run_id, options, idempotency_key, created_at, updated_at, version, blocked_by,
       ARRAY(SELECT b.status FROM unnest(task.blocked_by) WITH ORDINALITY AS u (id, n)
             JOIN tasks b ON b.id = u.id ORDER BY u.n) AS blocker_statuses
FROM task

-- name: tasks_held_by
-- The in-progress tasks one owner claimed (a run's claims, renewed by its heartbeat).
SELECT id, subject, description, status, owner, lease_token, lease_expires_at, attempt,
       result, run_id, options, idempotency_key, created_at, updated_at, version, blocked_by,
       ARRAY(SELECT b.status FROM unnest(t.blocked_by) WITH ORDINALITY AS u (id, n)
             JOIN tasks b ON b.id = u.id ORDER BY u.n) AS blocker_statuses
FROM tasks t WHERE status = 'in_progress' AND owner = %(owner)s ORDER BY position
