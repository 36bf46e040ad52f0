"""``keel skills list``: the skills a run in this workspace is offered.

Skills are read exactly as ``keel run`` reads them (``keel.tools.skills``): every
folder of ``.keel/skills`` with a ``SKILL.md``. An invalid one is listed with its error
(file and line) and the command exits 2: a run here is refused until it is fixed.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from keel.cli.common import (
    JsonOption,
    WorkspaceOption,
    console,
    err_console,
    keel_errors,
    print_json,
    shown,
)
from keel.core.errors import ConfigError

DIGEST_SHOWN = 12

skills_app = typer.Typer(
    help="Skills (.keel/skills/NAME/SKILL.md, the Agent Skills format).", no_args_is_help=True
)


def register(app: typer.Typer) -> None:
    """Add ``keel skills …`` to ``app``."""
    app.add_typer(skills_app, name="skills")


@skills_app.command("list")
@keel_errors
def list_command(
    workspace: Path = WorkspaceOption,
    json_out: bool = JsonOption,
) -> None:
    """List the workspace's skills (name, description, digest); exit 2 if any is invalid."""
    # imported here, not at every `keel` start: keel.tools loads the built-in tools
    from keel.tools.skills import scan_skills  # noqa: PLC0415

    found = scan_skills(workspace.resolve())
    invalid = [item for item in found if isinstance(item, ConfigError)]
    if json_out:
        print_json(
            [
                {"error": str(item)}
                if isinstance(item, ConfigError)
                else {**item.summary(), "source": item.source}
                for item in found
            ]
        )
    elif not found:
        console.print("no skills: add .keel/skills/NAME/SKILL.md", highlight=False)
    else:
        table = Table(box=None, header_style="bold")
        for column in ("NAME", "DIGEST"):
            table.add_column(column, no_wrap=True)
        table.add_column("DESCRIPTION", overflow="fold", min_width=20)
        for item in found:
            if isinstance(item, ConfigError):
                table.add_row("-", "[bold red]invalid[/]", f"[red]{shown(str(item))}[/]")
            else:
                table.add_row(shown(item.name), item.digest[:DIGEST_SHOWN], shown(item.description))
        console.print(table)
    if invalid:
        err_console.print(
            f"{len(invalid)} invalid skill(s): runs in this workspace are refused until they "
            "are fixed (each error names the file and line)",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(2)
