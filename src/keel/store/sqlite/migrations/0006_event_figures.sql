-- What `keel stats` reads: one narrow row per run, model turn, tool outcome, compaction
-- summary, verification record and sign-off (keel.store.stats.figure_rows says which
-- and what they hold), written by the store in the transaction that appends the event.
-- Aggregating these instead of the events' payloads makes `keel stats` over 10,000 runs
-- a fraction of a second instead of seconds. Events are append-only: rows never change.
--
-- Keyed by run, like the events: a step's rows land beside its run's earlier ones, so an
-- append dirties the page it was going to write anyway. (Ordering them by model or by
-- latency instead would spare `keel stats` a sort but scatter every append over the
-- table: measured, several times the cost of the step's events.)

CREATE TABLE event_figures (
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL,              -- the event's
    item INTEGER NOT NULL,             -- a verification record's place; else 0
    kind TEXT NOT NULL,                -- run | model | tool | compaction | verifier
    name TEXT NOT NULL,                -- model spec, tool, verifier; '-' for none
    ok INTEGER NOT NULL,               -- 0: a tool_failed, a verifier that did not pass
    elapsed_s REAL,                    -- NULL: the event recorded no latency
    input_tokens INTEGER,
    cached_input_tokens INTEGER,
    output_tokens INTEGER,
    reasoning_tokens INTEGER,
    cost REAL,
    PRIMARY KEY (run_id, seq, item)
) WITHOUT ROWID;

-- The --model filter: the runs of one spec (one row per run: written once, at creation).
CREATE INDEX event_figures_run_models ON event_figures (name) WHERE kind = 'run';

-- The figures of the events stored before this migration, made by the same code.
-- python: backfill_event_figures
