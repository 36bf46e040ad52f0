-- What `keel stats` reads: one narrow row per run, model turn, tool outcome, compaction
-- summary, verification record and sign-off (keel.store.stats.figure_rows says which
-- and what they hold), written by the store in the statement that appends the event.
-- Aggregating these instead of the events' payloads keeps `keel stats` over 10,000 runs
-- well under a second. Events are append-only: these rows never change. Keyed by run,
-- like the events, so an append writes beside its run's earlier rows.

CREATE TABLE event_figures (
    run_id text NOT NULL,
    seq bigint NOT NULL,                -- the event's
    item integer NOT NULL,              -- a verification record's place; else 0
    kind text NOT NULL,                 -- run | model | tool | compaction | verifier
    name text NOT NULL,                 -- model spec, tool, verifier; '-' for none
    ok boolean NOT NULL,                -- false: a tool_failed, a verifier that did not pass
    elapsed_s double precision,         -- NULL: the event recorded no latency
    input_tokens bigint,
    cached_input_tokens bigint,
    output_tokens bigint,
    reasoning_tokens bigint,
    cost double precision,
    PRIMARY KEY (run_id, seq, item)
);

-- The --model filter: the runs of one spec (one row per run: written once, at creation).
CREATE INDEX event_figures_run_models ON event_figures (name) WHERE kind = 'run';

-- The figures of the events stored before this migration, made by the same code.
-- python: backfill_event_figures
