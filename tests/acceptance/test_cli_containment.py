"""The attacks that broke containment, replayed end to end through `keel run`.

Real `keel` processes on a real SQLite file, real commands under the real sandbox
(bubblewrap where it works); only the model's turns are scripted — and they are
hostile: they plant a `diff.external` program, overwrite the store and the policy,
write the plan through a symlink, and run commands that reach outside.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from keel.core.events import EventType
from keel.core.status import RunStatus
from keel.testing.cli import DONE, KeelWorkspace, call, expect, flat, one_line_error, turn

HAS_BWRAP = shutil.which("bwrap") is not None
needs_bwrap = pytest.mark.skipif(not HAS_BWRAP, reason="bubblewrap is not installed")


@pytest.fixture
def ws(tmp_path: Path) -> KeelWorkspace:
    root = tmp_path / "workspace"
    root.mkdir()
    return KeelWorkspace(root)


@pytest.fixture
def no_bwrap_path(tmp_path: Path) -> str:
    """A PATH with every program of this machine's PATH except bwrap."""
    bin_dir = tmp_path / "bin-without-bwrap"
    bin_dir.mkdir()
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        if not os.path.isdir(folder):
            continue
        for name in os.listdir(folder):
            target = bin_dir / name
            if name != "bwrap" and not target.exists():
                target.symlink_to(os.path.join(folder, name))
    return str(bin_dir)


