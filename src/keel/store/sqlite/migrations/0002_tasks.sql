-- The shared task graph: tasks, their dependencies, and each task's own history.
-- Times are epoch seconds (REAL) from the database clock
-- ((julianday('now') - 2440587.5) * 86400.0), read once per transaction, so a
-- task's created_at / updated_at equal the recorded_at of its first / last event.

CREATE TABLE tasks (
    position INTEGER PRIMARY KEY,      -- creation order: the next claim takes the oldest
    id TEXT NOT NULL UNIQUE,
    subject TEXT NOT NULL,
    description TEXT NOT NULL,
    status TEXT NOT NULL,
    owner TEXT,
    lease_token TEXT,
    lease_expires_at REAL,
    attempt INTEGER NOT NULL,
    result TEXT,
    run_id TEXT,
    options TEXT NOT NULL,             -- JSON: run options a worker uses
    idempotency_key TEXT UNIQUE,       -- reserved for good, even after completion
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    version INTEGER NOT NULL,          -- number of events in the task's history
    open_blockers INTEGER NOT NULL     -- blockers not completed (kept in each transaction)
);

CREATE INDEX tasks_ready ON tasks (position) WHERE status = 'pending' AND open_blockers = 0;
CREATE INDEX tasks_leased ON tasks (lease_expires_at) WHERE status = 'in_progress';
CREATE INDEX tasks_by_status ON tasks (status, position);

CREATE TABLE task_dependencies (
    task_id TEXT NOT NULL REFERENCES tasks (id),
    blocker_id TEXT NOT NULL REFERENCES tasks (id),
    position INTEGER NOT NULL,         -- order in which the blockers were added
    PRIMARY KEY (task_id, blocker_id)
) WITHOUT ROWID;

CREATE INDEX task_dependencies_by_blocker ON task_dependencies (blocker_id, task_id);

CREATE TABLE task_events (
    task_id TEXT NOT NULL REFERENCES tasks (id),
    seq INTEGER NOT NULL,              -- 1, 2, 3 … per task, no gap
    type TEXT NOT NULL,
    actor TEXT NOT NULL,
    recorded_at REAL NOT NULL,
    data TEXT NOT NULL,                -- JSON
    PRIMARY KEY (task_id, seq)
) WITHOUT ROWID;
