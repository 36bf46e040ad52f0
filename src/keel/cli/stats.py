"""``keel stats``: what the runs in the store used and how they went, and the same figures
for one run (``keel show``).

The figures come from ``Store.run_stats`` (aggregated in the database; what each one
counts: ``keel.core.stats``). Names a run's events carry (tools the model called,
verifier commands, reasons) are printed escaped and cut to one line.
"""

from __future__ import annotations

from typing import Any

import typer
from rich.table import Table

from keel.cli.common import (
    JsonOption,
    StoreOption,
    console,
    keel_errors,
    print_json,
    shown,
    store_url,
)
from keel.cli.display import excerpt, styled_status
from keel.core.stats import Latency, RunStats, parse_since
from keel.store.url import open_store

REASONS_SHOWN = 12
NAME_WIDTH = 48


def register(app: typer.Typer) -> None:
    """Add ``keel stats`` to ``app``."""
    app.command("stats")(stats_command)


@keel_errors
def stats_command(
    since: str | None = typer.Option(
        None,
        "--since",
        metavar="DATE",
        help="Only runs created at or after DATE: an ISO date (2026-01-31, midnight UTC) "
        "or datetime (2026-01-31T09:30, UTC unless it names an offset).",
    ),
    model: str | None = typer.Option(
        None, "--model", metavar="SPEC", help="Only runs whose model spec is SPEC."
    ),
    as_json: bool = JsonOption,
    store: str | None = StoreOption,
) -> None:
    """Usage of the runs: by status and stop reason; steps, tokens by kind and cost; model
    and tool latency (p50/p95/p99); verifier pass rates."""
    moment = None if since is None else parse_since(since)  # refused before the store opens
    st = open_store(store_url(store), must_exist=True)
    try:
        stats = st.run_stats(since=moment, model=model)
    finally:
        st.close()
    if as_json:
        filters = {"since": None if moment is None else moment.isoformat(), "model": model}
        print_json({"filters": filters, **stats.to_dict()})
        return
    if not stats.runs:
        console.print("no runs" + describe_filters(since, model))
        return
    for line in summary_lines(stats):
        console.print(line, highlight=False)
    tables = [status_table(stats), *([reasons_table(stats)] if stats.reasons else [])]
    for table in [*tables, *figure_tables(stats)]:
        console.print()
        console.print(table)


def describe_filters(since: str | None, model: str | None) -> str:
    parts = [f" created since {since}" if since else "", f" of model {model}" if model else ""]
    return shown("".join(parts))


def summary_lines(stats: RunStats) -> list[str]:
    """Runs, steps, tool calls, cost and tokens by kind, as rich-markup lines."""
    tokens = stats.tokens
    hits = f", {tokens.cached_input / tokens.input:.1%}" if tokens.input else ""
    return [
        f"[bold]runs[/] {stats.runs:,}   [bold]steps[/] {stats.steps:,}   "
        f"[bold]tool calls[/] {stats.tool_calls:,}   [bold]cost[/] ${stats.cost:,.4f}",
        f"[bold]tokens[/] input {tokens.input:,} (cached {tokens.cached_input:,}{hits})   "
        f"output {tokens.output:,} (reasoning {tokens.reasoning:,})",
    ]


def status_table(stats: RunStats) -> Table:
    table = _table("STATUS", "RUNS", "SHARE")
    for status, count in stats.by_status.items():
        if count:
            table.add_row(styled_status(status), f"{count:,}", f"{count / stats.runs:.1%}")
    return table


def reasons_table(stats: RunStats) -> Table:
    """The most frequent reasons (by their code); --json lists every one."""
    table = _table("STATUS", "REASON", "RUNS")
    for reason in stats.reasons[:REASONS_SHOWN]:
        table.add_row(styled_status(reason.status), _name(reason.reason), f"{reason.runs:,}")
    left = len(stats.reasons) - REASONS_SHOWN
    if left > 0:
        table.add_row("", f"[dim]… {left} more (--json lists them)[/]", "")
    return table


def figure_tables(stats: RunStats) -> list[Table]:
    """Model latency per model, tool latency per tool, verifier pass rates (when any)."""
    tables = []
    if stats.models:
        models = _table("MODEL", "CALLS", "P50", "P95", "P99", "MAX")
        for m in stats.models:
            models.add_row(_name(m.model), f"{m.calls:,}", *_latency(m.latency))
        tables.append(models)
    if stats.tools:
        tools = _table("TOOL", "CALLS", "FAILED", "P50", "P95", "P99", "MAX")
        for t in stats.tools:
            tools.add_row(_name(t.tool), f"{t.calls:,}", f"{t.failed:,}", *_latency(t.latency))
        tables.append(tools)
    if stats.verifiers:
        checks = _table("VERIFIER", "CHECKS", "PASSED", "PASS RATE")
        for v in stats.verifiers:
            checks.add_row(
                _name(v.verifier), f"{v.checks:,}", f"{v.passed:,}", f"{v.pass_rate:.1%}"
            )
        tables.append(checks)
    return tables


def run_figures(stats: RunStats) -> dict[str, Any]:
    """One run's figures for ``keel show --json`` (what ``keel stats --json`` gives for
    many runs, without the counts of runs)."""
    return {k: v for k, v in stats.to_dict().items() if k not in ("runs", "by_status", "reasons")}


def run_figure_lines(stats: RunStats) -> list[str]:
    """One run's figures for ``keel show``: steps, tokens, cost from its own events, then
    latency per model and tool, and its verifiers' results."""
    tokens = stats.tokens
    lines = [
        "[bold]figures[/] (this run's own events)",
        f"  steps {stats.steps}   tool calls {stats.tool_calls}   cost ${stats.cost:.4f}   "
        f"tokens in {tokens.input} (cached {tokens.cached_input}) "
        f"out {tokens.output} (reasoning {tokens.reasoning})",
    ]
    for m in stats.models:
        lines.append(f"  model {_name(m.model)}  calls {m.calls}  {_latency_line(m.latency)}")
    for t in stats.tools:
        failed = f", failed {t.failed}" if t.failed else ""
        lines.append(
            f"  tool  {_name(t.tool)}  calls {t.calls}{failed}  {_latency_line(t.latency)}"
        )
    for v in stats.verifiers:
        lines.append(f"  verifier {_name(v.verifier)}  passed {v.passed} of {v.checks}")
    return lines


def seconds(value: float) -> str:
    """A latency as people read it: 850ms, 1.36s, 2m05s."""
    if value < 1:
        return f"{value * 1000:.0f}ms" if value >= 0.01 else f"{value * 1000:.1f}ms"
    if value < 60:
        return f"{value:.2f}s"
    minutes, rest = divmod(value, 60)
    return f"{int(minutes)}m{rest:02.0f}s"


def _latency(latency: Latency | None) -> tuple[str, str, str, str]:
    if latency is None:
        return ("-", "-", "-", "-")
    return (
        seconds(latency.p50_s),
        seconds(latency.p95_s),
        seconds(latency.p99_s),
        seconds(latency.max_s),
    )


def _latency_line(latency: Latency | None) -> str:
    if latency is None:
        return "no latency recorded"
    p50, p95, p99, longest = _latency(latency)
    return f"p50 {p50}  p95 {p95}  p99 {p99}  max {longest}"


def _name(text: str) -> str:
    return shown(excerpt(text, NAME_WIDTH))


def _table(*columns: str) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in columns:
        table.add_column(column, no_wrap=column not in ("REASON",), overflow="fold")
    return table
