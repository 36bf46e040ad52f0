"""What ``keel eval`` reports: each attempt's ending, summaries per case and in total, and
the differences between two configurations, with their uncertainty.

An attempt *passes* when its run ended as the case expects (``Expectation``). A summary
gives the pass rate with its 95 % Wilson interval, the median and mean of steps,
tokens, cost and wall time, and how many attempts stopped for each kind of reason
(``model_error``, ``budget_exhausted:steps``, ``verified``; each attempt keeps its whole
reason). A
comparison gives, per case and in total, candidate minus baseline: the pass rate's
difference with Newcombe's interval, and the mean steps, tokens and cost's differences
with Welch's; a difference is significant when its interval excludes 0
(``keel.core.intervals``). The totals pool every attempt of every case. Pure.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from statistics import fmean, median
from typing import Any

from keel.core.intervals import Interval, newcombe, welch, wilson

MEASURES = ("steps", "tokens", "cost", "wall_seconds")  # summarised per attempt
COMPARED = ("steps", "tokens", "cost")  # mean differences a comparison reports


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptResult:
    """How one attempt (one run) of a case under a configuration ended."""

    config: str
    case: str
    attempt: int  # 1-based
    run_id: str | None
    status: str
    reason: str | None
    outcome: str | None
    shortfall: str | None  # why it missed the expectation; None: it passed
    steps: int = 0
    tool_calls: int = 0
    tokens: int = 0
    cost: float = 0.0
    wall_seconds: float = 0.0
    workspace: str | None = None

    @property
    def passed(self) -> bool:
        return self.shortfall is None

    @property
    def stop_reason(self) -> str:
        """The run's stop reason, else its status (a run waiting for a person)."""
        return self.reason or self.status

    @property
    def stop_kind(self) -> str:
        """The stop reason without its detail (``model_error: HTTP 429`` -> ``model_error``):
        what a summary counts."""
        return self.stop_reason.split(": ", 1)[0]

    def measure(self, name: str) -> float:
        value: float = getattr(self, name)
        return value

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "case": self.case,
            "attempt": self.attempt,
            "run_id": self.run_id,
            "status": self.status,
            "reason": self.reason,
            "outcome": self.outcome,
            "passed": self.passed,
            "shortfall": self.shortfall,
            "steps": self.steps,
            "tool_calls": self.tool_calls,
            "tokens": self.tokens,
            "cost": self.cost,
            "wall_seconds": self.wall_seconds,
            "workspace": self.workspace,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Spread:
    median: float
    mean: float

    def to_dict(self) -> dict[str, float]:
        return {"median": self.median, "mean": self.mean}


@dataclass(frozen=True, slots=True, kw_only=True)
class Summary:
    """A group of attempts (one case's, or all of a configuration's)."""

    attempts: int
    passed: int
    interval: Interval  # the pass rate's 95 % Wilson interval
    spreads: Mapping[str, Spread]  # by MEASURES name
    stop_reasons: Mapping[str, int]  # by stop_kind, most frequent first

    @property
    def pass_rate(self) -> float:
        return self.passed / self.attempts if self.attempts else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "attempts": self.attempts,
            "passed": self.passed,
            "pass_rate": self.pass_rate,
            "pass_rate_ci95": self.interval.to_dict(),
            **{name: spread.to_dict() for name, spread in self.spreads.items()},
            "stop_reasons": dict(self.stop_reasons),
        }


