-- A tamper-evident event log (keel.core.chain). Every event carries its hash, chained to
-- the previous event's; the run keeps the hash of its last event (last_hash, its head),
-- and its snapshot the hash of the event it was folded to.
--
-- Events stored before this migration are chained here, in this migration's transaction,
-- as they are found (the Python step chain_existing_events in keel.store.postgres.log,
-- with the append-only trigger off for that step only): every run is checkable from its
-- first event on, and a change made after this migration is found wherever it is.
--
-- From here on the database itself refuses an event whose seq is not its run's last
-- seq + 1 (no gap, no insert before the end) and one without a hash. The append-only
-- triggers (no UPDATE, DELETE or TRUNCATE) stay.

ALTER TABLE events ADD COLUMN hash text;
ALTER TABLE runs ADD COLUMN last_hash text;

ALTER TABLE events DISABLE TRIGGER events_append_only;

-- python: chain_existing_events

ALTER TABLE events ENABLE TRIGGER events_append_only;
ALTER TABLE events ALTER COLUMN hash SET NOT NULL;

-- Rows an INSERT processed before this one are visible here (PostgreSQL runs queries in a
-- row-level BEFORE trigger after the earlier rows of the same statement), so a step's
-- several events are checked one after the other.
CREATE FUNCTION keel_events_gapless() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    last_seq bigint;
BEGIN
    SELECT coalesce(max(seq), 0) INTO last_seq FROM events WHERE run_id = NEW.run_id;
    IF NEW.seq IS DISTINCT FROM last_seq + 1 THEN
        RAISE EXCEPTION 'events are gapless: run % ends at seq %, an insert of seq % is refused',
            NEW.run_id, last_seq, NEW.seq
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER events_gapless BEFORE INSERT ON events
    FOR EACH ROW EXECUTE FUNCTION keel_events_gapless();
