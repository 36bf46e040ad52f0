-- Usage figures of runs (keel.store.sqlite.stats; what they mean: keel.core.stats), from
-- the runs and their event_figures rows (migration 0006). The filters asked for are
-- appended where /* filters */ stands: runs_if_* to the runs statement, figures_if_* to
-- the others.

-- name: runs_if_run
AND id = :run_id

-- name: runs_if_since
AND created_at >= :since

-- name: runs_if_model
AND id IN (SELECT run_id FROM event_figures WHERE kind = 'run' AND name = :model)

-- name: figures_if_run
AND run_id = :run_id

-- name: figures_if_since
AND run_id IN (SELECT id FROM runs WHERE created_at >= :since)

-- name: figures_if_model
AND run_id IN (SELECT run_id FROM event_figures WHERE kind = 'run' AND name = :model)

-- name: stats_runs
-- Runs by status and by their reason's code (the text before its first colon).
SELECT status,
       CASE WHEN instr(reason, ':') > 0 THEN trim(substr(reason, 1, instr(reason, ':') - 1))
            ELSE trim(reason) END AS code,
       count(*)
FROM (SELECT status, json_extract(snapshot, '$.reason') AS reason
      FROM runs JOIN run_snapshots ON run_id = id WHERE TRUE /* filters */)
GROUP BY status, code

-- name: stats_figures
-- Per model, tool, compaction and verifier: calls, failures, timed calls, their total
-- and longest latency, tokens by kind and cost (total(): a float sum, never an integer
-- overflow).
SELECT kind, name, count(*), sum(ok = 0), count(elapsed_s), total(elapsed_s), max(elapsed_s),
       total(input_tokens), total(cached_input_tokens), total(output_tokens),
       total(reasoning_tokens), total(cost)
FROM event_figures
WHERE kind <> 'run' /* filters */
GROUP BY kind, name

-- name: stats_latencies
-- The recorded latencies of model and tool calls, for their percentiles (in any order:
-- the caller sorts each group, which is cheaper than SQLite's sorter).
SELECT kind, name, elapsed_s FROM event_figures
WHERE kind IN ('model', 'tool') AND elapsed_s IS NOT NULL /* filters */

-- name: figure_events
-- Migration 0006: the stored events that make figures (types: a JSON list), each run's
-- run_created first (its model spec names the run's model turns).
SELECT run_id, seq, type, data FROM events
WHERE type IN (SELECT value FROM json_each(:types))
ORDER BY run_id, seq
