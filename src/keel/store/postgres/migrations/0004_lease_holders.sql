-- Who holds a run lease, so a resume on the same machine can tell whether that
-- process still runs (keel.runtime.takeover): host name, boot id, process id, the
-- process's start in clock ticks since boot (a reused pid has another), pid namespace.
-- NULL: not recorded (leases taken before this migration, or by a caller that gave none).

ALTER TABLE runs
    ADD COLUMN lease_host text,
    ADD COLUMN lease_boot_id text,
    ADD COLUMN lease_pid integer,
    ADD COLUMN lease_pid_start bigint,
    ADD COLUMN lease_pid_ns text;
