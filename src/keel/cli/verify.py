"""``keel verify RUN_ID`` and ``keel verify --all``: check event logs against their chain.

Each run's whole log is re-hashed from its genesis hash (``keel.core.chain``): the
numbering 1..last without a gap, every event's hash, the head the run records and
the hash its snapshot records. The first bad event is named::

    event log of run_0123456789ab damaged at seq 7: its content does not match its hash …

Exit codes: 0 every log checked is intact, 1 at least one is damaged, 2 usage or
store error (unknown run, no store). An intact line ends with the head hash: kept
elsewhere, it pins the log (the chain has no key, so someone able to rewrite the
database could recompute every later hash; a recorded head tells).
"""

from __future__ import annotations

from typing import Any

import typer

from keel.cli.common import JsonOption, StoreOption, console, fail, keel_errors, print_json
from keel.cli.runs import reading
from keel.store.base import LogCheck

INTACT = 0
DAMAGED = 1


def register(app: typer.Typer) -> None:
    """Add ``keel verify`` to ``app``."""
    app.command("verify")(verify_command)


@keel_errors
def verify_command(
    run_id: str | None = typer.Argument(None, help="The run whose log to check."),
    every: bool = typer.Option(False, "--all", help="Check every run in the store."),
    as_json: bool = JsonOption,
    store: str | None = StoreOption,
) -> None:
    """Check a run's event log (or every run's): numbering, hash chain, recorded head.

    Exit 0 when intact, 1 when damaged (the first bad event is named), 2 on a usage
    or store error.
    """
    if every == (run_id is not None):
        fail("name one run (keel verify RUN_ID) or use --all, not both")
    with reading(store) as st:
        run_ids = st.run_ids() if every else [str(run_id)]
        checks = []
        for rid in run_ids:
            check = st.verify_log(rid)
            checks.append(check)
            if not as_json:
                console.print(describe(check), highlight=False, soft_wrap=True)
    damaged = sum(1 for c in checks if not c.intact)
    if as_json:
        reports = [report(c) for c in checks]
        print_json(reports if every else reports[0])
    elif every:
        console.print(
            f"{len(checks)} runs: {len(checks) - damaged} intact, {damaged} damaged",
            highlight=False,
        )
    raise typer.Exit(DAMAGED if damaged else INTACT)


def describe(check: LogCheck) -> str:
    """One line: intact with its event count and head hash, or the damage."""
    if check.damage is not None:
        return str(check.damage)
    return f"event log of {check.run_id} intact: {check.events} events, head {check.head_hash}"


def report(check: LogCheck) -> dict[str, Any]:
    damage = check.damage
    return {
        "run_id": check.run_id,
        "intact": check.intact,
        "events": check.events,
        "head_hash": check.head_hash if damage is None else None,
        "damaged_at": None if damage is None else damage.seq,
        "detail": None if damage is None else damage.detail,
        "message": describe(check),
    }
