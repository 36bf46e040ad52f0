-- A tamper-evident event log (keel.core.chain). Every event carries its hash, chained to
-- the previous event's; the run keeps the hash of its last event (last_hash, its head),
-- and its snapshot the hash of the event it was folded to.
--
-- Events stored before this migration are chained here, in this migration's transaction,
-- as they are found (the Python step chain_existing_events in keel.store.sqlite.log, with
-- the UPDATE trigger off for that step only): every run is checkable from its first
-- event on, and a change made after this migration is found wherever it is.
--
-- From here on the database itself refuses an event whose seq is not its run's last
-- seq + 1 (no gap, no insert before the end) and one without a hash. The append-only
-- triggers (no UPDATE, no DELETE) stay.

ALTER TABLE events ADD COLUMN hash TEXT;
ALTER TABLE runs ADD COLUMN last_hash TEXT;

DROP TRIGGER events_refuse_update;

-- python: chain_existing_events

CREATE TRIGGER events_refuse_update BEFORE UPDATE ON events
BEGIN
    SELECT RAISE(ABORT, 'events are append-only: UPDATE is refused');
END;

-- One trigger for both rules: each trigger costs every insert a few microseconds.
CREATE TRIGGER events_gapless BEFORE INSERT ON events
WHEN NEW.hash IS NULL
  OR NEW.seq IS NOT (SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE run_id = NEW.run_id)
BEGIN
    SELECT RAISE(ABORT, 'events are gapless and chained: an insert needs its run''s last seq + 1 and a hash');
END;
