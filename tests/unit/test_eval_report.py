"""The eval report: summaries, comparisons and JUnit XML."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

import pytest

from keel.core.eval_report import AttemptResult, build_report, junit_xml, summarize
from keel.core.intervals import newcombe, wilson


def make_attempt(**overrides: Any) -> AttemptResult:
    values: dict[str, Any] = {
        "config": "default",
        "case": "fix",
        "attempt": 1,
        "run_id": "run_1",
        "status": "completed",
        "reason": "verified",
        "outcome": "task_completed",
        "shortfall": None,
        "steps": 4,
        "tokens": 100,
        "cost": 0.01,
        "wall_seconds": 1.0,
    }
    values.update(overrides)
    return AttemptResult(**values)


def failed(**overrides: Any) -> AttemptResult:
    return make_attempt(
        status="failed",
        reason="model_error: HTTP 429",
        outcome=None,
        shortfall="ended failed (model_error: HTTP 429), expected completed",
        **overrides,
    )


def test_a_summary_gives_the_pass_rate_interval_medians_means_and_reason_kinds() -> None:
    results = [
        make_attempt(attempt=1, steps=2),
        make_attempt(attempt=2, steps=4),
        failed(attempt=3, steps=9),
        make_attempt(
            attempt=4, steps=5, reason="budget_exhausted:steps", status="failed", shortfall="x"
        ),
    ]
    summary = summarize(results)
    assert (summary.passed, summary.attempts, summary.pass_rate) == (2, 4, 0.5)
    assert summary.interval == wilson(2, 4)
    assert summary.spreads["steps"].median == 4.5 and summary.spreads["steps"].mean == 5.0
    assert summary.stop_reasons == {"verified": 2, "budget_exhausted:steps": 1, "model_error": 1}


def test_a_comparison_reports_candidate_minus_baseline_per_case_and_in_total() -> None:
    good = [
        make_attempt(config="a", case=c, attempt=i, steps=3 + i % 2)
        for c in ("x", "y")
        for i in range(1, 6)
    ]
    bad = [failed(config="b", case="x", attempt=i, steps=1) for i in range(1, 6)] + [
        make_attempt(config="b", case="y", attempt=i, steps=3 + i % 2) for i in range(1, 6)
    ]
    report = build_report("s", "s.toml", good + bad, cases=["x", "y"], configs={"a": {}, "b": {}})
    comparison = report.comparison
    assert comparison is not None and (comparison.baseline, comparison.candidate) == ("a", "b")
    x, y = comparison.cases["x"], comparison.cases["y"]
    assert x.pass_rate == -1.0 and x.interval == newcombe(0, 5, 5, 5) and x.significant
    assert y.pass_rate == 0.0 and not y.significant
    assert x.means["steps"].difference == pytest.approx(1 - 3.6) and x.means["steps"].significant
    assert not y.means["steps"].significant
    assert comparison.total.pass_rate == -0.5 and comparison.total.significant
    assert not report.passed and report.exit_code == 1
    data = report.to_dict()
    assert data["comparison"]["direction"] == "b - a"
    assert data["comparison"]["total"]["pass_rate"]["significant"] is True
    assert [c["case"] for c in data["configs"][1]["cases"]] == ["x", "y"]


def test_a_report_passes_only_when_every_attempt_met_its_expectation() -> None:
    passing = build_report("s", "s.toml", [make_attempt()], cases=["fix"], configs={"default": {}})
    assert passing.passed and passing.exit_code == 0 and passing.comparison is None


def test_junit_has_a_testsuite_per_configuration_and_failures_carry_the_stop_reason() -> None:
    results = [make_attempt(config="a"), failed(config="a", attempt=2), make_attempt(config="b")]
    report = build_report(
        "s", "s.toml", results, cases=["fix"], configs={"a": {"model": "scripted:x"}, "b": {}}
    )
    root = ET.fromstring(junit_xml(report))
    assert root.tag == "testsuites" and root.get("tests") == "3" and root.get("failures") == "1"
    suites = root.findall("testsuite")
    assert [s.get("name") for s in suites] == ["s.a", "s.b"]
    cases = suites[0].findall("testcase")
    assert [c.get("name") for c in cases] == ["fix #1", "fix #2"]
    assert cases[0].find("failure") is None
    failure = cases[1].find("failure")
    assert failure is not None and failure.get("type") == "model_error: HTTP 429"
    assert failure.get("message") == "ended failed (model_error: HTTP 429), expected completed"
    model = suites[0].find("properties/property[@name='model']")
    assert model is not None and model.get("value") == "scripted:x"
