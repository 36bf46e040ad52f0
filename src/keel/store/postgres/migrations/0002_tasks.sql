-- The shared task graph: tasks, their dependencies, and each task's own history.
-- Times are the database clock (now(), one value per statement), so a task's
-- created_at / updated_at equal the recorded_at of its first / last event.

CREATE TABLE tasks (
    position bigint GENERATED ALWAYS AS IDENTITY UNIQUE,   -- the next claim takes the oldest
    id text PRIMARY KEY,
    subject text NOT NULL,
    description text NOT NULL,
    status text NOT NULL,
    owner text,
    lease_token text,
    lease_expires_at timestamptz,
    attempt integer NOT NULL,
    result text,
    run_id text,
    options json NOT NULL,              -- run options a worker uses
    idempotency_key text UNIQUE,        -- reserved for good, even after completion
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    version integer NOT NULL,           -- number of events in the task's history
    blocked_by text[] NOT NULL,         -- blockers in the order they were added
    open_blockers integer NOT NULL      -- blockers not completed (kept in each transaction)
);

-- What a claim scans: ready tasks by age, and leases by expiry. Finished tasks are in
-- neither, so a claim's cost does not grow with history, nor with tasks held by others.
CREATE INDEX tasks_ready ON tasks (position) WHERE status = 'pending' AND open_blockers = 0;
CREATE INDEX tasks_leased ON tasks (lease_expires_at) WHERE status = 'in_progress';
CREATE INDEX tasks_by_status ON tasks (status, position);

CREATE TABLE task_dependencies (
    task_id text NOT NULL REFERENCES tasks (id),
    blocker_id text NOT NULL REFERENCES tasks (id),
    PRIMARY KEY (task_id, blocker_id)
);

CREATE INDEX task_dependencies_by_blocker ON task_dependencies (blocker_id, task_id);

CREATE TABLE task_events (
    task_id text NOT NULL REFERENCES tasks (id),
    seq integer NOT NULL,               -- 1, 2, 3 … per task, no gap
    type text NOT NULL,
    actor text NOT NULL,
    recorded_at timestamptz NOT NULL,
    data json NOT NULL,
    PRIMARY KEY (task_id, seq)
);

CREATE TRIGGER task_events_append_only BEFORE UPDATE OR DELETE ON task_events
    FOR EACH ROW EXECUTE FUNCTION keel_refuse_change();
CREATE TRIGGER task_events_no_truncate BEFORE TRUNCATE ON task_events
    FOR EACH STATEMENT EXECUTE FUNCTION keel_refuse_change();

-- ISO-8601 UTC text with microseconds, as Python's datetime.fromisoformat reads it.
CREATE FUNCTION keel_iso(moment timestamptz) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN to_char(moment AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"');

-- keel_work: a task became ready (released, reopened, unblocked). A task created
-- ready is announced by the store right after its commit instead (see tasks.sql,
-- notify_work): a NOTIFY inside a transaction serialises its commit with every
-- other notifying commit, fsync included, and creation is the hot path.
CREATE FUNCTION keel_notify_ready() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('keel_work', '');
    RETURN NULL;
END
$$;

CREATE TRIGGER tasks_ready_updated AFTER UPDATE ON tasks FOR EACH ROW
    WHEN (NEW.status = 'pending' AND NEW.open_blockers = 0
          AND (OLD.status <> 'pending' OR OLD.open_blockers <> 0))
    EXECUTE FUNCTION keel_notify_ready();

-- Complete a task held by (owner, token) and unblock its dependents. Returns the
-- completed row first, then the dependents that became ready by it; no row when the
-- holder check fails (nothing changed). A function, not one statement, because each
-- of its statements takes a fresh snapshot: the dependents are read after the
-- completed row is locked, so a dependency committed by a concurrent graph change
-- (which holds a share lock on this row until it commits) is never missed.
CREATE FUNCTION keel_complete_task(
    p_id text, p_owner text, p_token text, p_result text
) RETURNS SETOF tasks LANGUAGE plpgsql AS $$
DECLARE
    done tasks;
BEGIN
    UPDATE tasks
    SET status = 'completed', result = p_result, lease_token = NULL,
        lease_expires_at = NULL, updated_at = now(), version = version + 1
    WHERE id = p_id AND status = 'in_progress' AND owner = p_owner
      AND lease_expires_at > now() AND (p_token IS NULL OR lease_token = p_token)
    RETURNING * INTO done;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    INSERT INTO task_events (task_id, seq, type, actor, recorded_at, data)
    VALUES (done.id, done.version, 'task_completed', p_owner, done.updated_at,
            json_build_object('result', p_result));
    RETURN NEXT done;
    -- Lock dependents in id order: two completions sharing dependents never deadlock.
    PERFORM 1 FROM tasks
    WHERE id IN (SELECT task_id FROM task_dependencies WHERE blocker_id = p_id)
    ORDER BY id FOR NO KEY UPDATE;
    RETURN QUERY
        WITH unblocked AS (
            UPDATE tasks t SET open_blockers = t.open_blockers - 1
            FROM task_dependencies d
            WHERE d.blocker_id = p_id AND t.id = d.task_id
            RETURNING t.*
        )
        SELECT * FROM unblocked u WHERE u.status = 'pending' AND u.open_blockers = 0
        ORDER BY u.position;
END
$$;