def summarize(results: Sequence[AttemptResult]) -> Summary:
    """The summary of ``results`` (at least one)."""
    passed = sum(r.passed for r in results)
    spreads = {}
    for name in MEASURES:
        values = [r.measure(name) for r in results]
        spreads[name] = Spread(median=float(median(values)), mean=fmean(values))
    reasons = Counter(r.stop_kind for r in results)
    return Summary(
        attempts=len(results),
        passed=passed,
        interval=wilson(passed, len(results)),
        spreads=spreads,
        stop_reasons=dict(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class MeanDifference:
    """Candidate's mean minus baseline's, with Welch's interval (None: fewer than two
    attempts on a side)."""

    difference: float
    interval: Interval | None

    @property
    def significant(self) -> bool:
        return self.interval is not None and self.interval.excludes_zero

    def to_dict(self) -> dict[str, Any]:
        return {
            "difference": self.difference,
            "ci95": self.interval.to_dict() if self.interval else None,
            "significant": self.significant,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Difference:
    """Candidate minus baseline over one group of attempts."""

    pass_rate: float
    interval: Interval  # Newcombe's hybrid score interval
    means: Mapping[str, MeanDifference]  # by COMPARED name

    @property
    def significant(self) -> bool:
        return self.interval.excludes_zero

    def to_dict(self) -> dict[str, Any]:
        return {
            "pass_rate": {
                "difference": self.pass_rate,
                "ci95": self.interval.to_dict(),
                "significant": self.significant,
            },
            **{name: mean.to_dict() for name, mean in self.means.items()},
        }


def difference(baseline: Sequence[AttemptResult], candidate: Sequence[AttemptResult]) -> Difference:
    """Candidate minus baseline (each at least one attempt)."""
    kb, nb = sum(r.passed for r in baseline), len(baseline)
    kc, nc = sum(r.passed for r in candidate), len(candidate)
    means = {}
    for name in COMPARED:
        a = [r.measure(name) for r in candidate]
        b = [r.measure(name) for r in baseline]
        means[name] = MeanDifference(difference=fmean(a) - fmean(b), interval=welch(a, b))
    return Difference(pass_rate=kc / nc - kb / nb, interval=newcombe(kc, nc, kb, nb), means=means)


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfigReport:
    name: str
    settings: Mapping[str, Any]  # the configuration as the suite gives it
    cases: Mapping[str, Summary]  # in the suite's order
    total: Summary
    attempts: tuple[AttemptResult, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "settings": dict(self.settings),
            "cases": [
                {
                    "case": case,
                    **summary.to_dict(),
                    "results": [r.to_dict() for r in self.attempts if r.case == case],
                }
                for case, summary in self.cases.items()
            ],
            "total": self.total.to_dict(),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Comparison:
    baseline: str
    candidate: str
    cases: Mapping[str, Difference]
    total: Difference

    def to_dict(self) -> dict[str, Any]:
        return {
            "baseline": self.baseline,
            "candidate": self.candidate,
            "direction": f"{self.candidate} - {self.baseline}",
            "cases": [{"case": case, **d.to_dict()} for case, d in self.cases.items()],
            "total": self.total.to_dict(),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class EvalReport:
    suite: str
    source: str
    configs: tuple[ConfigReport, ...]
    comparison: Comparison | None

    @property
    def passed(self) -> bool:
        """Every attempt of every configuration met its case's expectation."""
        return all(r.passed for config in self.configs for r in config.attempts)

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "suite": self.suite,
            "file": self.source,
            "passed": self.passed,
            "exit_code": self.exit_code,
            "configs": [config.to_dict() for config in self.configs],
            "comparison": self.comparison.to_dict() if self.comparison else None,
        }


def build_report(
    suite: str,
    source: str,
    results: Iterable[AttemptResult],
    *,
    cases: Sequence[str],
    configs: Mapping[str, Mapping[str, Any]],
) -> EvalReport:
    """The report of ``results``: a ConfigReport per configuration (in ``configs``' order,
    each with its settings), its cases in ``cases``' order; a comparison when there are
    two configurations (the first is the baseline). Attempts are sorted by case, then
    attempt number."""
    every = sorted(results, key=lambda r: (cases.index(r.case), r.attempt))
    reports = []
    for name, settings in configs.items():
        mine = tuple(r for r in every if r.config == name)
        by_case = {case: [r for r in mine if r.case == case] for case in cases}
        reports.append(
            ConfigReport(
                name=name,
                settings=settings,
                cases={case: summarize(rs) for case, rs in by_case.items() if rs},
                total=summarize(mine),
                attempts=mine,
            )
        )
    comparison = None
    if len(reports) == 2:
        base, cand = reports
        comparison = Comparison(
            baseline=base.name,
            candidate=cand.name,
            cases={
                case: difference(
                    [r for r in base.attempts if r.case == case],
                    [r for r in cand.attempts if r.case == case],
                )
                for case in cases
                if case in base.cases and case in cand.cases
            },
            total=difference(base.attempts, cand.attempts),
        )
    return EvalReport(suite=suite, source=source, configs=tuple(reports), comparison=comparison)


def junit_xml(report: EvalReport) -> str:
    """The report as JUnit XML: a ``testsuite`` per configuration, a ``testcase`` per
    attempt (``CASE #N``); a missed expectation is a ``failure`` whose type is the run's
    stop reason and whose message says how it missed."""
    root = ET.Element(
        "testsuites",
        name=report.suite,
        tests=str(sum(len(c.attempts) for c in report.configs)),
        failures=str(sum(not r.passed for c in report.configs for r in c.attempts)),
        time=_seconds(sum(r.wall_seconds for c in report.configs for r in c.attempts)),
    )
    for config in report.configs:
        classname = f"{report.suite}.{config.name}"
        suite = ET.SubElement(
            root,
            "testsuite",
            name=classname,
            tests=str(len(config.attempts)),
            failures=str(sum(not r.passed for r in config.attempts)),
            errors="0",
            skipped="0",
            time=_seconds(sum(r.wall_seconds for r in config.attempts)),
        )
        properties = ET.SubElement(suite, "properties")
        ET.SubElement(properties, "property", name="config", value=config.name)
        for key, value in config.settings.items():
            if value not in (None, [], ()):
                shown = ",".join(value) if isinstance(value, list | tuple) else str(value)
                ET.SubElement(properties, "property", name=key, value=shown)
        for result in config.attempts:
            case = ET.SubElement(
                suite,
                "testcase",
                classname=classname,
                name=f"{result.case} #{result.attempt}",
                time=_seconds(result.wall_seconds),
            )
            if result.shortfall is not None:
                failure = ET.SubElement(
                    case, "failure", message=result.shortfall, type=result.stop_reason
                )
                failure.text = (
                    f"run {result.run_id}: {result.status} ({result.stop_reason}); "
                    f"outcome {result.outcome or 'none'}"
                )
            out = ET.SubElement(case, "system-out")
            out.text = (
                f"run {result.run_id} ({result.status}, {result.stop_reason}): "
                f"{result.steps} steps, {result.tokens} tokens, ${result.cost:.4f}; "
                f"keel show {result.run_id}"
            )
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _seconds(value: float) -> str:
    return f"{value:.3f}"


__all__ = [
    "AttemptResult",
    "Comparison",
    "ConfigReport",
    "Difference",
    "EvalReport",
    "MeanDifference",
    "Spread",
    "Summary",
    "build_report",
    "difference",
    "junit_xml",
    "summarize",
]
