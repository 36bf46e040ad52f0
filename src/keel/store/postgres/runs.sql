-- Runs, events, run leases and artifacts of the PostgreSQL store (keel.store.postgres.runs).
-- Lease times are now(): the database clock, one value per statement.

-- name: insert_run
-- A new run and its run_created event (seq 1) in one statement. With a used
-- idempotency key nothing is inserted and no row comes back.
WITH run AS (
    INSERT INTO runs (id, parent_id, task_id, status, goal, workspace, idempotency_key,
                      snapshot, last_seq, last_hash, created_at, updated_at, creator)
    VALUES (%(id)s, %(parent_id)s, %(task_id)s, %(status)s, %(goal)s, %(workspace)s,
            %(key)s, %(snapshot)s, 1, %(hash)s, %(at)s, %(at)s, %(creator)s)
    ON CONFLICT DO NOTHING
    RETURNING id
),
figures AS (  -- the run's row for `keel stats` (keel.store.stats.figure_rows)
    INSERT INTO event_figures (run_id, seq, item, kind, name, ok)
    SELECT run.id, 1, 0, 'run', %(spec)s, true FROM run
)
INSERT INTO events (run_id, seq, event_id, type, recorded_at, data, hash)
SELECT run.id, 1, %(event_id)s, 'run_created', %(at)s, %(data)s::json, %(hash)s FROM run
RETURNING run_id

-- name: find_run_by_key
SELECT id FROM runs WHERE idempotency_key = %(key)s

