-- A run's snapshot (JSON of RunState.to_dict(): the fold of its events up to the seq it
-- names) in a table of its own, written only when the snapshot is rewritten.
--
-- In the runs row, every append's UPDATE of the head (status, last_seq, last_hash) had to
-- rebuild a record holding the snapshot, and SQLite walks a record's overflow pages to
-- rewrite it: the cost of each step grew with the run's state (a run that wrote 1,000
-- files holds 85 kB of changed-file hashes; measured, its steps' UPDATE took 36 us at
-- 1,500 steps against 25 us at 300) and every commit wrote one more page to the WAL.
-- Now the head's row stays small whatever the run holds.

CREATE TABLE run_snapshots (
    run_id TEXT PRIMARY KEY REFERENCES runs (id),
    snapshot TEXT NOT NULL
);

INSERT INTO run_snapshots (run_id, snapshot) SELECT id, snapshot FROM runs;

ALTER TABLE runs DROP COLUMN snapshot;
