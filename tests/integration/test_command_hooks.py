"""Command hooks from ``.keel/hooks.toml`` and middleware from entry points, for real.

Each hook is a real program (a Python script under ``.keel/hooks/``) run as a
subprocess: it reads the context as JSON on stdin and prints its decision. A hook
that allows, one that denies, one that times out; a hook whose program the model
could rewrite is refused; a crashed run's recorded decisions are replayed by its
resume, not asked again (SIGKILL at a fault point, `keel resume` in a new process).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from keel.core.errors import ConfigError
from keel.core.events import Event, EventType
from keel.core.status import RunStatus
from keel.models.base import ModelRequest
from keel.models.scripted import ScriptedModel
from keel.runtime.harness import Harness
from keel.store.url import open_store

KEEL = str(Path(sys.executable).with_name("keel"))
WRITE = {"name": "write_file", "arguments": {"path": "a.txt", "content": "one\n"}}
DONE = {"tool_calls": [{"name": "request_completion", "arguments": {"summary": "done"}}]}
SCRIPT: list[dict[str, Any]] = [{"tool_calls": [WRITE]}, DONE]


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / ".keel" / "hooks").mkdir(parents=True)
    return root


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/keel.db"


def hook(workspace: Path, name: str, body: str) -> str:
    """A hook program under .keel/hooks/: logs its context to $HOOK_LOG, then ``body``."""
    path = workspace / ".keel" / "hooks" / f"{name}.py"
    path.write_text(
        f"#!{sys.executable}\n"
        + textwrap.dedent(
            """\
            import json, os, sys, time
            ctx = json.load(sys.stdin)
            with open(os.environ["HOOK_LOG"], "a") as log:
                log.write(json.dumps({"hook": os.environ["KEEL_HOOK"], "ctx": ctx,
                                      "env": sorted(os.environ), "cwd": os.getcwd()}) + "\\n")
            """
        )
        + textwrap.dedent(body)
    )
    path.chmod(0o755)
    return f".keel/hooks/{name}.py"


def hooks_toml(workspace: Path, text: str) -> None:
    (workspace / ".keel" / "hooks.toml").write_text(textwrap.dedent(text))


def entry(name: str, point: str, program: str, **more: Any) -> str:
    lines = [
        "[[hooks]]",
        f'name = "{name}"',
        f'point = "{point}"',
        f'command = ["{program}"]',
        'env = ["HOOK_LOG"]',
    ]
    lines += [f"{key} = {json.dumps(value)}" for key, value in more.items()]
    return "\n".join(lines) + "\n"


def logged(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.fixture
def log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "hooks.log"
    monkeypatch.setenv("HOOK_LOG", str(path))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-for-hooks")
    return path


def events_of(h: Harness, run_id: str) -> list[Event]:
    return list(h.store.read_events(run_id))


def last_tool_text(request: ModelRequest) -> str:
    return next(m.content or "" for m in reversed(request.messages) if m.role == "tool")


def test_a_hook_that_allows_sees_the_call_and_only_the_variables_it_names(
    workspace: Path, store_url: str, log: Path
) -> None:
    hooks_toml(workspace, entry("allow", "before_tool", hook(workspace, "allow", "print('{}')")))
    with Harness(store=store_url, model=ScriptedModel(SCRIPT)) as h:
        run = h.run("write", cwd=workspace)
        events = events_of(h, run.id)

    assert run.status is RunStatus.COMPLETED
    assert (workspace / "a.txt").read_text() == "one\n"
    calls = logged(log)
    writes = [c for c in calls if c["ctx"]["tool"] == "write_file"]
    assert len(writes) == 1
    ctx = writes[0]["ctx"]
    assert ctx["point"] == "before_tool" and ctx["run_id"] == run.id
    assert ctx["arguments"] == WRITE["arguments"] and ctx["goal"] == "write"
    assert "OPENAI_API_KEY" not in writes[0]["env"]  # only what the entry names
    assert "HOOK_LOG" in writes[0]["env"] and "KEEL_WORKSPACE" in writes[0]["env"]
    assert Path(writes[0]["cwd"]).resolve() == (workspace / ".keel").resolve()
    assert not [e for e in events if e.type is EventType.MIDDLEWARE_DECIDED]  # continue


def test_a_hook_that_denies_stops_the_call_and_the_model_reads_the_reason(
    workspace: Path, store_url: str, log: Path
) -> None:
    program = hook(
        workspace,
        "deny",
        """\
        if ctx["tool"] == "write_file":
            print(json.dumps({"decision": "deny", "reason": "a.txt is frozen"}))
        """,
    )
    hooks_toml(workspace, entry("freeze", "before_tool", program))
    model = ScriptedModel(SCRIPT)
    with Harness(store=store_url, model=model) as h:
        run = h.run("write", cwd=workspace)
        events = events_of(h, run.id)

    assert not (workspace / "a.txt").exists()
    assert "a.txt is frozen" in last_tool_text(model.requests[1])
    (record,) = [e.data for e in events if e.type is EventType.MIDDLEWARE_DECIDED]
    assert (record["middleware"], record["decision"], record["reason"]) == (
        "freeze",
        "deny",
        "a.txt is frozen",
    )
    assert run.status is RunStatus.COMPLETED


def test_a_hook_exiting_2_denies_with_its_stderr(
    workspace: Path, store_url: str, log: Path
) -> None:
    program = hook(workspace, "exit2", "sys.stderr.write('no writes on Friday'); sys.exit(2)\n")
    hooks_toml(workspace, entry("friday", "before_tool", program, tools=["write_file"]))
    model = ScriptedModel(SCRIPT)
    with Harness(store=store_url, model=model) as h:
        h.run("write", cwd=workspace)
    assert not (workspace / "a.txt").exists()
    assert "no writes on Friday" in last_tool_text(model.requests[1])
    assert [c["ctx"]["tool"] for c in logged(log)] == ["write_file"]  # tools = [...] only


@pytest.mark.parametrize("on_error", ["closed", "open"])
def test_a_hook_that_times_out_is_killed_and_its_on_error_decides(
    workspace: Path, store_url: str, log: Path, on_error: str
) -> None:
    program = hook(workspace, "slow", "time.sleep(60)\n")
    hooks_toml(
        workspace,
        entry("slow", "before_tool", program, timeout_seconds=0.5, on_error=on_error),
    )
    model = ScriptedModel(SCRIPT)
    started = time.monotonic()
    with Harness(store=store_url, model=model) as h:
        run = h.run("write", cwd=workspace)
        records = [e.data for e in events_of(h, run.id) if e.type is EventType.MIDDLEWARE_DECIDED]
    assert time.monotonic() - started < 20  # two calls, each killed at 0.5 s
    assert run.status is RunStatus.COMPLETED
    assert records and all("passed its 0.5 s timeout" in r["error"] for r in records)
    if on_error == "closed":
        assert not (workspace / "a.txt").exists()
        assert all(r["decision"] == "deny" for r in records)
        assert "timeout" in last_tool_text(model.requests[1])
    else:
        assert (workspace / "a.txt").read_text() == "one\n"
        assert all(r["decision"] == "error" and r["failed"] == "open" for r in records)


@pytest.mark.parametrize(
    ("printed", "error"),
    [
        ("print('not json')", "printed no JSON decision"),
        ("print(json.dumps({'decision': 'explode'}))", "explode"),
        ("print(json.dumps({'decision': 'modify', 'patch': {'goal': 'x'}}))", "goal"),
        ("print(json.dumps(['deny']))", "a decision is a JSON object"),
        ("sys.exit(3)", "exited 3"),
    ],
)
def test_a_hook_answering_nonsense_fails_closed_and_the_tool_does_not_run(
    workspace: Path, store_url: str, log: Path, printed: str, error: str
) -> None:
    hooks_toml(
        workspace,
        entry("odd", "before_tool", hook(workspace, "odd", printed + "\n"), tools=["write_file"]),
    )
    with Harness(store=store_url, model=ScriptedModel(SCRIPT)) as h:
        run = h.run("write", cwd=workspace)
        (record,) = [e.data for e in events_of(h, run.id) if e.type is EventType.MIDDLEWARE_DECIDED]
    assert not (workspace / "a.txt").exists()
    assert record["decision"] == "deny" and record["failed"] == "closed"
    assert error in record["error"]


def test_after_tool_and_before_complete_hooks(workspace: Path, store_url: str, log: Path) -> None:
    note = hook(
        workspace,
        "note",
        "print(json.dumps({'decision': 'append', 'note': 'run the linter next'}))\n",
    )
    gate = hook(
        workspace,
        "gate",
        """\
        seen = sum(1 for line in open(os.environ["HOOK_LOG"]) if '"gate"' in line)
        if seen == 1:
            print(json.dumps({"decision": "deny", "reason": "CHANGELOG not updated"}))
        """,
    )
    hooks_toml(
        workspace,
        entry("note", "after_tool", note, tools=["write_file"])
        + entry("gate", "before_complete", gate),
    )
    model = ScriptedModel([{"tool_calls": [WRITE]}, DONE, DONE])
    with Harness(store=store_url, model=model) as h:
        run = h.run("write", cwd=workspace)
    assert run.status is RunStatus.COMPLETED
    assert "run the linter next" in last_tool_text(model.requests[1])
    assert "CHANGELOG not updated" in str(model.requests[2].messages)
    assert [c["hook"] for c in logged(log)] == ["note", "gate", "gate"]


# --- what the model cannot do -----------------------------------------------------------------


def test_a_hook_program_the_model_could_rewrite_is_refused_before_the_run_starts(
    workspace: Path, store_url: str, log: Path
) -> None:
    (workspace / "scripts").mkdir()
    (workspace / "scripts" / "check.py").write_text("print('{}')\n")
    hooks_toml(
        workspace,
        '[[hooks]]\nname = "check"\npoint = "before_tool"\n'
        f'command = ["{sys.executable}", "scripts/check.py"]\n',
    )
    model = ScriptedModel(SCRIPT)
    with (
        Harness(store=store_url, model=model) as h,
        pytest.raises(ConfigError, match=r"'scripts/check\.py' is in the workspace outside"),
    ):
        h.run("write", cwd=workspace)
    assert model.requests == []
    assert not (workspace / "a.txt").exists()


def test_the_model_cannot_write_the_hooks_file(workspace: Path, store_url: str, log: Path) -> None:
    plant = {
        "name": "write_file",
        "arguments": {"path": ".keel/hooks.toml", "content": "[[hooks]]\n"},
    }
    with Harness(store=store_url, model=ScriptedModel([{"tool_calls": [plant]}, DONE])) as h:
        run = h.run("plant", cwd=workspace)
        failed = [e for e in events_of(h, run.id) if e.type is EventType.TOOL_FAILED]
    assert failed and "protected" in failed[0].data["message"]
    assert not (workspace / ".keel" / "hooks.toml").exists()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[hooks]]\nname = 'x'\npoint = 'sometime'\ncommand = ['true']\n", "point: one of"),
        ("[[hooks]]\nname = 'x'\npoint = 'before_tool'\ncommand = []\n", "command"),
        ("[[hooks]\n", "not valid TOML"),
        ("[hook]\n", "unknown key 'hook'"),
        ("[write_size]\nmax_bytes = -1\n", "max_bytes"),
    ],
)
def test_a_broken_hooks_file_is_a_precise_error_and_nothing_runs(
    workspace: Path, store_url: str, text: str, message: str
) -> None:
    hooks_toml(workspace, text)
    model = ScriptedModel(SCRIPT)
    with (
        Harness(store=store_url, model=model) as h,
        pytest.raises(ConfigError, match=message) as raised,
    ):
        h.run("write", cwd=workspace)
    assert "hooks.toml" in str(raised.value)
    assert model.requests == []


def test_write_size_from_the_hooks_file(workspace: Path, store_url: str) -> None:
    hooks_toml(workspace, "[write_size]\nmax_bytes = 3\n")
    model = ScriptedModel(SCRIPT)
    with Harness(store=store_url, model=model) as h:
        h.run("write", cwd=workspace)
    assert not (workspace / "a.txt").exists()
    assert "over the 3-byte limit" in last_tool_text(model.requests[1])


# --- entry points -----------------------------------------------------------------------------


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A package that declares ``keel.middleware`` entry points, on sys.path."""
    site = tmp_path / "site"
    (site / "keel_audit_mw-1.0.dist-info").mkdir(parents=True)
    (site / "keel_audit_mw-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: keel-audit-mw\nVersion: 1.0\n"
    )
    (site / "keel_audit_mw-1.0.dist-info" / "entry_points.txt").write_text(
        "[keel.middleware]\naudit = keel_audit_mw:Audit\nbroken = keel_audit_mw:missing\n"
    )
    (site / "keel_audit_mw.py").write_text(
        textwrap.dedent(
            """\
            from keel.middleware import CONTINUE, Deny, Middleware

            class Audit(Middleware):
                def before_tool(self, ctx):
                    if ctx.tool == "write_file":
                        return Deny("audit: writes need a ticket")
                    return CONTINUE
            """
        )
    )
    monkeypatch.syspath_prepend(str(site))
    return site


