-- Every statement of the SQLite task graph (keel.store.sqlite.tasks speaks them).
-- Columns of a task row, in the order SQLiteTasks reads them:
--   id, subject, description, status, owner, lease_token, lease_expires_at, attempt,
--   result, run_id, options, idempotency_key, created_at, updated_at, version

-- name: now
-- The database clock in epoch seconds, read once per transaction.
SELECT ((julianday('now') - 2440587.5) * 86400.0)

-- name: get_task
SELECT id, subject, description, status, owner, lease_token, lease_expires_at, attempt,
       result, run_id, options, idempotency_key, created_at, updated_at, version
FROM tasks WHERE id = :id

-- name: task_id_by_key
SELECT id FROM tasks WHERE idempotency_key = :key

-- name: task_exists
SELECT 1 FROM tasks WHERE id = :id

-- name: existing_ids
SELECT id FROM tasks WHERE id IN (SELECT value FROM json_each(:ids))

-- name: blockers_of
-- A task's blockers in the order they were added, with their statuses.
SELECT d.blocker_id, b.status
FROM task_dependencies d JOIN tasks b ON b.id = d.blocker_id
WHERE d.task_id = :id
ORDER BY d.position

-- name: blockers_of_many
SELECT d.task_id, d.blocker_id, b.status
FROM task_dependencies d JOIN tasks b ON b.id = d.blocker_id
WHERE d.task_id IN (SELECT value FROM json_each(:ids))
ORDER BY d.task_id, d.position

-- name: insert_task
INSERT INTO tasks (id, subject, description, status, owner, lease_token, lease_expires_at,
                   attempt, result, run_id, options, idempotency_key, created_at, updated_at,
                   version, open_blockers)
VALUES (:id, :subject, :description, :status, :owner, :lease_token, :lease_expires_at,
        :attempt, :result, :run_id, :options, :idempotency_key, :created_at, :updated_at,
        :version, :open_blockers)

-- name: update_task
-- Write the fold's new row; open_blockers moves by :blockers_added (uncompleted ones).
UPDATE tasks
SET status = :status, owner = :owner, lease_token = :lease_token,
    lease_expires_at = :lease_expires_at, attempt = :attempt, result = :result,
    run_id = :run_id, updated_at = :updated_at, version = :version,
    open_blockers = open_blockers + :blockers_added
WHERE id = :id AND version = :version - 1

-- name: insert_dependency
INSERT INTO task_dependencies (task_id, blocker_id, position)
VALUES (:task_id, :blocker_id,
        (SELECT count(*) FROM task_dependencies WHERE task_id = :task_id))

-- name: insert_event
INSERT INTO task_events (task_id, seq, type, actor, recorded_at, data)
VALUES (:task_id, :seq, :type, :actor, :recorded_at, :data)

-- name: unblock_dependents
-- A blocker completed: each dependent has one open blocker fewer. Returns the
-- dependents that became ready by it.
UPDATE tasks SET open_blockers = open_blockers - 1
WHERE id IN (SELECT task_id FROM task_dependencies WHERE blocker_id = :id)
RETURNING id, status, open_blockers

-- name: list_tasks
SELECT id, subject, description, status, owner, lease_token, lease_expires_at, attempt,
       result, run_id, options, idempotency_key, created_at, updated_at, version
FROM tasks ORDER BY position

-- name: list_tasks_by_status
SELECT id, subject, description, status, owner, lease_token, lease_expires_at, attempt,
       result, run_id, options, idempotency_key, created_at, updated_at, version
FROM tasks WHERE status = :status ORDER BY position

-- name: list_ready_tasks
SELECT id, subject, description, status, owner, lease_token, lease_expires_at, attempt,
       result, run_id, options, idempotency_key, created_at, updated_at, version
FROM tasks WHERE status = 'pending' AND open_blockers = 0 ORDER BY position

-- name: task_events
SELECT task_id, seq, type, actor, recorded_at, data
FROM task_events WHERE task_id = :id ORDER BY seq

-- name: tasks_by_ids
SELECT id, subject, description, status, owner, lease_token, lease_expires_at, attempt,
       result, run_id, options, idempotency_key, created_at, updated_at, version
FROM tasks WHERE id IN (SELECT value FROM json_each(:ids)) ORDER BY position

-- name: statuses_of
SELECT id, status FROM tasks WHERE id IN (SELECT value FROM json_each(:ids))

-- name: load_task
-- A write transaction's first read: the row, the database clock (one value for the
-- whole statement) and the blockers with their statuses as JSON, in added order.
SELECT t.id, t.subject, t.description, t.status, t.owner, t.lease_token, t.lease_expires_at,
       t.attempt, t.result, t.run_id, t.options, t.idempotency_key, t.created_at,
       t.updated_at, t.version,
       ((julianday('now') - 2440587.5) * 86400.0) AS now,
       (SELECT json_group_array(json_array(blocker_id, status))
        FROM (SELECT d.blocker_id, b.status
              FROM task_dependencies d JOIN tasks b ON b.id = d.blocker_id
              WHERE d.task_id = t.id ORDER BY d.position)) AS blockers
FROM tasks t WHERE t.id = :id

-- name: claim_candidate
-- The oldest claimable task, loaded like load_task: pending with no open blocker, or
-- in progress with a lease that expired by this statement's clock.
WITH clock (now) AS (SELECT (julianday('now') - 2440587.5) * 86400.0),
pick (id, position) AS (
    SELECT id, position FROM (
        SELECT id, position FROM tasks
        WHERE status = 'pending' AND open_blockers = 0
          -- a task whose run waits for a person is not work for a claimer; the run
          -- itself is picked up by claim_next_run once the person answered
          AND (run_id IS NULL
               OR NOT EXISTS (SELECT 1 FROM runs r
                              WHERE r.id = tasks.run_id AND r.status = 'waiting'))
          -- a child's (or a handoff's) task is work only once its parent linked its run
          AND (run_id IS NOT NULL
               OR (json_extract(options, '$.child_of') IS NULL
                   AND json_extract(options, '$.handoff_from') IS NULL))
        ORDER BY position LIMIT 1)
    UNION ALL
    SELECT id, position FROM (
        SELECT id, position FROM tasks
        WHERE status = 'in_progress' AND lease_expires_at <= (SELECT now FROM clock)
        ORDER BY position LIMIT 1)
    ORDER BY position LIMIT 1)
SELECT t.id, t.subject, t.description, t.status, t.owner, t.lease_token, t.lease_expires_at,
       t.attempt, t.result, t.run_id, t.options, t.idempotency_key, t.created_at,
       t.updated_at, t.version,
       (SELECT now FROM clock) AS now,
       (SELECT json_group_array(json_array(blocker_id, status))
        FROM (SELECT d.blocker_id, b.status
              FROM task_dependencies d JOIN tasks b ON b.id = d.blocker_id
              WHERE d.task_id = t.id ORDER BY d.position)) AS blockers
FROM tasks t WHERE t.id = (SELECT id FROM pick)

-- name: id_taken
-- Whether a drawn id is in use, with the database clock for the creating transaction.
SELECT ((julianday('now') - 2440587.5) * 86400.0) AS now,
       EXISTS (SELECT 1 FROM tasks WHERE id = :id) AS taken

-- name: tasks_held_by
-- The in-progress tasks one owner claimed (a run's claims, renewed by its heartbeat).
SELECT id, subject, description, status, owner, lease_token, lease_expires_at, attempt,
       result, run_id, options, idempotency_key, created_at, updated_at, version
FROM tasks WHERE status = 'in_progress' AND owner = :owner ORDER BY position
