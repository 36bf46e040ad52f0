"""Every `keel … --json` command prints strict JSON (RFC 8259: no NaN, no Infinity).

The test drives each command that has ``--json`` against one real store, parses every
line it printed with a parser that refuses NaN and Infinity, and fails when a command
gains ``--json`` without being driven here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from keel.cli.app import app
from keel.core.state import transition
from keel.core.status import RunStatus
from keel.store.url import open_store
from keel.testing.cli import DONE, KeelWorkspace, call, expect, turn


def commands_with_json() -> set[str]:
    """Every command path (``run``, ``tasks list`` …) that takes ``--json``."""
    found: set[str] = set()

    def walk(command: Any, path: tuple[str, ...]) -> None:
        subcommands = getattr(command, "commands", None)
        if subcommands is not None:
            for name, sub in subcommands.items():
                walk(sub, (*path, name))
        elif any("--json" in getattr(p, "opts", ()) for p in command.params):
            found.add(" ".join(path))

    walk(typer.main.get_command(app), ())
    return found


def strict_loads(text: str) -> Any:
    def refuse(literal: str) -> Any:
        raise ValueError(f"not JSON: {literal}")

    return json.loads(text, parse_constant=refuse)


# Command groups: driven in this process, named by two words.
GROUPS = ("tasks", "token", "skills", "mcp")


class JsonKeel:
    """Runs ``keel ARGS --json`` and parses every line it printed.

    Run commands are real ``keel`` processes; the quick task commands run the same
    app in this process (``CliRunner``), which keeps the test fast.
    """

    def __init__(self, ws: KeelWorkspace) -> None:
        self.ws = ws
        self.ran: set[str] = set()

    def __call__(self, *args: str, code: int = 0) -> list[Any]:
        group = args[0] in GROUPS
        if group:
            env = {**self.ws.env, "KEEL_STORE": self.ws.url}
            invoked = CliRunner().invoke(app, [*args, "--json"], env=env)
            assert invoked.exit_code == code, invoked.output
            out = invoked.stdout
        else:
            result = self.ws.keel(*args, "--json")
            out = expect(result, code)
            assert "Traceback" not in result.stderr
        self.ran.add(" ".join(args[:2]) if group else args[0])
        lines = [line for line in out.splitlines() if line.strip()]
        assert lines, f"keel {' '.join(args)} --json printed nothing"
        return [strict_loads(line) for line in lines]


@pytest.fixture
def ws(tmp_path: Path) -> KeelWorkspace:
    workspace = KeelWorkspace(tmp_path)
    workspace.env["KEEL_AGENT_ID"] = "agent-1"
    return workspace


def test_every_json_command_prints_strict_json(ws: KeelWorkspace) -> None:
    keel = JsonKeel(ws)
    write = call("write_file", path="notes.txt", content="n\n")

    printed = keel(
        "run",
        "take notes",
        "--model",
        ws.script(turn(write), DONE),
        "--verify",
        "notes=test -f notes.txt",
    )
    run_id = printed[0]["run_id"]
    assert printed[-1]["status"] == "completed"
    asking = ws.script(turn(call("write_file", path="b.txt", content="b\n")), DONE)
    waiting = keel("run", "write b", "--model", asking, "--mode", "ask", code=3)[0]["run_id"]
    expect(ws.keel("approve", waiting), 0)
    assert keel("resume", waiting)[-1]["status"] == "completed"
    assert {r["run_id"] for r in keel("runs")[0]} == {run_id, waiting}
    shown_run = keel("show", run_id)[0]
    assert shown_run["status"] == "completed"
    opened = keel("artifact", shown_run["evidence"]["notes"])[0]
    assert opened["text"].startswith("$ test -f notes.txt")
    assert [e["seq"] for e in keel("events", run_id)][:2] == [1, 2]
    keel("verify", run_id)
    figures = keel("stats")[0]  # two completed runs of real turns and tool calls
    assert figures["runs"] == 2 and figures["by_status"]["completed"] == 2
    tools = {t["tool"]: t for t in figures["tools"]}
    assert tools["write_file"]["calls"] == 2 and tools["write_file"]["latency"]["timed"] == 2
    (notes,) = figures["verifiers"]  # filed under the name --verify gave its command
    assert (notes["verifier"], notes["checks"], notes["passed"]) == ("notes", 1, 1)
    queued = keel("run", "later", "--model", ws.script(DONE), "--detach")[0]["run_id"]
    assert keel("message", queued, "use tabs")[0]["follow_up"] is None
    follow_up = keel("message", run_id, "now add a README", "--detach")[0]
    assert follow_up["follows"] == run_id and follow_up["status"] == "queued"
    assert keel("cancel", queued, "--reason", "not needed")[0]["status"] == "cancelled"
    store = open_store(ws.url)
    try:  # a running run no process drives (its process died): paused at once
        state = store.load_run(follow_up["run_id"])
        store.append_events(
            state.run_id, [transition(state, RunStatus.RUNNING, None)], expected_seq=state.last_seq
        )
    finally:
        store.close()
    assert keel("pause", state.run_id, "--reason", "lunch")[0]["status"] == "paused"
    assert keel("token", "create", "ci")[0]["name"] == "ci"
    assert [t["name"] for t in keel("token", "list")[0]] == ["ci"]
    assert keel("skills", "list", "--workspace", str(ws.root)) == [[]]
    assert keel("mcp", "list", "--workspace", str(ws.root)) == [[]]

    first = keel("tasks", "create", "create the schema")[0]["id"]
    second = keel("tasks", "create", "write the API")[0]["id"]
    third = keel("tasks", "create", "write docs")[0]["id"]
    keel("tasks", "block", second, "--by", first)
    keel("tasks", "list")
    keel("tasks", "show", first)
    keel("tasks", "claim", first)
    keel("tasks", "complete", first, "--result", "done")
    keel("tasks", "claim", second)
    keel("tasks", "fail", second, "--reason", "no time")
    keel("tasks", "reopen", second)
    keel("tasks", "cancel", third, "--reason", "not needed")
    keel("tasks", "graph")
    assert keel("gc")[0] == {"dry_run": False, "removed": [], "kept": [], "problems": []}
    suite = Path(__file__).resolve().parents[2] / "examples" / "eval" / "suite.toml"
    report = keel("eval", str(suite), "--repetitions", "1", "--workdir", str(ws.root / "evals"))
    assert report[0]["passed"] is True

    assert keel.ran == commands_with_json(), "drive every --json command in this test"
