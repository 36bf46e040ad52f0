"""Policy files end to end: deny beats allow through the loop, a forbidden goal ends blocked.

Real `keel` processes (stdin /dev/null) on a real SQLite file; scripted model turns.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from keel.core.events import EventType
from keel.core.status import RunStatus
from keel.store.url import open_store
from keel.testing.cli import (
    DONE,
    KeelWorkspace,
    expect,
    flat,
    one_line_error,
    run_command_call,
    turn,
)

POLICY = """\
[[rule]]
action = "allow"
tool = "run_command"

[[rule]]
action = "deny"
argv = ["touch", "forbidden*"]
reason = "forbidden files stay out of this workspace"
"""


@pytest.fixture
def ws(tmp_path: Path) -> KeelWorkspace:
    root = tmp_path / "workspace"
    root.mkdir()
    return KeelWorkspace(root)


def policy_flags(ws: KeelWorkspace, source: str, text: str) -> tuple[list[str], Path]:
    """Put ``text`` where ``source`` says; the flags ``keel run`` needs and the file's path."""
    if source == "workspace":
        path = ws.root / ".keel" / "policy.toml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        return [], path
    path = ws.root.parent / "team-policy.toml"
    path.write_text(text)
    return ["--policy", str(path)], path


@pytest.mark.parametrize("source", ["workspace", "flag"])
def test_deny_beats_allow_and_insisting_on_a_denied_call_ends_the_run_blocked(
    ws: KeelWorkspace, source: str
) -> None:
    flags, path = policy_flags(ws, source, POLICY)
    forbidden = turn(run_command_call("touch", "forbidden.txt"))
    model = ws.script(turn(run_command_call("touch", "allowed.txt")), *[forbidden] * 3, DONE)

    run_id, result = ws.start("touch files", "--model", model, *flags)

    out = flat(expect(result, 4))
    assert "blocked" in out and "forbidden files stay out of this workspace" in out
    assert (ws.root / "allowed.txt").exists()  # allowed by the rule: no approval asked
    assert not (ws.root / "forbidden.txt").exists()
    assert ws.of_type(run_id, EventType.APPROVAL_REQUESTED) == []
    denials = ws.of_type(run_id, EventType.TOOL_FAILED)
    assert len(denials) == 3
    for denial in denials:
        assert denial.data["error_kind"] == "policy_denied"
        assert f"{path}:5" in denial.data["message"]  # the deny rule's file and line
    state = ws.state(run_id)
    assert state.status is RunStatus.BLOCKED
    assert state.reason is not None and "forbidden files stay out" in state.reason
    expect(ws.keel("resume", run_id), 4)  # blocked is final


@pytest.mark.parametrize(
    ("source", "text", "line", "words"),
    [
        ("workspace", '[[rule]]\ntool = "run_command"\naction = "permit"\n', 3, "action must be"),
        ("flag", '[[rule]]\naction = "deny"\ntool = [unclosed\n', 3, "invalid TOML"),
        ("flag", '\n[[rule]]\naction = "deny"\n', 2, "needs at least one of tool, argv, path"),
    ],
    ids=["workspace-bad-action", "flag-bad-toml", "flag-no-matcher"],
)
def test_a_malformed_policy_file_stops_keel_run_with_its_file_and_line(
    ws: KeelWorkspace, source: str, text: str, line: int, words: str
) -> None:
    flags, path = policy_flags(ws, source, text)
    model = ws.script(DONE)

    result = ws.keel("run", "anything", "--model", model, *flags)

    error = one_line_error(result)
    assert f"{path}:{line}:" in error and words in error
    store = open_store(ws.url)
    try:
        assert store.list_runs() == []  # no run was recorded
    finally:
        store.close()