-- name: run_state
-- The snapshot only when the caller's cached state is not already at last_seq, with the
-- rows a reader checks (keel.store.logcheck): from the event before the snapshot's on.
SELECT r.last_seq, r.last_hash,
       CASE WHEN r.last_seq = %(cached_seq)s THEN NULL ELSE r.snapshot END,
       CASE WHEN r.last_seq = %(cached_seq)s THEN NULL ELSE
       (SELECT json_agg(json_build_array(
                e.seq, e.event_id, e.type,
                to_char(e.recorded_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'),
                e.data::text, e.hash) ORDER BY e.seq)
        FROM events e
        WHERE e.run_id = r.id
          AND e.seq >= greatest(least(r.last_seq, (r.snapshot->>'last_seq')::bigint) - 1, 1))
       END
FROM runs r WHERE r.id = %(id)s

-- name: append_events
-- Write one step: the folded snapshot and the events, only if the sequence, the chain
-- hash the step's first event chains to and the lease token (when given) still hold.
-- No row back means nothing was written.
WITH head AS (
    UPDATE runs
    SET snapshot = %(snapshot)s, status = %(status)s, last_seq = %(last_seq)s,
        last_hash = %(last_hash)s, updated_at = %(at)s
    WHERE id = %(id)s AND last_seq = %(expected)s
      AND last_hash IS NOT DISTINCT FROM %(base_hash)s::text
      AND (%(token)s::text IS NULL
           OR (lease_token = %(token)s AND lease_expires_at > now()))
    RETURNING id
),
figures AS (  -- the step's rows for `keel stats` (keel.store.stats.figure_rows)
    INSERT INTO event_figures (run_id, seq, item, kind, name, ok, elapsed_s, input_tokens,
                               cached_input_tokens, output_tokens, reasoning_tokens, cost)
    SELECT head.id, f.*
    FROM head, unnest(%(f_seqs)s::bigint[], %(f_items)s::integer[], %(f_kinds)s::text[],
                      %(f_names)s::text[], %(f_oks)s::boolean[], %(f_elapsed)s::float8[],
                      %(f_input)s::bigint[], %(f_cached)s::bigint[], %(f_output)s::bigint[],
                      %(f_reasoning)s::bigint[], %(f_costs)s::float8[]) AS f
)
INSERT INTO events (run_id, seq, event_id, type, recorded_at, data, hash)
SELECT head.id, e.seq, e.event_id, e.type, e.recorded_at, e.data::json, e.hash
FROM head, unnest(%(seqs)s::bigint[], %(event_ids)s::text[], %(types)s::text[],
                  %(ats)s::timestamptz[], %(datas)s::text[], %(hashes)s::text[])
           AS e (seq, event_id, type, recorded_at, data, hash)
ORDER BY e.seq
RETURNING seq

-- name: notify_events
-- After an append commits: wake followers. Sent in the append's pipeline as its own
-- transaction, committed without waiting for fsync (a lost wake-up only delays a
-- follower to its next poll).
SELECT pg_notify('keel_events', %(id)s || ':' || %(last_seq)s),
       set_config('synchronous_commit', 'off', true)

-- name: run_head
-- Why an append was refused: the sequence and whether the token still holds.
SELECT last_seq, lease_token, lease_expires_at > now(), lease_owner
FROM runs WHERE id = %(id)s

-- name: list_runs
-- Each run's head and snapshot with the rows a reader checks (as run_state).
SELECT r.id, r.last_seq, r.last_hash, r.snapshot,
       (SELECT json_agg(json_build_array(
                e.seq, e.event_id, e.type,
                to_char(e.recorded_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'),
                e.data::text, e.hash) ORDER BY e.seq)
        FROM events e
        WHERE e.run_id = r.id
          AND e.seq >= greatest(least(r.last_seq, (r.snapshot->>'last_seq')::bigint) - 1, 1))
FROM runs r ORDER BY r.position DESC LIMIT %(limit)s

-- name: list_runs_by_status
SELECT r.id, r.last_seq, r.last_hash, r.snapshot,
       (SELECT json_agg(json_build_array(
                e.seq, e.event_id, e.type,
                to_char(e.recorded_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'),
                e.data::text, e.hash) ORDER BY e.seq)
        FROM events e
        WHERE e.run_id = r.id
          AND e.seq >= greatest(least(r.last_seq, (r.snapshot->>'last_seq')::bigint) - 1, 1))
FROM runs r WHERE r.status = %(status)s ORDER BY r.position DESC LIMIT %(limit)s

-- name: child_runs
-- A run's direct children, oldest first (index runs_by_parent), each with the rows a
-- reader checks (as run_state).
SELECT r.id, r.last_seq, r.last_hash, r.snapshot,
       (SELECT json_agg(json_build_array(
                e.seq, e.event_id, e.type,
                to_char(e.recorded_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'),
                e.data::text, e.hash) ORDER BY e.seq)
        FROM events e
        WHERE e.run_id = r.id
          AND e.seq >= greatest(least(r.last_seq, (r.snapshot->>'last_seq')::bigint) - 1, 1))
FROM runs r WHERE r.parent_id = %(id)s ORDER BY r.position

-- name: run_exists
SELECT 1 FROM runs WHERE id = %(id)s

-- name: last_seq
SELECT last_seq FROM runs WHERE id = %(id)s

-- name: run_lease
SELECT lease_owner, lease_token, lease_expires_at, lease_expires_at > now(),
       lease_host, lease_boot_id, lease_pid, lease_pid_start, lease_pid_ns
FROM runs WHERE id = %(id)s

-- name: acquire_run_lease
-- Take the lease if it is free or expired, or if it is still the lease the caller found
-- held by a dead process (%(replacing)s, its token); no row back if someone else holds it.
-- The holder's process (host, boot, pid, start ticks, pid namespace) goes with the lease.
UPDATE runs
SET lease_owner = %(owner)s, lease_token = %(token)s,
    lease_expires_at = now() + make_interval(secs => %(ttl)s),
    lease_host = %(host)s, lease_boot_id = %(boot_id)s, lease_pid = %(pid)s,
    lease_pid_start = %(pid_start)s, lease_pid_ns = %(pid_ns)s
WHERE id = %(id)s
  AND (lease_token IS NULL OR lease_expires_at <= now() OR lease_token = %(replacing)s::text)
RETURNING lease_expires_at

-- name: renew_run_lease
UPDATE runs SET lease_expires_at = now() + make_interval(secs => %(ttl)s)
WHERE id = %(id)s AND lease_token = %(token)s AND lease_expires_at > now()
RETURNING lease_expires_at

-- name: release_run_lease
-- Released = expired long ago (not NULL): a worker may now take the run over, while a
-- run just created for its own process to drive (no lease yet, NULL) is left alone.
UPDATE runs SET lease_owner = NULL, lease_token = NULL, lease_expires_at = 'epoch',
    lease_host = NULL, lease_boot_id = NULL, lease_pid = NULL, lease_pid_start = NULL,
    lease_pid_ns = NULL
WHERE id = %(id)s AND lease_token = %(token)s

-- name: claim_next_run
-- Lease the oldest queued run nobody holds, or a running/verifying run nobody holds any
-- more (its lease ran out or was released): one row, locked with SKIP LOCKED so
-- concurrent claimers take others. A queued run with a task (a child run) is never
-- picked: it is executed by whoever claims its task.
WITH picked AS (
    SELECT id FROM runs
    WHERE status IN ('queued', 'running', 'verifying')
      AND ((status = 'queued' AND task_id IS NULL
            AND (lease_expires_at IS NULL OR lease_expires_at <= now()))
           OR (status IN ('running', 'verifying') AND lease_expires_at <= now()))
    ORDER BY position
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
UPDATE runs r
SET lease_owner = %(owner)s, lease_token = %(token)s,
    lease_expires_at = now() + make_interval(secs => %(ttl)s),
    lease_host = %(host)s, lease_boot_id = %(boot_id)s, lease_pid = %(pid)s,
    lease_pid_start = %(pid_start)s, lease_pid_ns = %(pid_ns)s
FROM picked
WHERE r.id = picked.id
RETURNING r.id, r.last_seq, r.snapshot, r.lease_expires_at

-- name: put_artifact
-- Content-addressed: equal bytes keep the first put's row.
WITH added AS (
    INSERT INTO artifacts (id, run_id, name, size, content, created_at)
    VALUES (%(id)s, %(run_id)s, %(name)s, %(size)s, %(content)s, now())
    ON CONFLICT (id) DO NOTHING
    RETURNING id, run_id, name, size, created_at
)
SELECT * FROM added
UNION ALL
SELECT id, run_id, name, size, created_at FROM artifacts
WHERE id = %(id)s AND NOT EXISTS (SELECT 1 FROM added)

-- name: artifact_with_content
SELECT id, run_id, name, size, created_at, content FROM artifacts WHERE id = %(id)s
