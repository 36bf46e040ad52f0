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
    assert [(s.get("tests"), s.get("failures")) for s in suites] == [("2", "1"), ("1", "0")]
    cases = suites[0].findall("testcase")
    assert [c.get("name") for c in cases] == ["fix #1", "fix #2"]
    assert cases[0].find("failure") is None
    failure = cases[1].find("failure")
    assert failure is not None and failure.get("type") == "model_error: HTTP 429"
    assert failure.get("message") == "ended failed (model_error: HTTP 429), expected completed"
    model = suites[0].find("properties/property[@name='model']")
    assert model is not None and model.get("value") == "scripted:x"


def test_the_json_report_holds_every_attempt_summary_and_difference() -> None:
    results = [
        make_attempt(config="a", case="x", attempt=1, workspace="/tmp/w1", tool_calls=2),
        failed(config="a", case="x", attempt=2, run_id="run_2"),
        make_attempt(config="a", case="y", attempt=1, run_id="run_3"),
        make_attempt(config="b", case="x", attempt=1, run_id="run_4", steps=6),
        make_attempt(config="b", case="x", attempt=2, run_id="run_5", steps=8),
        make_attempt(config="b", case="y", attempt=1, run_id="run_6"),
    ]
    report = build_report(
        "suite",
        "evals/suite.toml",
        reversed(results),
        cases=["x", "y"],
        configs={"a": {"model": "m1"}, "b": {}},
    )
    data = report.to_dict()
    assert {k: data[k] for k in ("suite", "file", "passed", "exit_code")} == {
        "suite": "suite",
        "file": "evals/suite.toml",
        "passed": False,
        "exit_code": 1,
    }
    a, b = data["configs"]
    assert (a["name"], a["settings"], b["settings"]) == ("a", {"model": "m1"}, {})
    assert a["cases"][0]["results"][0] == {
        "config": "a",
        "case": "x",
        "attempt": 1,
        "run_id": "run_1",
        "status": "completed",
        "reason": "verified",
        "outcome": "task_completed",
        "passed": True,
        "shortfall": None,
        "steps": 4,
        "tool_calls": 2,
        "tokens": 100,
        "cost": 0.01,
        "wall_seconds": 1.0,
        "workspace": "/tmp/w1",
    }
    assert [r["run_id"] for c in a["cases"] for r in c["results"]] == ["run_1", "run_2", "run_3"]
    x = a["cases"][0]
    assert {k: x[k] for k in ("case", "attempts", "passed", "pass_rate", "pass_rate_ci95")} == {
        "case": "x",
        "attempts": 2,
        "passed": 1,
        "pass_rate": 0.5,
        "pass_rate_ci95": wilson(1, 2).to_dict(),
    }
    assert x["steps"] == {"median": 4.0, "mean": 4.0}
    assert set(x) >= {"tokens", "cost", "wall_seconds"}
    assert x["stop_reasons"] == {"model_error": 1, "verified": 1}
    assert a["total"]["attempts"] == 3 and "results" not in a["total"]
    comparison = data["comparison"]
    assert (comparison["baseline"], comparison["candidate"]) == ("a", "b")
    [cx, cy] = comparison["cases"]
    assert (cx["case"], cy["case"]) == ("x", "y")
    assert cx["pass_rate"] == {
        "difference": 0.5,
        "ci95": newcombe(2, 2, 1, 2).to_dict(),
        "significant": newcombe(2, 2, 1, 2).excludes_zero,
    }
    assert cx["steps"]["difference"] == 3.0 and cx["steps"]["ci95"] is not None
    assert cy["steps"] == {"difference": 0.0, "ci95": None, "significant": False}
    assert set(comparison["total"]) == {"pass_rate", "steps", "tokens", "cost"}


def test_stop_reasons_are_counted_most_frequent_first_then_by_name() -> None:
    results = [
        failed(attempt=1),
        make_attempt(attempt=2, reason="zeta", shortfall="x"),
        make_attempt(attempt=3, reason="alpha", shortfall="x"),
        failed(attempt=4),
    ]
    assert list(summarize(results).stop_reasons.items()) == [
        ("model_error", 2),
        ("alpha", 1),
        ("zeta", 1),
    ]


def test_one_configuration_has_no_comparison_and_cases_without_attempts_are_left_out() -> None:
    report = build_report(
        "s", "s.toml", [make_attempt(config="a", case="y")], cases=["x", "y"], configs={"a": {}}
    )
    data = report.to_dict()
    assert data["comparison"] is None
    assert [c["case"] for c in data["configs"][0]["cases"]] == ["y"]
    two = build_report(
        "s",
        "s.toml",
        [make_attempt(config="a", case="x"), make_attempt(config="b", case="y")],
        cases=["x", "y"],
        configs={"a": {}, "b": {}},
    )
    assert two.comparison is not None and dict(two.comparison.cases) == {}


def test_junit_counts_times_and_describes_every_attempt() -> None:
    results = [
        make_attempt(config="a", wall_seconds=1.25),
        failed(
            config="a", attempt=2, run_id="run_2", wall_seconds=0.5, steps=3, tokens=70, cost=0.125
        ),
    ]
    report = build_report(
        "s",
        "s.toml",
        results,
        cases=["fix"],
        configs={"a": {"tools": ["read_file", "grep"], "none": None, "empty": []}},
    )
    text = junit_xml(report)
    assert text.startswith("<?xml version='1.0' encoding='utf-8'?>\n<testsuites")
    root = ET.fromstring(text)
    assert (root.get("name"), root.get("time")) == ("s", "1.750")
    [suite] = root.findall("testsuite")
    assert {k: suite.get(k) for k in ("tests", "failures", "errors", "skipped", "time")} == {
        "tests": "2",
        "failures": "1",
        "errors": "0",
        "skipped": "0",
        "time": "1.750",
    }
    properties = {p.get("name"): p.get("value") for p in suite.findall("properties/property")}
    assert properties == {"config": "a", "tools": "read_file,grep"}
    ok, bad = suite.findall("testcase")
    assert (ok.get("classname"), ok.get("time")) == ("s.a", "1.250")
    failure = bad.find("failure")
    assert failure is not None
    assert failure.text == "run run_2: failed (model_error: HTTP 429); outcome none"
    out = bad.find("system-out")
    assert out is not None
    assert out.text == (
        "run run_2 (failed, model_error: HTTP 429): 3 steps, 70 tokens, $0.1250; keel show run_2"
    )
