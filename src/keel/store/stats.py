"""What both stores share for ``Store.run_stats``: the figures rows an event makes, which
filter fragments the statements need, and their rows turned into a ``RunStats``.

Pure: no SQL here (each dialect keeps its statements in its ``.sql`` files).

A store writes ``figure_rows`` of every event it appends into its ``event_figures``
table, in the append's transaction (and a migration writes them for the events stored
before): one narrow row per run, model turn, tool outcome, compaction summary,
verification record and sign-off. ``keel stats`` then aggregates those rows in the
database instead of parsing every event's payload (tool output, model text) at each
query: about 5 s for 10,000 runs that way, a fraction of a second this way. The rows
are made here once, from the data the writer already holds, for both dialects; events
are append-only, so the rows never change.

A row is ``(run_id, seq, item, kind, name, ok, elapsed_s, input_tokens,
cached_input_tokens, output_tokens, reasoning_tokens, cost)``:

- ``run`` (``run_created``; name: the run's model spec);
- ``model`` (``model_responded``; name: the run's spec, else the turn's own model);
- ``tool`` (``tool_finished``, ``tool_failed``: ok False; name: the tool);
- ``compaction`` (``context_compacted`` with a summary call);
- ``verifier`` (each record of ``verification_passed``, ``verification_failed`` and
  ``signoff_requested``, ``item`` its place; name: its name, else the name the run
  gave its command, else the command; and a person's ``signoff_recorded``, name: that
  verifier); ok: it passed.

name is ``-`` when the event names none; elapsed_s is None when it recorded no
latency. A count that is not a whole number of 0 .. 10**18 counts as absent, a cost as
the run's budget counts it (``keel.core.budget``).

The aggregated rows have these shapes in both dialects:

- runs: ``(status, reason code or None, runs)``;
- figures: ``(kind, name, calls, failed, timed, total_s, max_s, input, cached_input,
  output, reasoning, cost, p50_s, p95_s, p99_s)``, kind ``model``, ``tool``,
  ``compaction`` or ``verifier`` (the latency columns None when nothing was timed).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from keel.core.errors import RunNotFound
from keel.core.events import Event, EventType
from keel.core.records import RunOptions
from keel.core.stats import (
    Latency,
    ModelFigures,
    ReasonCount,
    RunStats,
    TokenCounts,
    ToolFigures,
    VerifierFigures,
)
from keel.core.status import RunStatus
from keel.store.service import all_statuses

FigureRow = tuple[
    str,
    int,
    int,
    str,
    str,
    bool,
    float | None,
    int | None,
    int | None,
    int | None,
    int | None,
    float | None,
]

TOOL_OUTCOMES = frozenset({EventType.TOOL_FINISHED, EventType.TOOL_FAILED})
VERIFICATIONS = frozenset(
    {EventType.VERIFICATION_PASSED, EventType.VERIFICATION_FAILED, EventType.SIGNOFF_REQUESTED}
)
FIGURE_TYPES = frozenset(
    {
        EventType.RUN_CREATED,
        EventType.MODEL_RESPONDED,
        EventType.CONTEXT_COMPACTED,
        EventType.SIGNOFF_RECORDED,
        *TOOL_OUTCOMES,
        *VERIFICATIONS,
    }
)
MAX_COUNT = 10**18
_LARGEST = 10**300
NAME_MAX = 200
_TOKEN_KINDS = ("input_tokens", "cached_input_tokens", "output_tokens", "reasoning_tokens")


def figure_rows(events: Iterable[Event], options: RunOptions) -> list[FigureRow]:
    """The ``event_figures`` rows of ``events`` of one run driven by ``options``."""
    rows: list[FigureRow] = []
    for e in events:
        if e.type in FIGURE_TYPES:
            rows += rows_of_event(e.run_id, e.seq, e.type, e.data, options)
    return rows


FIGURE_COLUMNS = (
    "f_seqs",
    "f_items",
    "f_kinds",
    "f_names",
    "f_oks",
    "f_elapsed",
    "f_input",
    "f_cached",
    "f_output",
    "f_reasoning",
    "f_costs",
)


def figure_columns(rows: Sequence[FigureRow]) -> dict[str, list[Any]]:
    """``rows`` (of one run) as one list per column after the run id, named as a
    statement that inserts them from arrays takes them (PostgreSQL's ``unnest``)."""
    columns: list[list[Any]] = [[] for _ in FIGURE_COLUMNS]
    for row in rows:
        for column, value in zip(columns, row[1:], strict=True):
            column.append(value)
    return dict(zip(FIGURE_COLUMNS, columns, strict=True))


def rows_of_event(
    run_id: str, seq: int, type_: EventType, d: Mapping[str, Any], options: RunOptions
) -> list[FigureRow]:
    """The rows of one event (none for a type outside ``FIGURE_TYPES``); ``options`` name
    the run's model spec and its verifiers."""
    spec = options.model
    if type_ is EventType.RUN_CREATED:
        return [(run_id, seq, 0, "run", _name(spec), True, *_NOTHING)]
    if type_ is EventType.MODEL_RESPONDED:
        name = _name(spec or d.get("model"))
        return [(run_id, seq, 0, "model", name, True, *_call(d))]
    if type_ in TOOL_OUTCOMES:
        ok = type_ is EventType.TOOL_FINISHED
        timed = _number(d.get("elapsed_s"))
        return [(run_id, seq, 0, "tool", _name(d.get("tool")), ok, timed, *_NO_USAGE)]
    if type_ is EventType.CONTEXT_COMPACTED:
        summary = d.get("summary")
        if not isinstance(summary, Mapping):
            return []  # a compaction without a summary call used no model
        return [(run_id, seq, 0, "compaction", "-", True, *_call(summary))]
    if type_ is EventType.SIGNOFF_RECORDED:
        name, ok = _name(d.get("verifier")), d.get("passed") is True
        return [(run_id, seq, 0, "verifier", name, ok, None, *_NO_USAGE)]
    records = d.get("records")
    if type_ not in VERIFICATIONS or not isinstance(records, list):
        return []
    return [
        (run_id, seq, i, "verifier", _verifier(r, options), r.get("passed") is True, *_NOTHING)
        for i, r in enumerate(records)
        if isinstance(r, Mapping)
    ]


_NO_USAGE: tuple[None, None, None, None, None] = (None, None, None, None, None)
_NOTHING: tuple[None, None, None, None, None, None] = (None, *_NO_USAGE)


def _call(
    d: Mapping[str, Any],
) -> tuple[float | None, int | None, int | None, int | None, int | None, float | None]:
    """A model call's latency, tokens by kind and cost."""
    usage = d.get("usage")
    counts = usage if isinstance(usage, Mapping) else {}
    i, c, o, r = (_count(counts.get(kind)) for kind in _TOKEN_KINDS)
    return (_number(d.get("elapsed_s")), i, c, o, r, _money(d.get("cost")))


def _name(value: Any) -> str:
    """A name as a column can hold it: text, no NUL (PostgreSQL refuses it), at most
    ``NAME_MAX`` characters; ``-`` for none."""
    if not isinstance(value, str) or not value:
        return "-"
    return value[:NAME_MAX].replace("\x00", "\ufffd")


def _verifier(record: Mapping[str, Any], options: RunOptions) -> str:
    """A record's verifier: its own name, else the name the run gave its command
    (``--verify NAME=CMD``), else the command."""
    name, command = record.get("name"), record.get("command")
    if isinstance(name, str) and name:
        return _name(name)
    return _name(options.verifier_name(command) if isinstance(command, str) else None)


def _number(value: Any) -> float | None:
    """A finite JSON number as a float (true/false, text and numbers too large are none)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, int) and abs(value) > _LARGEST:
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _count(value: Any) -> int | None:
    """A token count as the budget counts it (a whole number >= 0; a float is cut), or
    None when it is none (absent, text, true/false, not finite, above 10**18)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    whole = max(0, int(value))
    return whole if whole <= MAX_COUNT else None


def _money(value: Any) -> float | None:
    """A cost as the budget counts it: a finite number above 0, else nothing."""
    number = _number(value)
    return number if number is not None and number > 0 else None


def options_of(created: Mapping[str, Any]) -> RunOptions:
    """The options a ``run_created`` event's data holds (the defaults where unreadable)."""
    options = created.get("options")
    try:
        return RunOptions.from_dict(dict(options)) if isinstance(options, Mapping) else RunOptions()
    except (AttributeError, KeyError, TypeError, ValueError):  # a log written by hand
        return RunOptions()


def stats_filters(
    *, since: datetime | None, model: str | None, run_id: str | None
) -> tuple[str, ...]:
    """The filters asked for, as the suffixes of a dialect's fragments: ``run``, ``since``
    and ``model`` name ``runs_if_*`` (for the runs statement) and ``figures_if_*``."""
    asked = (("run", run_id), ("since", since), ("model", model))
    return tuple(name for name, value in asked if value is not None)


def assemble(
    run_rows: Iterable[Sequence[Any]],
    figure_rows: Iterable[Sequence[Any]],
    *,
    run_id: str | None = None,
) -> RunStats:
    """``RunStats`` from the runs and figures rows (shapes in the module docstring).

    With ``run_id`` and no run counted, that run does not exist: ``RunNotFound``.
    """
    counts: dict[str, int] = {}
    reasons: list[ReasonCount] = []
    for status, code, n in run_rows:
        counts[str(status)] = counts.get(str(status), 0) + int(n)
        if code is not None:
            reasons.append(ReasonCount(status=RunStatus(status), reason=str(code), runs=int(n)))
    total = sum(counts.values())
    if run_id is not None and total == 0:
        raise RunNotFound(run_id)
    models: list[ModelFigures] = []
    tools: list[ToolFigures] = []
    verifiers: list[VerifierFigures] = []
    steps = tokens_in = cached = tokens_out = reasoning = 0
    cost = 0.0
    for row in figure_rows:
        kind, name, calls, failed = str(row[0]), str(row[1]), int(row[2]), int(row[3] or 0)
        latency = _latency(row)
        tokens_in += int(row[7])
        cached += int(row[8])
        tokens_out += int(row[9])
        reasoning += int(row[10])
        cost += float(row[11] or 0.0)
        if kind == "model":
            steps += calls
            models.append(ModelFigures(model=name, calls=calls, latency=latency))
        elif kind == "tool":
            tools.append(ToolFigures(tool=name, calls=calls, failed=failed, latency=latency))
        elif kind == "verifier":
            verifiers.append(VerifierFigures(verifier=name, checks=calls, passed=calls - failed))
    return RunStats(
        runs=total,
        by_status=all_statuses(counts),
        reasons=tuple(sorted(reasons, key=lambda r: (-r.runs, r.status.value, r.reason))),
        steps=steps,
        tokens=TokenCounts(
            input=tokens_in, cached_input=cached, output=tokens_out, reasoning=reasoning
        ),
        cost=round(cost, 10),
        models=tuple(sorted(models, key=lambda m: m.model)),
        tools=tuple(sorted(tools, key=lambda t: t.tool)),
        verifiers=tuple(sorted(verifiers, key=lambda v: v.verifier)),
    )


def _latency(row: Sequence[Any]) -> Latency | None:
    timed, total, longest = row[4], row[5], row[6]
    p50, p95, p99 = row[12], row[13], row[14]
    if not timed or p50 is None or p95 is None or p99 is None:
        return None
    return Latency(
        timed=int(timed),
        total_s=float(total),
        p50_s=float(p50),
        p95_s=float(p95),
        p99_s=float(p99),
        max_s=float(longest),
    )
