-- Runs, their append-only event log, and their artifacts.
-- Times: *_at TEXT columns are ISO-8601 UTC; lease_expires_at is epoch seconds
-- from the database clock ((julianday('now') - 2440587.5) * 86400.0).

CREATE TABLE runs (
    id TEXT PRIMARY KEY,
    parent_id TEXT,
    task_id TEXT,
    status TEXT NOT NULL,
    goal TEXT NOT NULL,
    workspace TEXT NOT NULL,
    idempotency_key TEXT UNIQUE,
    snapshot TEXT NOT NULL,            -- JSON of RunState.to_dict(), the fold of the events
    last_seq INTEGER NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    lease_owner TEXT,
    lease_token TEXT,
    lease_expires_at REAL
);

CREATE INDEX runs_by_status ON runs (status, created_at);
CREATE INDEX runs_by_created ON runs (created_at);
CREATE INDEX runs_by_parent ON runs (parent_id) WHERE parent_id IS NOT NULL;

CREATE TABLE events (
    run_id TEXT NOT NULL REFERENCES runs (id),
    seq INTEGER NOT NULL,
    event_id TEXT NOT NULL UNIQUE,
    type TEXT NOT NULL,
    recorded_at TEXT NOT NULL,
    data TEXT NOT NULL,                -- JSON object
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;

CREATE TRIGGER events_refuse_update BEFORE UPDATE ON events
BEGIN
    SELECT RAISE(ABORT, 'events are append-only: UPDATE is refused');
END;

CREATE TRIGGER events_refuse_delete BEFORE DELETE ON events
BEGIN
    SELECT RAISE(ABORT, 'events are append-only: DELETE is refused');
END;

CREATE TABLE artifacts (
    id TEXT PRIMARY KEY,               -- 'art_' + sha256 hex prefix of content
    run_id TEXT NOT NULL REFERENCES runs (id),
    name TEXT NOT NULL,
    size INTEGER NOT NULL,
    content BLOB NOT NULL,
    created_at TEXT NOT NULL
);

CREATE INDEX artifacts_by_run ON artifacts (run_id);
