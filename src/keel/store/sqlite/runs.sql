-- Runs, events, run leases and artifacts of the SQLite store.
-- NOW below is the database clock in epoch seconds:
-- ((julianday('now') - 2440587.5) * 86400.0)

-- name: find_run_by_key
SELECT id FROM runs WHERE idempotency_key = ?

-- name: run_exists
SELECT 1 FROM runs WHERE id = ?

-- name: insert_run
INSERT INTO runs (
    id, parent_id, task_id, status, goal, workspace, idempotency_key,
    last_seq, last_hash, created_at, updated_at, creator
) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)

-- name: insert_snapshot
INSERT INTO run_snapshots (run_id, snapshot) VALUES (?, ?)

-- name: rewrite_snapshot
-- An upsert: a snapshot row missing from a damaged file is written again.
INSERT INTO run_snapshots (run_id, snapshot) VALUES (?, ?)
ON CONFLICT (run_id) DO UPDATE SET snapshot = excluded.snapshot

-- name: insert_event
-- The database refuses a seq that is not the run's last + 1, and a row without its hash.
INSERT INTO events (run_id, seq, event_id, type, recorded_at, data, hash)
VALUES (?, ?, ?, ?, ?, ?, ?)

-- name: run_head
-- What an append needs to decide: the sequence, and whether a lease token still holds.
SELECT last_seq, lease_token,
       lease_expires_at > ((julianday('now') - 2440587.5) * 86400.0) AS lease_live,
       lease_owner
FROM runs WHERE id = ?

-- name: run_snapshot
-- A run row without its snapshot row (a damaged file) reads as an empty snapshot: not JSON.
SELECT coalesce(s.snapshot, ''), r.last_seq, r.last_hash
FROM runs r LEFT JOIN run_snapshots s ON s.run_id = r.id
WHERE r.id = ?

-- name: advance_run
-- One step's head move, only if the writer saw the last sequence and its chain hash and
-- (when it writes under a lease) still holds that lease; 0 rows changed means refused.
UPDATE runs SET status = ?, last_seq = ?, last_hash = ?, updated_at = ?
WHERE id = ? AND last_seq = ? AND last_hash IS ?
  AND (? IS NULL
       OR (lease_token = ? AND lease_expires_at > ((julianday('now') - 2440587.5) * 86400.0)))

-- name: last_seq
SELECT last_seq FROM runs WHERE id = ?

-- name: list_runs
SELECT id, last_seq FROM runs ORDER BY created_at DESC, rowid DESC LIMIT ?

-- name: child_runs
-- A run's direct children, oldest first (index runs_by_parent).
SELECT id, last_seq FROM runs WHERE parent_id = ? ORDER BY created_at, rowid

-- name: list_runs_by_status
SELECT id, last_seq FROM runs WHERE status = ? ORDER BY created_at DESC, rowid DESC LIMIT ?

-- name: read_events
-- From seq ? on, inclusive: a reader starts at the event before the ones it wants, whose
-- stored hash the next one chains to (keel.store.sqlite.log).
SELECT seq, event_id, type, recorded_at, data, hash FROM events
WHERE run_id = ? AND seq >= ? ORDER BY seq LIMIT ?

-- name: run_lease
SELECT lease_owner, lease_token, lease_expires_at,
       lease_expires_at > ((julianday('now') - 2440587.5) * 86400.0) AS lease_live,
       lease_host, lease_boot_id, lease_pid, lease_pid_start, lease_pid_ns
FROM runs WHERE id = ?

-- name: take_run_lease
-- The holder's process (host, boot, pid, start ticks, pid namespace) goes with the lease.
UPDATE runs
SET lease_owner = ?, lease_token = ?,
    lease_expires_at = ((julianday('now') - 2440587.5) * 86400.0) + ?,
    lease_host = ?, lease_boot_id = ?, lease_pid = ?, lease_pid_start = ?, lease_pid_ns = ?
WHERE id = ?
RETURNING lease_expires_at

-- name: renew_run_lease
UPDATE runs
SET lease_expires_at = ((julianday('now') - 2440587.5) * 86400.0) + ?
WHERE id = ? AND lease_token = ?
  AND lease_expires_at > ((julianday('now') - 2440587.5) * 86400.0)
RETURNING lease_expires_at

-- name: release_run_lease
UPDATE runs SET lease_owner = NULL, lease_token = NULL, lease_expires_at = 0,
    lease_host = NULL, lease_boot_id = NULL, lease_pid = NULL, lease_pid_start = NULL,
    lease_pid_ns = NULL
WHERE id = ? AND lease_token = ?

-- name: next_claimable_run
-- The oldest queued run nobody holds, or a running/verifying run nobody holds any more: its
-- holder's lease ran out (it died) or was released (Ctrl-C, a graceful stop, or the run
-- waited for a person who has now answered). A run just created to be driven by its own
-- process has no lease at all (NULL) and is not taken from under it. A queued run with a
-- task (a child run) is never picked: it is executed by whoever claims its task.
SELECT id FROM runs
WHERE (status = 'queued' AND task_id IS NULL
       AND (lease_expires_at IS NULL
            OR lease_expires_at <= ((julianday('now') - 2440587.5) * 86400.0)))
   OR (status IN ('running', 'verifying')
       AND lease_expires_at <= ((julianday('now') - 2440587.5) * 86400.0))
ORDER BY created_at, rowid
LIMIT 1

-- name: insert_artifact
INSERT INTO artifacts (id, run_id, name, size, content, created_at) VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT (id) DO NOTHING

-- name: artifact_meta
SELECT id, run_id, name, size, created_at FROM artifacts WHERE id = ?

-- name: artifact_with_content
SELECT id, run_id, name, size, created_at, content FROM artifacts WHERE id = ?

-- name: insert_figures
-- A step's rows for `keel stats` (keel.store.stats.figure_rows), with its events.
INSERT INTO event_figures (run_id, seq, item, kind, name, ok, elapsed_s, input_tokens,
                           cached_input_tokens, output_tokens, reasoning_tokens, cost)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
