"""`keel eval SUITE` as a person (or CI) runs it: real subprocesses, a real SQLite file,
the real tools and verifiers; only the model's turns are scripted."""

from __future__ import annotations

import json
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from keel.demo.story import SAMPLE, remediation_turns
from keel.testing.cli import DONE, KeelWorkspace, call, expect, one_line_error, turn

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "eval"


@pytest.fixture
def ws(tmp_path: Path) -> KeelWorkspace:
    """The attempts' workspaces go to a new folder under the test's TMPDIR."""
    (tmp_path / "tmp").mkdir()
    return KeelWorkspace(tmp_path, env={"TMPDIR": str(tmp_path / "tmp")})


def report_of(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    report: dict[str, Any] = json.loads(result.stdout)
    return report


def cases_of(report: dict[str, Any], config: int = 0) -> dict[str, dict[str, Any]]:
    return {c["case"]: c for c in report["configs"][config]["cases"]}


def test_the_example_suite_passes_offline_and_its_runs_are_tagged_in_the_store(
    ws: KeelWorkspace, tmp_path: Path
) -> None:
    junit = tmp_path / "eval.xml"
    suite = str(EXAMPLE / "suite.toml")
    result = ws.keel("eval", suite, "--repetitions", "2", "--json", "--junit", str(junit))
    report = report_of(result)
    expect(result, 0)
    assert report["passed"] is True and report["suite"] == "examples"
    cases = cases_of(report)
    assert list(cases) == ["fix-pin", "fix-median", "add-changelog", "shorten-sessions"]
    for case in cases.values():
        assert (case["attempts"], case["passed"], case["pass_rate"]) == (2, 2, 1.0)
        assert case["pass_rate_ci95"]["low"] == pytest.approx(0.3424, abs=1e-4)  # Wilson 2/2
    assert cases["fix-pin"]["stop_reasons"] == {"verified": 2}
    assert cases["shorten-sessions"]["stop_reasons"] == {"signoff:security": 2}
    assert cases["fix-median"]["tokens"] == {"median": 5940.0, "mean": 5940.0}
    total = report["configs"][0]["total"]
    assert (total["attempts"], total["passed"]) == (8, 8)
    assert total["pass_rate_ci95"]["low"] == pytest.approx(0.6756, abs=1e-4)  # Wilson 8/8
    fix_pin = cases["fix-pin"]["results"][0]
    assert fix_pin["outcome"] == "change_ready_for_approval" and fix_pin["steps"] == 10
    assert Path(fix_pin["workspace"], "tests", "test_dependencies.py").is_file()
    assert {a["workspace"] for c in cases.values() for a in c["results"]}.__len__() == 8

    root = ET.parse(junit).getroot()
    assert (root.get("tests"), root.get("failures")) == ("8", "0")
    assert [s.get("name") for s in root.findall("testsuite")] == ["examples.default"]

    tagged = json.loads(expect(ws.keel("runs", "--tag", "suite=examples", "--json"), 0))
    assert len(tagged) == 8
    one = json.loads(
        expect(ws.keel("runs", "--tag", "case=fix-pin", "--tag", "attempt=2", "--json"), 0)
    )
    assert [r["run_id"] for r in one] == [cases["fix-pin"]["results"][1]["run_id"]]
    shown = json.loads(expect(ws.keel("show", fix_pin["run_id"], "--json"), 0))
    assert shown["options"]["tags"] == {
        "suite": "examples",
        "case": "fix-pin",
        "attempt": "1",
        "config": "default",
    }
    assert set(shown["evidence"]) >= {"unit_tests", "security_check"}


def test_the_human_report_names_cases_pass_rates_and_the_verdict(ws: KeelWorkspace) -> None:
    out = expect(ws.keel("eval", str(EXAMPLE / "suite.toml"), "-n", "1", "-k", "2"), 0)
    assert "examples — configuration default" in out
    for line in ("fix-pin  ", "shorten-sessions", "total"):
        assert line in out
    assert "100% (21, 100)" in out  # Wilson 1/1
    assert "passed: 4/4 attempts met their expectation" in out
    assert "keel runs --tag suite=examples" in out


def test_the_example_fixture_and_script_are_the_demos_story() -> None:
    """The example's inventory case is `keel demo`'s story: its files and its turns."""
    fixture = EXAMPLE / "fixtures" / "inventory"
    mine = sorted(p.relative_to(fixture) for p in fixture.rglob("*") if p.is_file())
    demo = sorted(
        p.relative_to(SAMPLE)
        for p in SAMPLE.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )
    assert mine == demo
    for path in demo:
        assert (fixture / path).read_bytes() == (SAMPLE / path).read_bytes(), path
    script = json.loads((EXAMPLE / "scripts" / "fix-pin.json").read_text(encoding="utf-8"))
    assert script == remediation_turns("python3")


def failing_suite(ws: KeelWorkspace) -> Path:
    (ws.root / "ws").mkdir()
    (ws.root / "ws" / "README").write_text("fixture\n", encoding="utf-8")
    writes = ws.script(turn(call("write_file", path="fix.txt", content="fixed\n")), DONE)
    suite = ws.root / "failing.toml"
    suite.write_text(
        f"""
name = "failing"
[defaults]
workspace = "ws"
model = "{writes}"
verify = ["check=grep -q fixed fix.txt"]
[[cases]]
name = "right"
goal = "write fix.txt"
[[cases]]
name = "wrong-outcome"
goal = "write fix.txt"
expect = {{ outcome = "change_ready_for_approval" }}
[[cases]]
name = "verifier-cannot-run"
goal = "write fix.txt"
verify = ["lint=no-such-linter --strict"]
""",
        encoding="utf-8",
    )
    return suite


def test_a_case_made_to_fail_is_reported_failed_with_its_stop_reason(
    ws: KeelWorkspace, tmp_path: Path
) -> None:
    junit = tmp_path / "failing.xml"
    result = ws.keel("eval", str(failing_suite(ws)), "--json", "--junit", str(junit))
    expect(result, 1)
    report = report_of(result)
    assert report["passed"] is False and report["exit_code"] == 1
    cases = cases_of(report)
    assert cases["right"]["passed"] == 1
    wrong = cases["wrong-outcome"]["results"][0]
    assert (wrong["status"], wrong["passed"]) == ("completed", False)
    assert wrong["shortfall"] == "outcome task_completed, expected change_ready_for_approval"
    blocked = cases["verifier-cannot-run"]["results"][0]
    assert blocked["status"] == "blocked"
    assert blocked["reason"].startswith("unfixable_gap: lint")
    assert cases["verifier-cannot-run"]["stop_reasons"] == {"unfixable_gap": 1}

    root = ET.parse(junit).getroot()
    assert (root.get("tests"), root.get("failures")) == ("3", "2")
    by_name = {c.get("name"): c for c in root.iter("testcase")}
    assert by_name["right #1"].find("failure") is None
    failure = by_name["verifier-cannot-run #1"].find("failure")
    assert failure is not None and failure.get("type") == blocked["reason"]
    assert "expected completed" in (failure.get("message") or "")
    wrong_failure = by_name["wrong-outcome #1"].find("failure")
    assert wrong_failure is not None and wrong_failure.get("type") == "verified"

    human = ws.keel("eval", str(failing_suite_again(ws)))
    out = expect(human, 1)
    assert "failed wrong-outcome #1 [default]" in out
    assert "failed: 1/3 attempts met their expectation" in out


def failing_suite_again(ws: KeelWorkspace) -> Path:
    return ws.root / "failing.toml"


def test_compare_reports_the_known_difference_of_two_configurations(ws: KeelWorkspace) -> None:
    (ws.root / "ws").mkdir()
    completes = ws.script(
        {
            **turn(call("write_file", path="fix.txt", content="fixed\n")),
            "usage": {"input_tokens": 100, "output_tokens": 10},
        },
        {**DONE, "usage": {"input_tokens": 120, "output_tokens": 10}},
    )
    gives_up = ws.script({**DONE, "usage": {"input_tokens": 50, "output_tokens": 5}})
    suite = ws.root / "compare.toml"
    suite.write_text(
        f"""
repetitions = 5
[defaults]
workspace = "ws"
verify = ["check=grep -q fixed fix.txt"]
[[cases]]
name = "write-fix"
goal = "write fix.txt"
[[cases]]
name = "also-write-fix"
goal = "write fix.txt"
[configs.baseline]
model = "{completes}"
[configs.candidate]
model = "{gives_up}"
instructions = "Be quick."
""",
        encoding="utf-8",
    )
    result = ws.keel("eval", str(suite), "--compare", "baseline,candidate", "--json", "-k", "6")
    expect(result, 1)  # the candidate's attempts miss their expectation
    report = report_of(result)
    baseline, candidate = cases_of(report, 0), cases_of(report, 1)
    assert baseline["write-fix"]["pass_rate"] == 1.0 and candidate["write-fix"]["pass_rate"] == 0.0
    assert candidate["write-fix"]["stop_reasons"] == {"model_error": 5}  # no second turn
    comparison = report["comparison"]
    assert comparison["direction"] == "candidate - baseline"
    case = {c["case"]: c for c in comparison["cases"]}["write-fix"]
    assert case["pass_rate"]["difference"] == -1.0
    assert case["pass_rate"]["ci95"]["low"] == pytest.approx(-1.0)
    assert case["pass_rate"]["ci95"]["high"] == pytest.approx(-0.3855, abs=1e-4)  # Newcombe
    assert case["pass_rate"]["significant"] is True
    assert case["steps"]["difference"] == -1.0 and case["steps"]["significant"] is True
    assert case["tokens"]["difference"] == -185.0
    assert case["cost"] == {
        "difference": 0.0,
        "ci95": {"low": 0.0, "high": 0.0},
        "significant": False,
    }
    total = comparison["total"]
    assert total["pass_rate"]["difference"] == -1.0 and total["pass_rate"]["significant"]
    assert report["configs"][1]["settings"]["instructions"] == "Be quick."

    run_id = candidate["write-fix"]["results"][0]["run_id"]
    shown = json.loads(expect(ws.keel("show", run_id, "--json"), 0))
    assert shown["options"]["tags"]["config"] == "candidate"
    assert shown["goal"].startswith("Be quick.\n\nwrite fix.txt")

    human = expect(ws.keel("eval", str(suite), "--compare", "baseline,candidate", "-n", "2"), 1)
    assert "candidate - baseline (candidate minus baseline)" in human
    assert "-100 pts (-100, -7) *" in human  # Newcombe for 0/2 against 2/2
    assert "significant  write-fix: pass rate -100 pts, steps -1, tokens -185" in human


def test_a_git_case_checks_its_source_out_for_every_attempt(
    ws: KeelWorkspace, tmp_path: Path
) -> None:
    repo = ws.root / "repo"
    repo.mkdir()
    (repo / "README").write_text("a repository\n", encoding="utf-8")
    for argv in (
        ["git", "init", "--quiet", "--initial-branch", "main"],
        ["git", "add", "--all"],
        [
            "git",
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t.invalid",
            "commit",
            "--quiet",
            "-m",
            "first",
        ],
    ):
        subprocess.run(argv, cwd=repo, check=True, capture_output=True)
    ws.env["KEEL_GIT_WORKSPACES"] = str(tmp_path / "checkouts")
    model = ws.script(turn(call("write_file", path="fix.txt", content="fixed\n")), DONE)
    suite = ws.root / "git.toml"
    suite.write_text(
        f'repetitions = 2\n[[cases]]\nname = "in-git"\ngoal = "write fix.txt"\n'
        f'git = "repo@main"\nmodel = "{model}"\nverify = ["check=grep -q fixed fix.txt"]\n',
        encoding="utf-8",
    )
    result = ws.keel("eval", str(suite), "--json")
    expect(result, 0)
    report = report_of(result)
    attempts = cases_of(report)["in-git"]["results"]
    assert [a["status"] for a in attempts] == ["completed", "completed"]
    assert len({a["workspace"] for a in attempts}) == 2
    assert all(a["workspace"].startswith(str(tmp_path / "checkouts")) for a in attempts)


@pytest.mark.parametrize(
    ("suite", "extra", "message"),
    [
        ("colour = 1\n", (), "error: {file}: unknown key 'colour'; a suite has "),
        ('[[cases]]\nname = "c"\nworkspace = "ws"\n', (), "error: {file}: cases[0].goal: missing"),
        (
            '[[cases]]\nname = "c"\ngoal = "g"\nworkspace = "ws"\nbudget = {{ steps = -1 }}\n',
            (),
            "error: {file}: cases[0].budget.steps must be a whole number from 1 to ",
        ),
        (
            '[[cases]]\nname = "c"\ngoal = "g"\nworkspace = "ws"\nmodel = "scripted:m.json"\n'
            "[configs.a]\n[configs.b]\n",
            ("--compare", "a,c"),
            "error: {file}: --compare: no configuration 'c'; the suite has [configs.a], "
            "[configs.b]",
        ),
        (
            '[[cases]]\nname = "c"\ngoal = "g"\nworkspace = "nowhere"\nmodel = "scripted:m.json"\n',
            (),
            "error: {file}: cases[0].workspace: ",
        ),
        (
            '[[cases]]\nname = "c"\ngoal = "g"\nworkspace = "ws"\nmodel = "scripted:gone.json"\n',
            (),
            "error: {file}: cases[0].model: scripted model file ",
        ),
        (
            '[[cases]]\nname = "c"\ngoal = "g"\nworkspace = "ws"\nmodel = "scripted:m.json"\n'
            'mode = "yolo"\n',
            (),
            "error: {file}: cases[0].mode: unknown mode 'yolo'",
        ),
    ],
)
def test_a_bad_suite_file_is_one_line_naming_the_file_and_key(
    ws: KeelWorkspace, suite: str, extra: tuple[str, ...], message: str
) -> None:
    (ws.root / "ws").mkdir()
    (ws.root / "m.json").write_text(json.dumps([DONE]), encoding="utf-8")
    path = ws.root / "bad.toml"
    path.write_text(suite.replace("{{", "{").replace("}}", "}"), encoding="utf-8")
    line = one_line_error(ws.keel("eval", str(path), *extra))
    assert line.startswith(message.format(file=path)), line
    assert not (ws.root / ".keel" / "keel.db").exists()  # refused before a store is opened


def test_a_missing_suite_file_and_a_busy_workdir_are_refused(ws: KeelWorkspace) -> None:
    assert (
        one_line_error(ws.keel("eval", "nope.toml")) == "error: suite file nope.toml does not exist"
    )
    busy = ws.root / "busy"
    busy.mkdir()
    (busy / "x").write_text("", encoding="utf-8")
    shutil.copytree(EXAMPLE, ws.root / "example")
    line = one_line_error(
        ws.keel("eval", str(ws.root / "example" / "suite.toml"), "--workdir", str(busy))
    )
    assert line == f"error: --workdir {busy} is not empty; give a new or empty folder"