def test_middleware_from_an_entry_point_by_name_and_from_the_hooks_file(
    workspace: Path, store_url: str, installed: Path
) -> None:
    model = ScriptedModel(SCRIPT)
    with Harness(store=store_url, model=model, middleware=["audit"]) as h:
        run = h.run("write", cwd=workspace)
        (record,) = [e.data for e in events_of(h, run.id) if e.type is EventType.MIDDLEWARE_DECIDED]
    assert record["middleware"] == "audit" and "ticket" in record["reason"]
    assert not (workspace / "a.txt").exists()

    hooks_toml(workspace, '[middleware]\nuse = ["audit"]\n')
    model = ScriptedModel(SCRIPT)
    with Harness(store=store_url, model=model) as h:
        h.run("write again", cwd=workspace)
    assert "writes need a ticket" in last_tool_text(model.requests[1])


def test_an_unknown_or_broken_entry_point_is_a_config_error(
    store_url: str, installed: Path
) -> None:
    with pytest.raises(ConfigError, match=r"no keel\.middleware entry point named 'nope'.*audit"):
        Harness(store=store_url, middleware=["nope"])
    with pytest.raises(ConfigError, match=r"'broken'.*failed to load"):
        Harness(store=store_url, middleware=["broken"])


# --- replayed, not asked again, after a crash -----------------------------------------------