def git_repo(root: Path) -> None:
    """A real repository with one commit, made without any of the caller's git config."""
    env = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}
    (root / "app.txt").write_text("v1\n")
    for argv in (
        ["git", "init", "-q"],
        ["git", "add", "app.txt"],
        ["git", "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "init"],
    ):
        subprocess.run(argv, cwd=root, env=env, check=True)


def test_a_planted_diff_program_never_runs_and_the_store_and_policy_stay_intact(
    ws: KeelWorkspace, tmp_path: Path
) -> None:
    git_repo(ws.root)
    marker = tmp_path / "pwned"
    evil = f"[diff]\n\texternal = sh -c 'touch {marker}'\n[core]\n\tfsmonitor = touch {marker}\n"
    (ws.root / ".keel").mkdir()
    (ws.root / ".keel" / "policy.toml").write_text(
        '[[rule]]\naction = "deny"\ntool = "run_command"\nargv = "git push*"\n'
    )
    original_config = (ws.root / ".git" / "config").read_text()
    model = ws.script(
        turn(call("write_file", path=".git/config", content=evil)),
        turn(call("write_file", path=".keel/keel.db", content="gone")),
        turn(call("write_file", path=".keel/policy.toml", content="")),
        turn(call("edit_file", path="app.txt", old_text="v1", new_text="v2")),
        DONE,
    )
    run_id, result = ws.start(
        "change the app", "--model", model, "--mode", "edit", "--verify", "grep -q v2 app.txt"
    )
    expect(result, 0)
    failures = ws.of_type(run_id, EventType.TOOL_FAILED)
    assert [f.data["error_kind"] for f in failures] == ["policy_denied"] * 3
    assert all("protected" in f.data["message"] for f in failures)
    assert (ws.root / ".git" / "config").read_text() == original_config
    assert "git push" in (ws.root / ".keel" / "policy.toml").read_text()
    assert ws.state(run_id).status is RunStatus.COMPLETED  # the store is whole
    assert not marker.exists()  # verification and its diff ran nothing of the model's


@needs_bwrap
def test_commands_cannot_write_git_config_keel_or_outside_even_in_auto_mode(
    ws: KeelWorkspace, tmp_path: Path
) -> None:
    git_repo(ws.root)
    outside = tmp_path / "outside.txt"
    planted = tmp_path / "planted.txt"
    planted.write_text("a file of the host\n")
    refused = [
        f"echo evil >> {ws.root / '.git' / 'config'}",
        f"echo evil > {ws.root / '.keel' / 'keel.db'}",
        f"mkdir -p .git/hooks && echo 'touch {outside}' > .git/hooks/pre-commit",
        f"cat {planted}",
    ]
    model = ws.script(
        *(turn(call("run_command", argv=["sh", "-c", attempt])) for attempt in refused),
        # Inside the sandbox this lands in its private /tmp, never on the host.
        turn(call("run_command", argv=["sh", "-c", f"echo escaped > {outside}"])),
        turn(call("run_command", argv=["sh", "-c", "echo fine > built.txt"])),
        DONE,
    )
    run_id, result = ws.start(
        "try", "--model", model, "--mode", "auto", "--sandbox", "required", "--verify", "true"
    )
    expect(result, 0)
    finished = ws.of_type(run_id, EventType.TOOL_FINISHED)
    outputs = [f.data["output"] for f in finished if f.data["tool"] == "run_command"]
    assert len(outputs) == len(refused) + 2
    for output in outputs[: len(refused)]:
        assert "[exit code 0]" not in output, output
    assert "a file of the host" not in "".join(outputs)
    assert outputs[-1].endswith("[exit code 0]")
    assert (ws.root / "built.txt").read_text() == "fine\n"
    assert "evil" not in (ws.root / ".git" / "config").read_text()
    assert not (ws.root / ".git" / "hooks" / "pre-commit").exists()
    assert not outside.exists()
    started = ws.of_type(run_id, EventType.TOOL_STARTED)
    assert {s.data["sandbox"]["kind"] for s in started} == {"bubblewrap"}
    verified = ws.of_type(run_id, EventType.VERIFICATION_STARTED)
    assert verified[0].data["sandbox"]["kind"] == "bubblewrap"


def test_plan_write_cannot_follow_a_symlinked_plans_folder_out(
    ws: KeelWorkspace, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (ws.root / "plans").symlink_to(elsewhere)
    model = ws.script(turn(call("plan_write", content="- delete everything\n")), DONE)
    run_id, result = ws.start("plan it", "--model", model, "--mode", "plan", "--verify", "true")
    failed = ws.of_type(run_id, EventType.TOOL_FAILED)
    assert failed and failed[0].data["tool"] == "plan_write"
    assert "outside the workspace" in failed[0].data["message"]
    assert list(elsewhere.iterdir()) == []
    assert ws.state(run_id).plan is None
    expect(result, 0)


def test_plan_write_needs_approval_in_ask_mode(ws: KeelWorkspace) -> None:
    model = ws.script(turn(call("plan_write", content="- step\n")), DONE)
    run_id, result = ws.start("plan it", "--model", model, "--mode", "ask")
    expect(result, 3)
    assert ws.state(run_id).pending is not None
    assert not (ws.root / "plans").exists()


def test_required_sandbox_without_bubblewrap_refuses_to_start(
    ws: KeelWorkspace, no_bwrap_path: str
) -> None:
    ws.env["PATH"] = no_bwrap_path
    model = ws.script(DONE)
    line = one_line_error(ws.keel("run", "x", "--model", model, "--sandbox", "required"))
    assert "bubblewrap" in line and "apt-get install bubblewrap" in line
    assert not (ws.root / ".keel" / "keel.db").exists() or "run_" not in ws.keel("runs").stdout


def test_auto_without_bubblewrap_says_so_once_records_none_and_asks_before_commands(
    ws: KeelWorkspace, no_bwrap_path: str
) -> None:
    ws.env["PATH"] = no_bwrap_path
    model = ws.script(turn(call("run_command", argv=["sh", "-c", "echo hi > hi.txt"])), DONE)
    run_id, result = ws.start("say hi", "--model", model, "--mode", "auto")
    expect(result, 3)  # even in auto mode, an unconfined command waits for a person
    assert flat(result.stderr).count("without an OS sandbox") == 1
    assert not (ws.root / "hi.txt").exists()
    expect(ws.keel("approve", run_id), 0)
    expect(ws.keel("resume", run_id), 0)
    assert (ws.root / "hi.txt").read_text() == "hi\n"
    started = ws.of_type(run_id, EventType.TOOL_STARTED)
    assert started[0].data["sandbox"]["kind"] == "none"
    assert "not installed" in started[0].data["sandbox"]["reason"]


def test_reading_a_dotenv_file_needs_approval_and_listings_leave_it_out(
    ws: KeelWorkspace,
) -> None:
    (ws.root / ".env").write_text("SERVICE_TOKEN=abc123def456ghi789jkl\n")
    (ws.root / "README").write_text("hello\n")
    model = ws.script(
        turn(call("list_dir", path=".")),
        turn(call("grep", pattern="TOK[E]N=")),
        turn(call("read_file", path=".env")),
        DONE,
    )
    run_id, result = ws.start("look", "--model", model, "--mode", "auto")
    expect(result, 3)
    finished = ws.of_type(run_id, EventType.TOOL_FINISHED)
    listing, search = finished[0].data["output"], finished[1].data["output"]
    assert ".env" not in listing.replace("hidden", "") and "README" in listing
    assert "no lines match" in search
    pending = ws.state(run_id).pending
    assert pending is not None and pending.tool == "read_file"
