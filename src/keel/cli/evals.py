"""``keel eval SUITE``: run a suite of cases N times and report pass rates with their
uncertainty; ``--compare A,B`` runs two configurations and reports B - A.

Exit codes: 0 when every attempt of every configuration met its case's expectation, 1
when any did not, 2 for a bad suite file or option (one line naming the file and key).
The runs are ordinary runs in the store, tagged ``suite``, ``case``, ``attempt`` and
``config`` (``keel runs --tag suite=NAME``; ``keel show RUN``).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import typer
from rich.table import Table

from keel.cli.common import (
    StoreOption,
    console,
    err_console,
    fail,
    keel_errors,
    print_json,
    shown,
    store_url,
)
from keel.core.eval_report import (
    ConfigReport,
    Difference,
    EvalReport,
    MeanDifference,
    Summary,
    junit_xml,
)
from keel.core.intervals import Interval

MAX_LISTED_FAILURES = 10  # failed attempts named under the human report


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_command)


@keel_errors
def eval_command(
    suite_file: Path = typer.Argument(..., metavar="SUITE", help="The suite file (TOML)."),
    repetitions: int | None = typer.Option(
        None,
        "--repetitions",
        "-n",
        min=1,
        max=1000,
        help="Attempts per case (default: the suite's).",
    ),
    concurrency: int = typer.Option(4, "--concurrency", "-k", min=1, help="Runs executed at once."),
    compare: str | None = typer.Option(
        None,
        "--compare",
        help="A,B: run configurations A (baseline) and B (candidate) of the suite on the "
        "same cases and report B - A with 95% intervals.",
    ),
    junit: Path | None = typer.Option(
        None, "--junit", help="Also write the results as JUnit XML to this file."
    ),
    workdir: Path | None = typer.Option(
        None,
        "--workdir",
        help="A new or empty folder for the attempts' workspaces (default: a new temporary one).",
        file_okay=False,
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the report as one JSON object."),
    store: str | None = StoreOption,
) -> None:
    """Run every case of SUITE N times and report pass rates, steps, tokens, cost, wall
    time and stop reasons per case and in total."""
    # imported here, not at every `keel` start: the runner loads the whole runtime
    from keel.runtime.eval_runner import EvalRunner, load_suite  # noqa: PLC0415

    suite = load_suite(suite_file)
    configs = suite.chosen_configs(compare.split(",") if compare is not None else None)
    home = _workdir(workdir)
    url = store_url(store)
    log = None if as_json else _progress
    started = time.monotonic()
    with EvalRunner(
        suite,
        configs,
        store=url,
        workdir=home,
        repetitions=repetitions,
        concurrency=concurrency,
        log=log,
    ) as runner:
        try:
            report = runner.run()
        except KeyboardInterrupt:
            fail(
                f"interrupted: the suite's runs stay resumable (keel runs --tag "
                f"suite={suite.name}; keel resume RUN)",
                130,
            )
    elapsed = time.monotonic() - started
    if junit is not None:
        junit.write_text(junit_xml(report), encoding="utf-8")
    if as_json:
        print_json(
            {**report.to_dict(), "store": url, "workdir": str(home), "elapsed_seconds": elapsed}
        )
    else:
        print_report(report, store=url, workdir=home, elapsed=elapsed)
    raise typer.Exit(report.exit_code)


def _progress(line: str) -> None:
    err_console.print(shown(line), highlight=False, soft_wrap=True)


def _workdir(given: Path | None) -> Path:
    if given is None:
        return Path(tempfile.mkdtemp(prefix="keel-eval-"))
    if given.exists() and any(given.iterdir()):
        fail(f"--workdir {given} is not empty; give a new or empty folder")
    given.mkdir(parents=True, exist_ok=True)
    return given.resolve()


# --- the human report --------------------------------------------------------------------


def print_report(report: EvalReport, *, store: str, workdir: Path, elapsed: float) -> None:
    for config in report.configs:
        console.print(config_table(report.suite, config))
        console.print()
    if report.comparison is not None:
        comparison = report.comparison
        console.print(
            comparison_table(
                comparison.baseline, comparison.candidate, comparison.cases, comparison.total
            )
        )
        console.print(
            "  * significant at 95 %: the interval excludes 0 (pass rate: Newcombe's hybrid "
            "score interval; means: Welch's t interval)",
            highlight=False,
        )
        for i, line in enumerate(significant_lines(comparison.cases, comparison.total)):
            label = "significant" if i == 0 else ""
            console.print(f"  {label:<12} {shown(line)}", highlight=False, soft_wrap=True)
        console.print()
    attempts = [r for config in report.configs for r in config.attempts]
    failed = [r for r in attempts if not r.passed]
    for result in failed[:MAX_LISTED_FAILURES]:
        console.print(
            f"  [red]failed[/] {shown(f'{result.case} #{result.attempt} [{result.config}]')} "
            f"{result.run_id}: {shown(result.shortfall or '')}",
            highlight=False,
            soft_wrap=True,
        )
    if len(failed) > MAX_LISTED_FAILURES:
        console.print(
            f"  … and {len(failed) - MAX_LISTED_FAILURES} more failed attempts (--json or "
            "--junit FILE lists every attempt)",
            highlight=False,
        )
    verdict = "[bold green]passed[/]" if report.passed else "[bold red]failed[/]"
    console.print(
        f"{verdict}: {len(attempts) - len(failed)}/{len(attempts)} attempts met their "
        f"expectation in {elapsed:.1f}s",
        highlight=False,
    )
    console.print(
        f"  runs in {shown(store)}: keel runs --tag suite={shown(report.suite)}; "
        f"workspaces in {shown(str(workdir))}",
        highlight=False,
        soft_wrap=True,
    )


def config_table(suite: str, config: ConfigReport) -> Table:
    table = Table(
        title=f"{suite} — configuration {config.name}",
        title_justify="left",
        box=None,
        header_style="bold",
    )
    table.add_column("CASE", overflow="fold", min_width=_case_width(config.cases))
    for column in ("PASS", "RATE (95% CI)", "STEPS", "TOKENS", "COST", "WALL S"):
        table.add_column(column, no_wrap=True)
    table.add_column("STOP REASONS", overflow="fold", min_width=12)
    rows = [*config.cases.items(), ("total", config.total)]
    for case, summary in rows:
        table.add_row(shown(case), *summary_cells(summary), end_section=case == rows[-2][0])
    table.caption = "steps, tokens, wall seconds: median/mean per attempt; cost: mean USD"
    table.caption_justify = "left"
    return table


def _case_width(cases: Mapping[str, object]) -> int:
    return min(24, max(len("total"), *(len(case) for case in cases)))


def summary_cells(summary: Summary) -> list[str]:
    s = summary.spreads
    return [
        f"{summary.passed}/{summary.attempts}",
        f"{summary.pass_rate:.0%} {percent_interval(summary.interval)}",
        f"{s['steps'].median:g}/{s['steps'].mean:.3g}",
        f"{s['tokens'].median:g}/{s['tokens'].mean:.0f}",
        f"${s['cost'].mean:.4g}",
        f"{s['wall_seconds'].median:.1f}/{s['wall_seconds'].mean:.1f}",
        shown("\n".join(f"{reason} {n}" for reason, n in summary.stop_reasons.items())),
    ]


def comparison_table(
    baseline: str, candidate: str, cases: Mapping[str, Difference], total: Difference
) -> Table:
    table = Table(
        title=f"{candidate} - {baseline} (candidate minus baseline)",
        title_justify="left",
        box=None,
        header_style="bold",
    )
    table.add_column("CASE", overflow="fold", min_width=_case_width(cases))
    for column in ("Δ PASS RATE (95% CI)", "Δ STEPS", "Δ TOKENS", "Δ COST"):
        table.add_column(column, no_wrap=True)
    rows = [*cases.items(), ("total", total)]
    for case, diff in rows:
        table.add_row(shown(case), *difference_cells(diff), end_section=case == rows[-2][0])
    return table


def difference_cells(diff: Difference) -> list[str]:
    mark = " *" if diff.significant else ""
    cells = [f"{diff.pass_rate * 100:+.0f} pts {percent_interval(diff.interval)}{mark}"]
    for name in ("steps", "tokens", "cost"):
        cells.append(mean_text(diff.means[name]))
    return cells


def mean_text(mean: MeanDifference) -> str:
    """``-1.5 ± 0.8 *``: the difference of means and its interval's half width (Welch's
    interval is symmetric); ``n<2`` when a side has fewer than two attempts."""
    if mean.interval is None:
        return f"{mean.difference:+.4g} (n<2)"
    half = (mean.interval.high - mean.interval.low) / 2
    return f"{mean.difference:+.4g} ± {half:.3g}" + (" *" if mean.significant else "")


def percent_interval(interval: Interval) -> str:
    """``(44, 100)``: the interval's ends in percent (points, for a difference)."""
    return f"({interval.low * 100:.0f}, {interval.high * 100:.0f})"


def significant_lines(cases: Mapping[str, Difference], total: Difference) -> list[str]:
    """One line per case (and the total) with a significant difference, naming each."""
    lines = []
    for case, diff in [*cases.items(), ("total", total)]:
        found = [f"pass rate {diff.pass_rate * 100:+.0f} pts"] if diff.significant else []
        found += [f"{n} {m.difference:+.4g}" for n, m in diff.means.items() if m.significant]
        if found:
            lines.append(f"{case}: {', '.join(found)}")
    return lines or ["none: every interval includes 0"]
