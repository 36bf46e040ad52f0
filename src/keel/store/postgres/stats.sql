-- Usage figures of runs (keel.store.postgres.stats; what they mean: keel.core.stats), from
-- the runs and their event_figures rows (migration 0006). The filters asked for are
-- appended where /* filters */ stands: runs_if_* to the runs statement, figures_if_* to
-- the figures statement.

-- name: runs_if_run
AND id = %(run_id)s

-- name: runs_if_since
AND created_at >= %(since)s

-- name: runs_if_model
AND id IN (SELECT run_id FROM event_figures WHERE kind = 'run' AND name = %(model)s)

-- name: figures_if_run
AND run_id = %(run_id)s

-- name: figures_if_since
AND run_id IN (SELECT id FROM runs WHERE created_at >= %(since)s)

-- name: figures_if_model
AND run_id IN (SELECT run_id FROM event_figures WHERE kind = 'run' AND name = %(model)s)

-- name: stats_snapshot
-- Both statements read one snapshot of the database.
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY

-- name: stats_runs
-- Runs by status and by their reason's code (the text before its first colon). The
-- snapshot is `json`, which keeps a \u0000 that every json operator refuses: it is
-- read with that escape as \u0001 (only digits inside a string change, so the text
-- stays JSON of the same shape).
SELECT status, btrim(split_part(reason, ':', 1), ' ') AS code, count(*)
FROM (SELECT status,
             CASE WHEN strpos(snapshot::text, '\u0000') > 0
                  THEN replace(snapshot::text, '\u0000', '\u0001')::json
                  ELSE snapshot END ->> 'reason' AS reason
      FROM runs WHERE TRUE /* filters */) AS chosen
GROUP BY status, code

-- name: stats_figures
-- Per model, tool, compaction and verifier: calls, failures, timed calls, their total
-- and longest latency, tokens by kind, cost, and p50, p95 and p99 latency.
-- percentile_disc is the nearest rank (the first value whose rank reaches ceil(p * n)):
-- keel.core.stats.percentile_rank, which the SQLite store computes in Python.
SELECT kind, name, count(*), count(*) FILTER (WHERE NOT ok), count(elapsed_s),
       coalesce(sum(elapsed_s), 0), max(elapsed_s),
       coalesce(sum(input_tokens), 0), coalesce(sum(cached_input_tokens), 0),
       coalesce(sum(output_tokens), 0), coalesce(sum(reasoning_tokens), 0),
       coalesce(sum(cost), 0),
       percentile_disc(0.5) WITHIN GROUP (ORDER BY elapsed_s),
       percentile_disc(0.95) WITHIN GROUP (ORDER BY elapsed_s),
       percentile_disc(0.99) WITHIN GROUP (ORDER BY elapsed_s)
FROM event_figures
WHERE kind <> 'run' /* filters */
GROUP BY kind, name

-- name: figure_events
-- Migration 0006: the stored events that make figures, each run's run_created first
-- (its model spec names the run's model turns). Data as text: json_in keeps \u0000.
SELECT run_id, seq, type, data::text FROM events
WHERE type = ANY(%(types)s)
ORDER BY run_id, seq

-- name: insert_figures
-- Migration 0006: rows of the events stored before it.
INSERT INTO event_figures (run_id, seq, item, kind, name, ok, elapsed_s, input_tokens,
                           cached_input_tokens, output_tokens, reasoning_tokens, cost)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
