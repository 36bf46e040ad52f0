"""``keel agents list`` and ``keel agents show NAME``: the agent specs a run could spawn.

Specs are read exactly as a spawn reads them (``keel.runtime.agent_specs``): the
workspace's ``.keel/agents/NAME.md`` first, then the built-ins. ``list`` shows an
invalid file among the others with its error (file and line) and exits 2, so a
broken spec is found before a parent tries to spawn it. Everything a spec's author
wrote is printed through ``shown``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.table import Table

from keel.cli.common import WorkspaceOption, console, err_console, keel_errors, shown
from keel.cli.display import amount
from keel.core.budget import Dimension
from keel.core.errors import ConfigError

if TYPE_CHECKING:
    from keel.core.agent_spec import AgentSpec, OnFailure

# keel.runtime.agent_specs (it loads the built-in tools) and keel.core.agent_spec
# (jsonschema) are imported where a command uses them: every `keel` start loads this module

DIGEST_SHOWN = 12

agents_app = typer.Typer(
    help="Agent specs for subagents: the built-ins and .keel/agents/NAME.md.",
    no_args_is_help=True,
)


def register(app: typer.Typer) -> None:
    """Add ``keel agents …`` to ``app``."""
    app.add_typer(agents_app, name="agents")


@agents_app.command("list")
@keel_errors
def list_command(workspace: Path = WorkspaceOption) -> None:
    """List every agent a run here could spawn; exit 2 if any spec file is invalid."""
    from keel.runtime.agent_specs import list_agent_specs  # noqa: PLC0415 - see the top

    found = list_agent_specs(workspace.resolve())
    table = Table(box=None, header_style="bold")
    for column in ("NAME", "SOURCE", "VERSION", "DIGEST"):
        table.add_column(column, no_wrap=True)
    table.add_column("DESCRIPTION", overflow="fold", min_width=20)
    invalid = 0
    for spec in found:
        if isinstance(spec, ConfigError):
            invalid += 1
            name, source = _named_by(spec)
            error = f"[red]{shown(str(spec))}[/]"
            table.add_row(shown(name), shown(source), "-", "[bold red]invalid[/]", error)
            continue
        table.add_row(
            shown(spec.name),
            shown(spec.source),
            str(spec.version),
            spec.digest[:DIGEST_SHOWN],
            shown(spec.description),
        )
    console.print(table)
    if invalid:
        err_console.print(
            f"{invalid} invalid agent spec file(s): a spawn of them is refused until they "
            "are fixed (each error names the file and line)",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(2)


@agents_app.command("show")
@keel_errors
def show_command(
    name: str = typer.Argument(..., help="The agent's name, e.g. explorer."),
    workspace: Path = WorkspaceOption,
) -> None:
    """Show one agent spec as a spawn would use it: its contract and its instructions."""
    from keel.runtime.agent_specs import load_agent_spec  # noqa: PLC0415 - see the top

    spec = load_agent_spec(name, workspace.resolve())
    for line in describe_spec(spec):
        console.print(line, highlight=False, soft_wrap=True)


def describe_spec(spec: AgentSpec) -> list[str]:
    """The human view of a parsed spec as rich-markup lines."""
    lines = [f"[bold]{shown(spec.name)}[/]  v{spec.version}  sha256 {spec.digest}"]
    lines.append(f"  source       {shown(spec.source)}")
    lines.append(f"  description  {shown(spec.description)}")
    model = spec.model or "the parent's"
    lines.append(f"  model        {shown(model)}")
    tools = ", ".join(spec.tools) if spec.tools is not None else "every tool the parent has"
    narrowed = "  [dim](only those the parent has)[/]" if spec.tools is not None else ""
    lines.append(f"  tools        {shown(tools or 'none')}{narrowed}")
    mode = spec.mode or "the parent's"
    lines.append(f"  mode         {shown(mode)}  [dim](never more permissive than the parent)[/]")
    lines.append(f"  workspace    {shown(spec.workspace)}")
    lines.append(f"  budget       {shown(budget_words(spec))}")
    verify = "; ".join(spec.verify) if spec.verify else "none"
    lines.append(f"  verify       {shown(verify)}")
    lines.append(f"  on_failure   {shown(failure_words(spec.on_failure))}")
    lines.append("[bold]output schema[/]")
    if spec.output is None:
        lines.append("  none (the result is the summary and evidence only)")
    else:
        schema = json.dumps(spec.output, ensure_ascii=False, indent=2)
        lines += [f"  {shown(text)}" for text in schema.splitlines()]
    lines.append("[bold]instructions[/]")
    lines += [f"  {shown(text)}" for text in spec.instructions.splitlines()]
    return lines


def budget_words(spec: AgentSpec) -> str:
    """``steps 30 · tool calls 120`` and what the spec leaves to the parent's carving."""
    budget = spec.budget
    set_, open_ = [], []
    for dim in Dimension:
        label = dim.value.replace("_", " ")
        limit = budget.limit(dim) if budget is not None else None
        if limit is None:
            open_.append(label)
        else:
            set_.append(f"{label} {amount(dim, limit)}")
    words = " · ".join(set_) if set_ else "none of its own"
    if open_:
        words += f" ({', '.join(open_)}: a share of what the parent has left)"
    return words


def failure_words(on_failure: OnFailure) -> str:
    from keel.core.agent_spec import FailurePolicy  # noqa: PLC0415 - see the top

    if on_failure.policy is not FailurePolicy.RETRY:
        return on_failure.policy.value
    agent = f" as {on_failure.agent}" if on_failure.agent else ""
    return f"retry: up to {on_failure.attempts} fresh children{agent}, then {on_failure.then.value}"


def _named_by(error: ConfigError) -> tuple[str, str]:
    """The agent name and file an invalid spec's error is about (``FILE:LINE: …``)."""
    from keel.runtime.agent_specs import SUFFIX  # noqa: PLC0415 - see the top

    source = str(error).split(":", 1)[0]
    if source.endswith(SUFFIX):
        return Path(source).name[: -len(SUFFIX)], source
    return "?", source


__all__ = ["agents_app", "budget_words", "describe_spec", "failure_words", "register"]
