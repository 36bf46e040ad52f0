"""Workspace confinement through the whole loop: escapes are refused, the model is told.

Even in ``auto`` mode, a read or write through ``..``, an absolute path outside the
workspace or a symlink leading out is refused; the refusal reaches the model as a tool
error in its next request, the run goes on, and nothing outside the workspace changes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from keel.core.events import EventType
from keel.core.status import RunStatus
from keel.models.scripted import ScriptedModel
from keel.runtime.harness import Harness


@pytest.fixture
def sandbox(tmp_path: Path) -> tuple[Path, Path]:
    """(workspace, outside): a workspace with symlinks into a sibling folder."""
    workspace = tmp_path / "ws"
    outside = tmp_path / "outside"
    workspace.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("TOP SECRET\n", encoding="utf-8")
    (workspace / "inside.txt").write_text("fine\n", encoding="utf-8")
    (workspace / "out_dir").symlink_to(outside, target_is_directory=True)
    (workspace / "out_file").symlink_to(outside / "secret.txt")
    return workspace, outside


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/keel.db"


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


ESCAPES: list[tuple[str, dict[str, Any]]] = [
    ("read_file", {"path": "../outside/secret.txt"}),
    ("read_file", {"path": "{outside}/secret.txt"}),
    ("read_file", {"path": "out_file"}),
    ("read_file", {"path": "out_dir/secret.txt"}),
    ("write_file", {"path": "../outside/x.txt", "content": "pwned"}),
    ("write_file", {"path": "{outside}/x.txt", "content": "pwned"}),
    ("write_file", {"path": "out_dir/x.txt", "content": "pwned"}),
    ("write_file", {"path": "out_file", "content": "pwned"}),
    ("edit_file", {"path": "out_file", "old_text": "TOP", "new_text": "NO"}),
    ("list_dir", {"path": "out_dir"}),
]


@pytest.mark.parametrize(
    ("tool", "arguments"), ESCAPES, ids=[f"{t}:{a['path']}" for t, a in ESCAPES]
)
def test_an_escape_is_refused_the_model_is_told_and_nothing_outside_changes(
    store_url: str, sandbox: tuple[Path, Path], tool: str, arguments: dict[str, Any]
) -> None:
    workspace, outside = sandbox
    args = {k: v.replace("{outside}", str(outside)) for k, v in arguments.items()}
    before = snapshot(outside)
    model = ScriptedModel([{"tool_calls": [{"name": tool, "arguments": args}]}, {"content": "ok"}])
    with Harness(store=store_url, model=model) as harness:
        outcome = harness.run("look around", cwd=workspace, mode="auto")
        events = list(harness.events(outcome.id))

    assert outcome.status is RunStatus.COMPLETED  # the refusal is an observation, not a crash
    assert snapshot(outside) == before
    assert outcome.state.changed_files == {}
    [failed] = [e for e in events if e.type is EventType.TOOL_FAILED]
    assert failed.data["error_kind"] in ("policy_denied", "tool_error")
    told = [m for m in model.requests[1].messages if m.role == "tool"]
    assert len(told) == 1 and told[0].content is not None
    assert told[0].content.startswith("error (")
    assert "outside the workspace" in told[0].content
    assert "TOP SECRET" not in told[0].content


def test_an_absolute_path_inside_the_workspace_is_allowed(
    store_url: str, sandbox: tuple[Path, Path]
) -> None:
    workspace, _ = sandbox
    target = str(workspace.resolve() / "inside.txt")
    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "write_file", "arguments": {"path": target, "content": "x"}}]},
            {"content": "ok"},
        ]
    )
    with Harness(store=store_url, model=model) as harness:
        outcome = harness.run("write", cwd=workspace, mode="auto")

    assert outcome.status is RunStatus.COMPLETED
    assert (workspace / "inside.txt").read_text() == "x"
    assert list(outcome.state.changed_files) == ["inside.txt"]
