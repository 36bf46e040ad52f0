"""``keel gc``: remove the isolated workspaces a crash left behind (``keel.runtime.gc``).

Prints one line per workspace removed (and, with ``--dry-run``, per one it would
remove), then the workspaces kept because their runs are live; ``--json`` prints the
report as one object: ``{"removed": [...], "kept": [...], "problems": [...]}``, each
workspace as ``{path, run_id, task_id, why}``. Exit 0; 2 on a usage or store error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from keel.cli.common import (
    JsonOption,
    StoreOption,
    console,
    err_console,
    keel_errors,
    print_json,
    shown,
)
from keel.cli.runs import reading

if TYPE_CHECKING:
    from keel.runtime.gc import Workspace


def register(app: typer.Typer) -> None:
    """Add ``keel gc`` to ``app``."""
    app.command("gc")(gc_command)


@keel_errors
def gc_command(
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Only say what would be removed; remove nothing."
    ),
    as_json: bool = JsonOption,
    store: str | None = StoreOption,
) -> None:
    """Remove the isolated workspaces (git worktrees or copies) of runs that ended."""
    # imported here, not at every `keel` start: keel.runtime.gc loads the worktree code
    from keel.runtime.gc import collect_workspaces  # noqa: PLC0415

    with reading(store) as st:
        report = collect_workspaces(st, dry_run=dry_run)
    if as_json:
        print_json({"dry_run": dry_run, **report.to_dict()})
        return
    verb = "would remove" if dry_run else "removed"
    for ws in report.removed:
        console.print(f"{verb} {_line(ws)}", highlight=False, soft_wrap=True)
    for ws in report.kept:
        console.print(f"kept {_line(ws)}", highlight=False, soft_wrap=True)
    for problem in report.problems:
        err_console.print(f"warning: {shown(problem)}", highlight=False, soft_wrap=True)
    if not report.removed:
        err_console.print("no isolated workspace to remove")


def _line(ws: Workspace) -> str:
    owner = ", ".join(
        part
        for part in (
            f"run {ws.run_id}" if ws.run_id else "",
            f"task {ws.task_id}" if ws.task_id else "",
        )
        if part
    )
    return shown(f"{ws.path} ({owner}: {ws.why})" if owner else f"{ws.path} ({ws.why})")
