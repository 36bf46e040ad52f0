-- Runs, their append-only event log, and their artifacts (PostgreSQL dialect).
-- Lease times are the database clock (now()); event times are the writer's UTC clock,
-- as on SQLite. JSON is stored as `json` (verbatim text, validated), not jsonb: jsonb
-- refuses \u0000, which tool output may contain.

CREATE TABLE runs (
    position bigint GENERATED ALWAYS AS IDENTITY UNIQUE,   -- creation order
    id text PRIMARY KEY,
    parent_id text REFERENCES runs (id),
    task_id text,
    status text NOT NULL,
    goal text NOT NULL,
    workspace text NOT NULL,
    idempotency_key text UNIQUE,
    snapshot json NOT NULL,             -- RunState.to_dict(): the fold of the events
    last_seq bigint NOT NULL,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    lease_owner text,
    lease_token text,
    lease_expires_at timestamptz
);

CREATE INDEX runs_by_status ON runs (status, position);
CREATE INDEX runs_by_parent ON runs (parent_id) WHERE parent_id IS NOT NULL;
-- What claim_next_run scans: queued runs and live ones whose lease may lapse.
CREATE INDEX runs_claimable ON runs (position) WHERE status IN ('queued', 'running', 'verifying');

CREATE TABLE events (
    run_id text NOT NULL REFERENCES runs (id),
    seq bigint NOT NULL,
    event_id text NOT NULL UNIQUE,
    type text NOT NULL,
    recorded_at timestamptz NOT NULL,
    data json NOT NULL,
    PRIMARY KEY (run_id, seq)
);

CREATE FUNCTION keel_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only: % is refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'restrict_violation';
END
$$;

CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION keel_refuse_change();
CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events
    FOR EACH STATEMENT EXECUTE FUNCTION keel_refuse_change();

-- NOTIFY keel_work: a run became claimable (queued, or its lease was given back). keel_events ("run_id:last_seq", for followers) is sent by the store right after
-- each append commits (runs.sql, notify_events), outside the append's transaction: a
-- NOTIFY inside it would serialise every append's commit, fsync included.
CREATE FUNCTION keel_notify_run() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.lease_token IS NULL AND (
           (NEW.status = 'queued' AND (TG_OP = 'INSERT' OR OLD.status <> 'queued'))
           OR (TG_OP = 'UPDATE' AND OLD.lease_token IS NOT NULL
               AND NEW.status IN ('queued', 'running', 'verifying'))) THEN
        PERFORM pg_notify('keel_work', '');
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER runs_notify AFTER INSERT OR UPDATE ON runs
    FOR EACH ROW EXECUTE FUNCTION keel_notify_run();

CREATE TABLE artifacts (
    id text PRIMARY KEY,                -- 'art_' + sha256 hex prefix of content
    run_id text NOT NULL REFERENCES runs (id),
    name text NOT NULL,
    size bigint NOT NULL,
    content bytea NOT NULL,
    created_at timestamptz NOT NULL
);

CREATE INDEX artifacts_by_run ON artifacts (run_id);
