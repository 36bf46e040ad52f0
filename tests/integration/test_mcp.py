"""MCP tools from real servers built with the official SDK (``tests/fixtures/mcp/server.py``).

One server runs over stdio as a subprocess the harness starts; another over streamable
HTTP on 127.0.0.1 in a subprocess of the test. Runs are real (a SQLite file, the
workspace, the policy); only the model's turns are scripted.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from keel.core.errors import ConfigError, ToolError
from keel.core.events import Event, EventType
from keel.core.mcp_config import parse_mcp_config
from keel.runtime.harness import Harness
from keel.runtime.mcp_servers import McpHub, load_mcp_servers
from keel.store.url import open_store
from keel.testing import ScriptedModel
from keel.testing.cli import KeelWorkspace, call, expect, turn
from keel.tools import ToolContext

SERVER = Path(__file__).resolve().parents[1] / "fixtures" / "mcp" / "server.py"
DONE = turn(call("request_completion", summary="done"))


def reads(server: str, *tools: str) -> str:
    """Overrides that let ``tools`` run unasked (external calls ask in every mode)."""
    return "".join(
        f'[servers.{server}.tools.{tool}]\neffect = "read"\nrecovery = "replay_safe"\n'
        for tool in tools
    )


def stdio_config(*, env: tuple[str, ...] = (), extra: str = "") -> str:
    names = ", ".join(json.dumps(n) for n in env)
    return (
        "[servers.lab]\n"
        f"command = [{json.dumps(sys.executable)}, {json.dumps(str(SERVER))}]\n"
        f"env = [{names}]\n" + extra
    )


def workspace(tmp_path: Path, config: str) -> Path:
    ws = tmp_path / "ws"
    (ws / ".keel").mkdir(parents=True)
    (ws / ".keel" / "mcp.toml").write_text(config)
    return ws


def run(
    tmp_path: Path, ws: Path, turns: list[dict[str, Any]], mode: str = "auto"
) -> tuple[Harness, Any, list[Event], ScriptedModel]:
    model = ScriptedModel(turns)
    harness = Harness(store=f"sqlite:///{tmp_path / 'keel.db'}", model=model)
    outcome = harness.run("use the lab", cwd=ws, mode=mode)
    return harness, outcome.state, list(harness.events(outcome.state.run_id)), model


def failures(events: list[Event]) -> list[dict[str, Any]]:
    return [e.data for e in events if e.type is EventType.TOOL_FAILED]


def test_stdio_tools_are_offered_with_their_schemas_and_called(tmp_path: Path) -> None:
    ws = workspace(tmp_path, stdio_config(extra=reads("lab", "add", "fail", "picture")))
    harness, state, events, model = run(
        tmp_path,
        ws,
        [
            turn(call("mcp__lab__add", a=2, b=40)),
            turn(call("mcp__lab__add", a="two", b=40)),
            turn(call("mcp__lab__fail")),
            turn(call("mcp__lab__picture")),
            DONE,
        ],
    )
    try:
        assert state.status.value == "completed", state.reason
        offered = {t.name: t for t in model.requests[0].tools}
        assert {"mcp__lab__add", "mcp__lab__env", "mcp__lab__die"} <= set(offered)
        add = offered["mcp__lab__add"]
        assert add.description.startswith("[MCP server lab] Add two whole numbers")
        assert add.parameters["required"] == ["a", "b"]
        finished = [e.data for e in events if e.type is EventType.TOOL_FINISHED]
        assert finished[0]["tool"] == "mcp__lab__add" and finished[0]["output"] == "42"
        bad, broken = failures(events)
        assert (
            bad["error_kind"] == "invalid_arguments" and "a: 'two' is not of type" in bad["message"]
        )
        assert "broken" not in bad["message"] and "failed" in broken["message"]
        picture = finished[1]
        assert picture["output"].startswith("here is a pixel\nstored: artifact:art_")
        artifact_id = picture["output"].rsplit("artifact:", 1)[1]
        artifact, content = harness.store.get_artifact(artifact_id)
        assert content.startswith(b"\x89PNG") and artifact.name.endswith(".png")
    finally:
        harness.close()


def test_external_by_default_so_edit_mode_asks_and_a_read_override_does_not(
    tmp_path: Path,
) -> None:
    ws = workspace(tmp_path, stdio_config(extra=reads("lab", "add")))
    harness, state, events, _ = run(
        tmp_path,
        ws,
        [turn(call("mcp__lab__add", a=1, b=1)), turn(call("mcp__lab__note", text="hi")), DONE],
        mode="edit",
    )
    try:
        assert state.status.value == "waiting" and state.pending is not None
        assert state.pending.tool == "mcp__lab__note"  # external: a person decides
        assert not (ws / "notes.log").exists()  # nothing ran before the approval
        assert [e.data["tool"] for e in events if e.type is EventType.TOOL_FINISHED] == [
            "mcp__lab__add"
        ]
        harness.approve(state.run_id)
        done = harness.resume(state.run_id).state
        assert done.status.value == "completed", done.reason
        assert (ws / "notes.log").read_text() == "hi\n"  # once
    finally:
        harness.close()


def test_a_server_gets_only_the_variables_its_entry_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LAB_TOKEN", "lab-token-value")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-must-not-leak")
    ws = workspace(tmp_path, stdio_config(env=("LAB_TOKEN",), extra=reads("lab", "env")))
    harness, _, events, _ = run(
        tmp_path,
        ws,
        [
            turn({"name": "mcp__lab__env", "arguments": {"name": "LAB_TOKEN"}}),
            turn({"name": "mcp__lab__env", "arguments": {"name": "OPENAI_API_KEY"}}),
            DONE,
        ],
    )
    try:
        outputs = [e.data["output"] for e in events if e.type is EventType.TOOL_FINISHED]
        # The server got the variable it was given (its value, a secret, is redacted
        # before the log), and not the one it was not.
        assert outputs[:2] == ["[redacted:LAB_TOKEN]", "<unset>"]
    finally:
        harness.close()
    stored = (tmp_path / "keel.db").read_bytes()
    assert b"lab-token-value" not in stored and b"sk-must-not-leak" not in stored


def test_a_server_that_dies_mid_call_is_a_tool_error_and_is_restarted_once(
    tmp_path: Path,
) -> None:
    ws = workspace(tmp_path, stdio_config(extra=reads("lab", "die", "add")))
    harness, state, events, _ = run(
        tmp_path,
        ws,
        [
            turn(call("mcp__lab__die")),
            turn(call("mcp__lab__add", a=1, b=2)),  # a fresh server answers
            turn(call("mcp__lab__die")),
            turn(call("mcp__lab__add", a=1, b=2)),  # crashed twice: it stays down
            DONE,
        ],
    )
    try:
        assert state.status.value == "completed", state.reason
        seen = [
            (e.data["tool"], e.type.value)
            for e in events
            if e.type in (EventType.TOOL_FINISHED, EventType.TOOL_FAILED)
        ]
        assert seen[:4] == [
            ("mcp__lab__die", "tool_failed"),
            ("mcp__lab__add", "tool_finished"),
            ("mcp__lab__die", "tool_failed"),
            ("mcp__lab__add", "tool_failed"),
        ]
        first, _, last = failures(events)[:3]
        assert (
            "went away during the call" in first["message"] and "started again" in first["message"]
        )
        assert "lab is down" in last["message"]
    finally:
        harness.close()


def test_a_broken_mcp_toml_refuses_the_run_naming_the_key(tmp_path: Path) -> None:
    ws = workspace(tmp_path, '[servers.lab]\ncommand = "python server.py"\n')
    url = f"sqlite:///{tmp_path / 'keel.db'}"
    harness = Harness(store=url, model=ScriptedModel([]))
    try:
        with pytest.raises(
            ConfigError, match=r"mcp\.toml: servers\.lab\.command: a non-empty list"
        ):
            harness.create("x", cwd=ws)
    finally:
        harness.close()
    store = open_store(url)
    try:
        assert store.list_runs() == []
    finally:
        store.close()


# --- streamable HTTP ----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    log = (tmp_path / "http-server.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), "http", str(port)],
        cwd=tmp_path,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={k: v for k, v in os.environ.items() if not k.startswith("KEEL_")},
    )
    url = f"http://127.0.0.1:{port}/mcp"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            break
        except httpx.TransportError:
            time.sleep(0.05)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


def test_a_streamable_http_server_is_called_with_headers_from_named_variables(
    tmp_path: Path, http_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LAB_AUTH", "Bearer lab")
    config = f'[servers.web]\nurl = "{http_server}"\nheaders = {{ Authorization = "LAB_AUTH" }}\n'
    config += reads("web", "add")
    ws = workspace(tmp_path, config)
    harness, state, events, model = run(
        tmp_path, ws, [turn(call("mcp__web__add", a=20, b=22)), DONE]
    )
    try:
        assert state.status.value == "completed", state.reason
        assert "mcp__web__add" in {t.name for t in model.requests[0].tools}
        [finished] = [e.data for e in events if e.type is EventType.TOOL_FINISHED][:1]
        assert finished["output"] == "42"
        assert "Bearer lab" not in json.dumps([e.data for e in events])
    finally:
        harness.close()


def test_a_header_variable_that_is_not_set_leaves_the_server_down_saying_why(
    tmp_path: Path, http_server: str
) -> None:
    config = (
        f'[servers.web]\nurl = "{http_server}"\nheaders = {{ Authorization = "NO_SUCH_VAR" }}\n'
    )
    ws = KeelWorkspace(tmp_path / "cli")
    ws.root.mkdir()
    (ws.root / ".keel").mkdir()
    (ws.root / ".keel" / "mcp.toml").write_text(config)
    listed = ws.keel("mcp", "list")
    assert listed.returncode == 2, listed
    text = " ".join(listed.stdout.split())
    assert "web" in text and "NO_SUCH_VAR" in text and "not set" in text
    (ws.root / ".keel" / "mcp.toml").write_text(stdio_config())
    ok = expect(ws.keel("mcp", "list"), 0)
    assert "lab" in ok and "running" in ok and "mcp__lab__add" in ok


def test_an_allowlist_may_name_a_servers_tools(tmp_path: Path) -> None:
    ws = workspace(tmp_path, stdio_config(extra=reads("lab", "add")))
    model = ScriptedModel([turn(call("mcp__lab__note", text="x")), DONE])
    harness = Harness(store=f"sqlite:///{tmp_path / 'keel.db'}", model=model)
    try:
        state = harness.run("x", cwd=ws, mode="auto", tools=["read_file", "mcp__lab__add"]).state
        assert {t.name for t in model.requests[0].tools} == {
            "read_file",
            "mcp__lab__add",
            "request_completion",
        }
        [refused] = failures(list(harness.events(state.run_id)))
        assert refused["error_kind"] == "unknown_tool"  # not on the list: never called
        assert not (ws / "notes.log").exists()
        with pytest.raises(ConfigError, match="unknown tool 'mcp__other__add'"):
            harness.create("x", cwd=ws, tools=["mcp__other__add"])
    finally:
        harness.close()


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b'[servers.lab]\ncommand = ["caf\xe9"]\n', "not UTF-8 text"),
        (b"# " + b"x" * 70_000 + b"\n", "over 65536 bytes"),
    ],
)
def test_an_mcp_toml_that_is_not_text_or_too_big_is_refused_whole(
    tmp_path: Path, data: bytes, words: str
) -> None:
    ws = workspace(tmp_path, "")
    (ws / ".keel" / "mcp.toml").write_bytes(data)
    with pytest.raises(ConfigError, match=words):
        load_mcp_servers(ws)


def test_what_a_hostile_server_lists_or_answers_is_bounded(tmp_path: Path) -> None:
    """A server's own data is not trusted either: a tool name no provider accepts or an
    input schema that is no JSON Schema is left out; an endless answer is cut."""
    hub = McpHub(tmp_path, parse_mcp_config(stdio_config(), "mcp.toml"))
    entry = parse_mcp_config(stdio_config(), "mcp.toml")[0]
    try:
        listed = [
            SimpleNamespace(name="ok", description="fine", input_schema={"type": "object"}),
            SimpleNamespace(name="has space", description="x", input_schema={"type": "object"}),
            SimpleNamespace(name="x" * 80, description="x", input_schema={"type": "object"}),
            SimpleNamespace(name="bad", description="x", input_schema={"type": 7}),
            SimpleNamespace(name="array", description="x", input_schema={"type": "array"}),
        ]
        made = [tool for item in listed for tool in hub._tool(entry, item)]
        assert [tool.name for tool in made] == ["mcp__lab__ok"]
        endless = SimpleNamespace(
            content=[SimpleNamespace(type="text", text="y" * 1_000_000)],
            structured_content=None,
            is_error=False,
        )
        ctx = ToolContext(workspace=tmp_path, run_id="run_x", call_id="c", owner="o")
        result = hub._result(ctx, "lab", "ok", endless)
        assert len(result.output) < 300_000 and result.output.endswith("characters]")
        refused = SimpleNamespace(
            content=[SimpleNamespace(type="text", text="nope")],
            structured_content=None,
            is_error=True,
        )
        with pytest.raises(ToolError, match="ok \\(MCP server lab\\) failed: nope"):
            hub._result(ctx, "lab", "ok", refused)
    finally:
        hub.close()