@pytest.mark.parametrize(
    ("fault", "point"),
    [("after_tool_started:1", "before_tool"), ("mid_model_step:1", "before_model")],
)
def test_a_crashed_runs_recorded_decisions_are_replayed_by_its_resume(
    tmp_path: Path, workspace: Path, log: Path, fault: str, point: str
) -> None:
    body = "print(json.dumps({'decision': 'modify', 'patch': " + (
        "{'arguments': {'content': 'hooked\\n'}}}))"
        if point == "before_tool"
        else "{'tools': ['write_file', 'request_completion']}}))"
    )
    program = hook(workspace, "count", body + "\n")
    hooks_toml(
        workspace,
        entry(
            "count", point, program, **({"tools": ["write_file"]} if point == "before_tool" else {})
        ),
    )
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    url = f"sqlite:///{tmp_path / 'keel.db'}"
    env = {**os.environ, "KEEL_LEASE_TTL": "1", "KEEL_FAULT": fault}
    first = subprocess.run(
        [KEEL, "run", "write", "--model", f"scripted:{script}", "--store", url, "--json"],
        cwd=workspace,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert first.returncode == -signal.SIGKILL, first.stderr
    run_id = json.loads(first.stdout.splitlines()[0])["run_id"]
    asked_before = len(logged(log))
    assert asked_before == 1

    env.pop("KEEL_FAULT")
    deadline = time.monotonic() + 10
    with open_store(url) as store:
        while store.current_run_lease(run_id) is not None:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    resumed = subprocess.run(
        [KEEL, "resume", run_id, "--store", url, "--json"],
        cwd=workspace,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr

    with open_store(url) as store:
        state = store.load_run(run_id)
        events = list(store.read_events(run_id))
    assert state.status is RunStatus.COMPLETED
    asked = [c for c in logged(log) if c["ctx"]["point"] == point]
    if point == "before_tool":
        assert len(asked) == 1  # the resume acted on the recorded decision
        assert (workspace / "a.txt").read_text() == "hooked\n"
    else:
        # Step 1's decision was replayed; only step 2 (a new request) asked the hook.
        assert [c["ctx"]["step"] for c in asked] == [0, 1]
    records = [e.data for e in events if e.type is EventType.MIDDLEWARE_DECIDED]
    assert len(records) == len(asked)


# --- children ---------------------------------------------------------------------------------


def test_an_isolated_child_is_held_by_its_parent_workspaces_hooks(
    tmp_path: Path, workspace: Path, log: Path
) -> None:
    from keel.testing.agents import RelayModel, write_agent  # noqa: PLC0415 - this test only

    subprocess.run(["git", "init", "-q", str(workspace)], check=True)
    program = hook(
        workspace,
        "deny",
        'print(json.dumps({"decision": "deny", "reason": "children do not write"}))\n',
    )
    hooks_toml(workspace, entry("nowrite", "before_tool", program, tools=["write_file"]))
    child_script = [{"tool_calls": [WRITE]}, DONE]
    write_agent(workspace, "editor", script=child_script, tools=["write_file", "read_file"])
    spawn = {"name": "agent_spawn", "arguments": {"agent": "editor", "task": "edit"}}
    with Harness(
        store=f"sqlite:///{tmp_path / 'keel.db'}", model=RelayModel([{"tool_calls": [spawn]}, DONE])
    ) as h:
        run = h.run("delegate", cwd=workspace)
        (child,) = h.store.child_runs(run.id)
        child_events = list(h.store.read_events(child.run_id))
    assert child.options.workspace_kind == "isolated"
    denied = [
        e.data
        for e in child_events
        if e.type is EventType.TOOL_FAILED and e.data["tool"] == "write_file"
    ]
    assert denied and denied[0]["error_kind"] == "middleware_denied"
    assert "children do not write" in denied[0]["message"]
    assert [c["ctx"]["run_id"] for c in logged(log)] == [child.run_id]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"[[hooks]]\nname = '\xff\xfe'\n", "not UTF-8 text"),
        (b"#" * (64 * 1024 + 1), "over 65536 bytes"),
    ],
)
def test_a_hooks_file_that_is_not_text_or_too_big_is_refused_whole(
    workspace: Path, store_url: str, data: bytes, message: str
) -> None:
    (workspace / ".keel" / "hooks.toml").write_bytes(data)
    model = ScriptedModel(SCRIPT)
    with (
        Harness(store=store_url, model=model) as h,
        pytest.raises(ConfigError, match=message),
    ):
        h.run("write", cwd=workspace)
    assert model.requests == []


def test_a_hook_printing_without_end_is_stopped_and_fails_closed(
    workspace: Path, store_url: str, log: Path
) -> None:
    program = hook(workspace, "flood", "sys.stdout.write('x' * (2 * 1024 * 1024))\n")
    hooks_toml(workspace, entry("flood", "before_tool", program, tools=["write_file"]))
    with Harness(store=store_url, model=ScriptedModel(SCRIPT)) as h:
        run = h.run("write", cwd=workspace)
        (record,) = [e.data for e in events_of(h, run.id) if e.type is EventType.MIDDLEWARE_DECIDED]
    assert not (workspace / "a.txt").exists()
    assert record["decision"] == "deny" and "printed over 1048576 bytes" in record["error"]
    assert len(json.dumps(record)) < 10_000  # the flood itself is not stored
