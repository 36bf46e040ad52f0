-- Keel as a service (keel serve).
--
-- runs.creator: who created a run ("token:NAME" through the API; NULL from the CLI and
-- for every run stored before this migration), copied from its options at create_run.
-- The paging indexes serve page_runs: newest first by (created_at, id), alone or after
-- an equality on status, creator or parent (keyset paging: a page costs its size).
--
-- api_tokens: the API's bearer tokens by name. Only a token's SHA-256 (hex) is kept,
-- never the token. A live name is unique; a revoked one may be reused (its row is
-- replaced). Times are the database clock.

ALTER TABLE runs ADD COLUMN creator text;

CREATE INDEX runs_page ON runs (created_at, id);
CREATE INDEX runs_page_by_status ON runs (status, created_at, id);
CREATE INDEX runs_page_by_creator ON runs (creator, created_at, id) WHERE creator IS NOT NULL;
CREATE INDEX runs_page_by_parent ON runs (parent_id, created_at, id) WHERE parent_id IS NOT NULL;

CREATE TABLE api_tokens (
    name text PRIMARY KEY,
    token_hash text NOT NULL UNIQUE,    -- sha256 hex of the token
    created_at timestamptz NOT NULL,
    revoked_at timestamptz,             -- NULL: live
    last_used_at timestamptz
);
