"""`keel run` / `resume` / `approve` end to end, as real subprocesses with no terminal.

Each test runs ``python -m keel`` with stdin from /dev/null against a SQLite file in a
temporary folder, then checks the exit code, what was printed, and the store's rows.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from keel.core.events import Event, EventType
from keel.core.state import RunState
from keel.core.status import RunStatus
from keel.store.sqlite.store import SQLiteStore
from keel.testing.provider import FakeProvider

CLEARED = ("KEEL_MODEL", "KEEL_STORE", "OPENAI_API_KEY", "OPENAI_BASE_URL", "KEEL_FAULT")


class Cli:
    """Runs ``keel`` in a workspace against one store file."""

    def __init__(self, root: Path) -> None:
        self.workspace = root / "ws"
        self.workspace.mkdir()
        self.db = root / "keel.db"
        self.env = {k: v for k, v in os.environ.items() if k not in CLEARED}
        self.env.update({"KEEL_STORE": f"sqlite:///{self.db}", "COLUMNS": "200"})

    def script(self, turns: list[dict[str, Any]]) -> str:
        path = self.workspace.parent / "script.json"
        path.write_text(json.dumps(turns), encoding="utf-8")
        return f"scripted:{path}"

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "keel", *args]

    def __call__(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(*args),
            cwd=self.workspace,
            env={**self.env, **env},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def state(self, run_id: str) -> RunState:
        store = SQLiteStore(self.db)
        try:
            return store.load_run(run_id)
        finally:
            store.close()

    def event_types(self, run_id: str) -> list[EventType]:
        return [e.type for e in self.events(run_id)]

    def events(self, run_id: str) -> list[Event]:
        store = SQLiteStore(self.db)
        try:
            return list(store.read_events(run_id))
        finally:
            store.close()


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    c = Cli(tmp_path)
    (c.workspace / "a.txt").write_text("hello\n", encoding="utf-8")
    return c


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    with FakeProvider() as server:
        yield server


def first_line(text: str) -> str:
    return text.splitlines()[0].strip()


EDIT = {
    "tool_calls": [
        {
            "name": "edit_file",
            "arguments": {"path": "a.txt", "old_text": "hello", "new_text": "bye"},
        }
    ]
}


def test_run_prints_the_run_id_first_and_exits_0_when_verified(cli: Cli) -> None:
    model = cli.script([EDIT, {"content": "done"}])

    proc = cli("run", "replace hello", "--model", model, "--verify", "grep -q bye a.txt")

    assert proc.returncode == 0, proc.stderr
    run_id = first_line(proc.stdout)
    assert run_id.startswith("run_")
    assert f"run {run_id}: completed (verified)" in proc.stdout
    assert re.search(r"evidence \S.*: artifact:art_\w+  \(keel artifact art_\w+\)", proc.stdout)
    assert (cli.workspace / "a.txt").read_text() == "bye\n"
    state = cli.state(run_id)
    assert state.status is RunStatus.COMPLETED
    assert state.validations[0].passed


def test_json_streams_every_event_as_a_json_line(cli: Cli) -> None:
    model = cli.script([EDIT, {"content": "done"}])

    proc = cli("run", "replace hello", "--model", model, "--json")

    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    head, *events, summary = lines
    run_id = head["run_id"]
    assert head == {"run_id": run_id, "status": "running"}
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # every event, in order
    assert seqs[-1] == cli.state(run_id).last_seq
    assert {e["type"] for e in events} >= {"model_responded", "tool_finished", "status_changed"}
    assert all(e["run_id"] == run_id for e in events)
    assert (summary["run_id"], summary["status"]) == (run_id, "completed")


def test_a_failed_run_exits_1_and_prints_its_reason_and_unfinished_todos(cli: Cli) -> None:
    todo = {
        "tool_calls": [
            {
                "name": "todo_write",
                "arguments": {"todos": [{"content": "ship it", "status": "in_progress"}]},
            }
        ]
    }
    model = cli.script([todo, EDIT, {"content": "done"}])

    proc = cli("run", "replace hello", "--model", model, "--max-steps", "2")

    assert proc.returncode == 1, proc.stderr
    run_id = first_line(proc.stdout)
    assert f"run {run_id}: failed (budget_exhausted:steps)" in proc.stdout
    assert "unfinished todos: ship it" in proc.stdout
    assert cli.state(run_id).status is RunStatus.FAILED


def test_replies_cut_at_the_length_limit_three_times_fail_the_run_saying_so(cli: Cli) -> None:
    cut = {"content": "The plan is: first,", "finish_reason": "length"}
    model = cli.script([cut, cut, cut, {"content": "never played"}])

    proc = cli("run", "explain", "--model", model, "--json")

    assert proc.returncode == 1, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    summary = lines[-1]
    assert (summary["status"], summary["reason"]) == ("failed", "model_output_truncated")
    assert summary["result"]["truncated_turns"] == 3
    responded = [e for e in lines if e.get("type") == "model_responded"]
    assert [e["data"]["finish_reason"] for e in responded] == ["length"] * 3


def test_a_refused_turn_exits_1_with_the_providers_reason_in_the_summary(
    cli: Cli, provider: FakeProvider
) -> None:
    provider.reply("Sorry.", finish_reason="content_filter")

    proc = cli(
        "run",
        "anything",
        "--model",
        "openai:some-model",
        OPENAI_BASE_URL=provider.base_url,
        OPENAI_API_KEY="sk-test",
    )

    assert proc.returncode == 1, proc.stderr
    assert "failed (provider_refused:content_filter)" in proc.stdout
    assert len(provider.requests) == 1


def test_a_missing_api_key_exits_2_naming_the_variable(cli: Cli) -> None:
    proc = cli("run", "anything", "--model", "openai:gpt-4o-mini")

    assert proc.returncode == 2
    assert "OPENAI_API_KEY" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_provider_refusing_the_key_fails_the_run_and_shows_its_message(
    cli: Cli, provider: FakeProvider
) -> None:
    provider.fail(401, "Incorrect API key provided: sk-bad")

    proc = cli(
        "run",
        "anything",
        "--model",
        "openai:some-model",
        OPENAI_BASE_URL=provider.base_url,
        OPENAI_API_KEY="sk-bad",
    )

    assert proc.returncode == 1, proc.stderr
    assert "Incorrect API key provided" in proc.stdout
    assert "HTTP 401" in proc.stdout
    assert len(provider.requests) == 1


def test_a_run_waiting_for_approval_exits_3_and_resumes_with_its_counters_intact(
    cli: Cli,
) -> None:
    write = {
        "tool_calls": [{"name": "write_file", "arguments": {"path": "b.txt", "content": "b"}}],
        "usage": {"input_tokens": 100, "output_tokens": 10},
    }
    read = {
        "tool_calls": [{"name": "read_file", "arguments": {"path": "b.txt"}}],
        "usage": {"input_tokens": 100, "output_tokens": 10},
    }
    model = cli.script([write, read, {"content": "done"}])

    proc = cli("run", "write b", "--model", model, "--mode", "ask", "--max-steps", "2")

    assert proc.returncode == 3, proc.stderr
    run_id = first_line(proc.stdout)
    assert f"keel approve {run_id}" in proc.stdout
    waiting = cli.state(run_id)
    assert waiting.status is RunStatus.WAITING
    assert (waiting.usage.steps, waiting.usage.tokens, waiting.usage.tool_calls) == (1, 110, 0)
    assert not (cli.workspace / "b.txt").exists()

    approved = cli("approve", run_id)
    assert approved.returncode == 0, approved.stderr
    assert cli.state(run_id).status is RunStatus.RUNNING

    resumed = cli("resume", run_id)

    # usage continued from where it was: the second model turn was the budget's last
    assert resumed.returncode == 1, resumed.stderr
    assert f"run {run_id}: failed (budget_exhausted:steps)" in resumed.stdout
    final = cli.state(run_id)
    assert (final.usage.steps, final.usage.tokens, final.usage.tool_calls) == (2, 220, 2)
    assert (cli.workspace / "b.txt").read_text() == "b"
    types = cli.event_types(run_id)
    assert types.count(EventType.MODEL_RESPONDED) == 2
    assert EventType.RUN_RESUMED in types


def test_resuming_a_finished_run_changes_nothing_and_exits_with_its_status(cli: Cli) -> None:
    model = cli.script([{"content": "done"}])
    run_id = first_line(cli("run", "say done", "--model", model).stdout)
    before = cli.state(run_id).last_seq

    proc = cli("resume", run_id)

    assert proc.returncode == 0
    assert cli.state(run_id).last_seq == before


def wait_for(predicate: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


@pytest.mark.sandboxed
def test_ctrl_c_during_a_slow_command_leaves_the_run_resumable_and_resume_completes_it(
    cli: Cli,
) -> None:
    slow = ["sh", "-c", "sleep 5; touch late.txt"]
    sleep = {"tool_calls": [{"name": "run_command", "arguments": {"argv": slow}}]}
    model = cli.script([sleep, {"content": "done"}])
    proc = subprocess.Popen(
        cli.argv("run", "sleep a bit", "--model", model, "--mode", "auto", "--json"),
        cwd=cli.workspace,
        env=cli.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        run_id = json.loads(proc.stdout.readline())["run_id"]
        wait_for(lambda: EventType.TOOL_STARTED in cli.event_types(run_id))
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    # Stopped at once, not after the command: when keel exited the command had not
    # reached its touch, and the harness recorded it as interrupted well inside its 5 s.
    # (No wall-clock bound on the CLI's exit: a loaded machine makes that flaky.)
    assert not (cli.workspace / "late.txt").exists()
    failed = cli.events(run_id)[-1]
    assert failed.data["error_kind"] == "interrupted"
    assert failed.data["elapsed_s"] < 4.5
    assert proc.returncode != 0
    assert f"keel resume {run_id}" in err
    assert any(json.loads(line).get("type") == "tool_started" for line in out.splitlines())
    interrupted = cli.state(run_id)
    assert interrupted.status is RunStatus.RUNNING  # resumable, not failed
    assert interrupted.open_calls == {}  # the command's outcome is on record: interrupted
    assert cli.event_types(run_id)[-1] is EventType.TOOL_FAILED

    resumed = cli("resume", run_id)

    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert cli.state(run_id).status is RunStatus.COMPLETED
    time.sleep(max(0.0, started + 5.5 - time.monotonic()))
    assert not (cli.workspace / "late.txt").exists()  # the command was really stopped


def test_a_cancelled_run_resumes_to_exit_code_5(cli: Cli) -> None:
    question = {"tool_calls": [{"name": "ask_user", "arguments": {"question": "which file?"}}]}
    model = cli.script([question, {"content": "done"}])
    waiting = cli("run", "ask first", "--model", model)
    assert waiting.returncode == 3, waiting.stderr
    run_id = first_line(waiting.stdout)
    assert f"keel answer {run_id} TEXT" in waiting.stdout

    assert cli("cancel", run_id, "--reason", "not needed").returncode == 0
    proc = cli("resume", run_id)

    assert proc.returncode == 5
    state = cli.state(run_id)
    assert (state.status, state.reason) == (RunStatus.CANCELLED, "not needed")
