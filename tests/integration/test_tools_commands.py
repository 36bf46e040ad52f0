"""run_command with real subprocesses: no shell, bounded time and output, no secrets."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from keel.core.errors import ToolArgumentError, ToolError
from keel.sandbox.base import Sandbox, SandboxSettings
from keel.sandbox.choose import open_sandbox
from keel.tools import ToolContext, ToolResult, default_registry
from keel.tools.commands import OUTPUT_MAX_CHARS, child_environment

PY = sys.executable


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root.resolve()


def run(ws: Path, argv: list[str], *, sandbox: Sandbox | None = None, **extra: Any) -> ToolResult:
    ctx = ToolContext(workspace=ws, run_id="run_1", call_id="c", owner="me", sandbox=sandbox)
    return default_registry().execute("run_command", {"argv": argv, **extra}, ctx)


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting for its reaper counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_runs_in_the_workspace_and_reports_exit_code(ws: Path) -> None:
    result = run(ws, [PY, "-c", "import os; print(os.getcwd())"])
    assert result.output.splitlines()[1] == str(ws)
    assert result.output.splitlines()[-1] == "[exit code 0]"
    assert result.data["exit_code"] == 0 and result.data["timed_out"] is False


def test_nonzero_exit_is_reported_with_stdout_and_stderr(ws: Path) -> None:
    code = "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"
    result = run(ws, [PY, "-c", code])
    lines = result.output.splitlines()
    assert sorted(lines[1:3]) == ["err", "out"]
    assert lines[-1] == "[exit code 3]"
    assert result.data["exit_code"] == 3


def test_arguments_reach_the_program_literally(ws: Path) -> None:
    tricky = ["a; touch pwned", "$(touch pwned2)", "`touch pwned3`", "*", "x | y", "$HOME"]
    result = run(ws, [PY, "-c", "import sys, json; print(json.dumps(sys.argv[1:]))", *tricky])
    assert json.loads(result.output.splitlines()[1]) == tricky
    assert sorted(os.listdir(ws)) == []


def test_long_output_is_cut_in_the_middle_with_an_explicit_note(ws: Path) -> None:
    result = run(ws, [PY, "-c", "print('A' * 50000 + 'B' * 50000)"])
    total = 100_001  # with the newline
    omitted = total - OUTPUT_MAX_CHARS
    assert f"[output truncated: {omitted} characters omitted]" in result.output
    head, tail = result.output.split(f"\n[output truncated: {omitted} characters omitted]\n")
    assert head.endswith("A" * (OUTPUT_MAX_CHARS // 2))
    assert tail.startswith("B") and "[exit code 0]" in tail
    assert len(result.output) < OUTPUT_MAX_CHARS + 200


def test_timeout_kills_the_command_and_its_children(ws: Path) -> None:
    script = "sleep 30 & echo $! > child.pid; wait"
    started = time.monotonic()
    result = run(ws, ["sh", "-c", script], timeout_seconds=0.5)
    assert time.monotonic() - started < 10
    assert result.data["timed_out"] is True
    assert "[timed out after 0.5 s: the command and its child processes were killed]" in (
        result.output
    )
    child = int((ws / "child.pid").read_text())
    deadline = time.monotonic() + 5
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child)


def test_returns_when_the_program_exits_even_if_a_helper_keeps_the_output(ws: Path) -> None:
    started = time.monotonic()
    result = run(
        ws, ["sh", "-c", "sleep 20 & echo $! > helper.pid; echo started"], timeout_seconds=15
    )
    helper = int((ws / "helper.pid").read_text())
    try:
        assert time.monotonic() - started < 10
        assert result.data["timed_out"] is False
        assert result.data["exit_code"] == 0
        assert "started" in result.output
        assert "processes it left running" in result.output
        assert not alive(helper)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(helper, 9)


def test_secret_looking_variables_do_not_reach_the_child(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KEELT_API_KEY", "sk-should-not-leak")
    monkeypatch.setenv("KEELT_GITHUB_TOKEN", "ghp-should-not-leak")
    monkeypatch.setenv("keelt_db_password", "hunter2")
    monkeypatch.setenv("KEELT_AWS_SECRET_ACCESS", "aws-should-not-leak")
    monkeypatch.setenv("KEELT_PLAIN", "visible")
    code = "import os; print(sorted(k for k in os.environ if k.upper().startswith('KEELT_')))"
    passing_plain = open_sandbox(SandboxSettings(mode="off", env=("KEELT_PLAIN",)))
    result = run(ws, [PY, "-c", code], sandbox=passing_plain)
    assert result.output.splitlines()[1] == "['KEELT_PLAIN']"
    for leaked in ("sk-should", "ghp-should", "hunter2", "aws-should"):
        assert leaked not in result.output


def test_child_environment_filter_keeps_ordinary_variables() -> None:
    env = {"PATH": "/bin", "HOME": "/h", "OPENAI_API_KEY": "x", "Session_Token": "y", "LANG": "C"}
    assert child_environment(env) == {"PATH": "/bin", "HOME": "/h", "LANG": "C"}


def test_missing_executable_is_a_clear_error(ws: Path) -> None:
    with pytest.raises(ToolError) as info:
        run(ws, ["definitely-not-a-program-xyz", "--help"])
    assert str(info.value).startswith("command not found: 'definitely-not-a-program-xyz'")


def test_non_executable_file_is_a_clear_error(ws: Path) -> None:
    (ws / "script.sh").write_text("echo hi\n")
    with pytest.raises(ToolError, match=r"'\./script\.sh' is not executable"):
        run(ws, ["./script.sh"])


def test_timeout_is_capped_and_arguments_are_validated(ws: Path) -> None:
    assert "[timeout_seconds capped at 600]" in run(ws, ["true"], timeout_seconds=1e6).output
    with pytest.raises(ToolArgumentError, match="timeout_seconds: Input should be greater than 0"):
        run(ws, ["true"], timeout_seconds=0)
    with pytest.raises(ToolArgumentError, match="argv: List should have at least 1 item"):
        run(ws, [])
    with pytest.raises(ToolArgumentError, match="argv: Input should be a valid list"):
        default_registry().parse_arguments("run_command", '{"argv": "rm -rf /"}')


def test_stdin_is_closed(ws: Path) -> None:
    result = run(ws, [PY, "-c", "import sys; print(repr(sys.stdin.read()))"], timeout_seconds=10)
    assert result.output.splitlines()[1] == "''"
