"""`keel run --verify NAME=CMD --verify-human NAME --outcome X`, `keel approve --verifier`,
`keel show` listing evidence by name and `keel artifact` opening it — as a person types
them, in real subprocesses on a real SQLite file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from keel.testing.cli import DONE, KeelWorkspace, call, expect, one_line_error, turn


@pytest.fixture
def ws(tmp_path: Path) -> KeelWorkspace:
    return KeelWorkspace(tmp_path)


def test_a_signed_off_run_shows_named_evidence_that_keel_artifact_opens(
    ws: KeelWorkspace, tmp_path: Path
) -> None:
    model = ws.script(turn(call("write_file", path="fix.txt", content="fixed\n")), DONE)
    started = ws.keel(
        "run",
        "fix it",
        "--model",
        model,
        "--verify",
        "unit_tests=grep -q fixed fix.txt",
        "--verify-human",
        "security",
        "--outcome",
        "change_ready_for_approval",
    )
    out = expect(started, 3)  # waiting for a person
    run_id = out.splitlines()[0].strip()
    assert "keel approve" in out and "--verifier security" in out

    shown = expect(ws.keel("show", run_id), 0)
    assert "sign-off of security" in shown

    expect(ws.keel("approve", run_id, "--verifier", "security"), 0)
    done = json.loads(expect(ws.keel("resume", run_id, "--json"), 0).splitlines()[-1])
    assert done["status"] == "completed"
    assert done["result"]["outcome"] == "change_ready_for_approval"
    assert set(done["evidence"]) == {"unit_tests", "security"}

    listed = expect(ws.keel("show", run_id), 0)
    assert "evidence  unit_tests: artifact:" in listed
    assert "outcome   change_ready_for_approval" in listed

    log_id = done["evidence"]["unit_tests"].removeprefix("artifact:")
    printed = expect(ws.keel("artifact", log_id), 0)
    assert printed.startswith("$ grep -q fixed fix.txt\n[exit code 0]")
    saved = tmp_path / "signoff.json"
    signoff_id = done["evidence"]["security"]
    expect(ws.keel("artifact", signoff_id, "--output", str(saved)), 0)
    assert json.loads(saved.read_text())["verifier"] == "security"
    again = one_line_error(ws.keel("artifact", signoff_id, "--output", str(saved)))
    assert again == f"error: {saved} exists; pass --force to replace it"


def test_bad_verifier_names_and_unknown_artifacts_are_one_line_errors(ws: KeelWorkspace) -> None:
    model = ws.script(DONE)
    same = one_line_error(
        ws.keel("run", "x", "--model", model, "--verify", "a=true", "--verify", "a=false")
    )
    assert same == "error: two verifiers are named 'a'; give each its own name"
    clash = one_line_error(
        ws.keel("run", "x", "--model", model, "--verify", "a=true", "--verify-human", "a")
    )
    assert clash == "error: 'a' names both a command verifier and a sign-off"
    outcome = one_line_error(ws.keel("run", "x", "--model", model, "--outcome", "Not OK"))
    assert outcome.startswith("error: an outcome is a lowercase name")
    expect(ws.keel("run", "x", "--model", model), 0)  # a store now exists
    missing = one_line_error(ws.keel("artifact", "art_nope"))
    assert "no artifact with id 'art_nope'" in missing
