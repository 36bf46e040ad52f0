"""No input strands a run: whatever a model sends, every call gets an outcome and the run goes on.

Runs are real: a Harness over a SQLite file, the built-in tools on a real workspace
(with file names that are not UTF-8, a control character in a name, a deep tree),
ScriptedModel for the model's turns. A generated corpus (hypothesis) mixes lone
surrogates, NUL and control characters, over-long path components, escapes, huge
numbers, wrong types and malformed JSON into every argument of every built-in tool
and into every part of a turn (content, reasoning, tool names, call ids).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, field_validator

from keel.core.budget import Budget
from keel.core.errors import ModelError
from keel.core.events import Event, EventType
from keel.core.state import RunState
from keel.core.status import RunStatus
from keel.models.base import ModelRequest, ModelTurn
from keel.runtime.harness import Harness
from keel.store.base import iter_all_events
from keel.testing import ScriptedModel
from keel.testing.stores import postgres_unavailable, scratch_database
from keel.tools import BUILTIN_TOOLS, Effect, Recovery, ToolContext, ToolResult, tool
from keel.tools.builtin import default_registry

BAD_NAME = b"bad\xffname.txt"  # not UTF-8: shown as bad\xffname.txt
POLICY = '[[rule]]\naction = "allow"\ntool = "run_command"\nreason = "tests run echo"\n'
SAFE_PROGRAMS = ("echo", "true", "printf")
# Tools whose call ends the turn's work (completion, a question): tried on their own below.
ENDING = frozenset({"request_completion", "ask_user"})
TOOL_NAMES = [t.name for t in BUILTIN_TOOLS if t.name not in ENDING]
ARGUMENTS = {t.name: sorted(t.args_model.model_fields) for t in BUILTIN_TOOLS}

NASTY_PIECES = [
    "\ud800",  # lone high surrogate
    "\udcff",  # the surrogateescape of byte 0xff
    "\x00",
    "\n",
    "\x1b[31m",
    "\\xff",  # the spelling of a byte that is not UTF-8
    "\\x00",
    "\\xc3\\xa9",  # bytes of a valid character, spelled as bytes: refused
    "bad\\xffname.txt",
    "dir\\x0aname",
    "..",
    "/",
    "/etc/passwd",
    "*",
    "**",
    "**/**/**/*a*a*a*b",
    "[",
    "(a+)+$",
    "(a)\\1",
    "(?<=x)y",
    "x" * 300,
    "é" * 130,
    ".env",
    ".keel/keel.db",
    ".git/config",
    "plans",
    "f.txt",
    "deep",
    "",
]
nasty_text = st.one_of(
    st.lists(st.sampled_from(NASTY_PIECES), max_size=4).map("".join),
    st.text(max_size=30),
)
numbers = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
)
values = st.recursive(
    st.one_of(nasty_text, numbers, st.booleans(), st.none()),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(nasty_text, inner, max_size=3)
    ),
    max_leaves=6,
)
raw_arguments = st.sampled_from(
    [
        "",
        "{",
        "[1, 2]",
        '"text"',
        "null",
        '{"path": "\\ud800x"}',  # a lone surrogate spelled as a JSON escape
        '{"path": "\\udcff"}',
        '{"pattern": "\\ud83d\\ude00"}',  # a proper pair: stays an emoji
        '{"offset": 1e999}',
        '{"limit": NaN}',
        '{"offset": ' + "9" * 5000 + "}",  # more digits than Python converts
        "[" * 5000 + "]" * 5000,  # deeper than the parser goes
        '{"a": ' * 100 + "1" + "}" * 100,
    ]
)


nasty_path = st.one_of(
    st.sampled_from([".", "f.txt", "deep", "bad\\xffname.txt", "dir\\x0aname", "**/*.txt"]),
    st.lists(
        st.sampled_from([*NASTY_PIECES, "f.txt", "deep/a", "bad\\xffname.txt", "*.txt"]),
        min_size=1,
        max_size=4,
    ).map("/".join),
)
FITTING: dict[str, st.SearchStrategy[Any]] = {
    "path": nasty_path,
    "pattern": nasty_path,
    "glob": nasty_path,
    "offset": numbers,
    "limit": numbers,
    "timeout_seconds": st.floats(min_value=0.01, max_value=5),
    "argv": st.lists(nasty_text, min_size=1, max_size=3).map(
        lambda argv: ["echo", *argv[1:]]  # never anything but echo: any argument is safe
    ),
    "todos": st.lists(
        st.fixed_dictionaries(
            {
                "content": nasty_text,
                "status": st.sampled_from(["pending", "in_progress", "completed", "\ud800"]),
            }
        ),
        max_size=3,
    ),
    "blocked_by": st.lists(nasty_text, max_size=2),
    "ready": st.booleans(),
    "status": st.sampled_from(["pending", "completed", "cancelled", "\x00"]),
}


@st.composite
def tool_calls(draw: st.DrawFn) -> dict[str, Any]:
    """Mostly real tools with arguments of the right shape and hostile content; now and
    then an unknown name, a wrong type, an extra argument or malformed JSON text."""
    known = draw(st.integers(0, 9)) > 0
    name = draw(st.sampled_from(TOOL_NAMES) if known else nasty_text.filter(bool))
    arguments: Any
    if draw(st.integers(0, 9)) == 0:
        arguments = draw(raw_arguments)
    else:
        arguments = {}
        for key in ARGUMENTS.get(name, ["path"]):
            if draw(st.integers(0, 5)) == 0:
                continue  # an argument left out
            wrong = draw(st.integers(0, 7)) == 0
            arguments[key] = draw(values if wrong else FITTING.get(key, nasty_text))
        if draw(st.integers(0, 9)) == 0:
            arguments["extra"] = draw(values)
        if name == "run_command":
            arguments["argv"] = ["echo", *map(str, arguments.get("argv") or [])][:4]
            arguments["timeout_seconds"] = 5
    call: dict[str, Any] = {"name": name, "arguments": arguments}
    if draw(st.integers(0, 3)) == 0:
        call["id"] = draw(st.sampled_from(["same", "x\ud800", "call\x00id"]))
    return call


turn_strategy = st.fixed_dictionaries(
    {"tool_calls": st.lists(tool_calls(), min_size=1, max_size=3)},
    optional={"content": nasty_text, "reasoning": nasty_text},
)


def hostile_workspace(root: Path) -> Path:
    """A workspace a model can trip over: names that are not UTF-8, a newline in a
    name, a deep tree, a link out, a FIFO, a binary file."""
    ws = root / "ws"
    ws.mkdir()
    (ws / "f.txt").write_text("hello\nworld\n")
    (ws / "bin.dat").write_bytes(b"\x00\x01\x02")
    with open(os.path.join(os.fsencode(ws), BAD_NAME), "wb") as handle:
        handle.write(b"caf\xe9 not utf-8\n")
    os.mkdir(os.path.join(os.fsencode(ws), b"dir\nname"))
    deep = ws / "deep"
    for _ in range(30):
        deep = deep / "a"
    deep.mkdir(parents=True)
    (deep / "leaf.txt").write_text("a" * 40 + "\n")
    (ws / "out").symlink_to("/etc")
    os.mkfifo(ws / "pipe")
    (ws / "policy.toml").write_text(POLICY)
    return ws


def run_script(
    root: Path, turns: list[dict[str, Any]], *, store: str | None = None, **options: Any
) -> tuple[Harness, RunState]:
    ws = hostile_workspace(root)
    url = store or f"sqlite:///{root / 'keel.db'}"
    harness = Harness(store=url, model=ScriptedModel(turns))
    outcome = harness.run(
        "survive whatever the model sends",
        cwd=ws,
        mode="auto",
        sandbox="off",
        policy_file=ws / "policy.toml",
        budget=Budget(max_steps=len(turns) + 3, max_wall_seconds=60),
        **options,
    )
    return harness, outcome.state


def assert_not_stranded(harness: Harness, state: RunState) -> list[Event]:
    """The run is not `running` without a driver, was not failed by the loop itself, and
    every call the model made has an outcome or still waits its turn."""
    events = list(iter_all_events(harness.store, state.run_id))
    assert state.status is not RunStatus.RUNNING, state
    assert not (state.reason or "").startswith("internal_error"), state.reason
    if state.status is RunStatus.WAITING:
        assert (state.reason or "").startswith(("approval:", "question:")), state.reason
    asked = [
        call["id"]
        for event in events
        if event.type is EventType.MODEL_RESPONDED
        for call in event.data["tool_calls"]
    ]
    answered = {
        event.data["call_id"]
        for event in events
        if event.type in (EventType.TOOL_FINISHED, EventType.TOOL_FAILED)
    }
    waiting = {call["id"] for call in state.turn_calls}
    assert set(asked) <= answered | waiting, (asked, answered, waiting)
    for event in events:  # every stored string is valid text, every number standard JSON
        json.dumps(event.data, ensure_ascii=False, allow_nan=False).encode("utf-8")
    return events


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(turns=st.lists(turn_strategy, min_size=1, max_size=3))
def test_generated_model_output_never_strands_a_run(turns: list[dict[str, Any]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        harness, state = run_script(Path(tmp), turns)
        try:
            assert_not_stranded(harness, state)
            if state.status is RunStatus.FAILED and (state.reason or "").startswith("model_"):
                # The run went on through every turn and only stopped when the script did.
                assert f"no turn {len(turns)}" in (state.reason or ""), state.reason
        finally:
            harness.close()


HOSTILE_ARGUMENTS: dict[str, list[Any]] = {
    "read_file": [
        {"path": "x" * 300},
        {"path": "a\ud800b"},
        {"path": "a\x00b"},
        {"path": "pipe"},
        {"path": "bin.dat"},
        {"path": "f.txt", "offset": 10**30, "limit": 10**30},
        {"path": "f.txt", "offset": "1"},
        {"path": ["f.txt"]},
        '{"path": "f.txt", "offset": ' + "9" * 5000 + "}",
    ],
    "list_dir": [{"path": "out"}, {"path": "dir\nname"}, {"path": 5}, "[" * 5000],
    "glob": [{"pattern": "/" + "**/" * 50 + "*a*a*a*a*b"}, {"pattern": "\ud800"}, {"pattern": ""}],
    "grep": [{"pattern": "(a)\\1"}, {"pattern": "(a+)+$", "glob": "\x00"}, {"pattern": "["}],
    "write_file": [
        {"path": "é" * 130, "content": "x"},
        {"path": "new\ud800.txt", "content": "x"},
        {"path": "ok.txt", "content": "lone \ud800 surrogate"},
        {"path": "/etc/passwd", "content": "x"},
        {"path": "f.txt/child", "content": "x"},
    ],
    "edit_file": [
        {"path": "f.txt", "old_text": "hello", "new_text": "\udcff"},
        {"path": "f.txt", "old_text": "", "new_text": "x"},
        {"path": "bad\\xc3\\xa9", "old_text": "a", "new_text": "b"},
        {"path": "deep", "old_text": "a", "new_text": "b"},
    ],
    "run_command": [
        {"argv": ["echo", "a\x00b"]},
        {"argv": ["echo", "\ud800"]},
        {"argv": ["x" * 300 + "/prog"]},
        {"argv": []},
        {"argv": ["true"], "timeout_seconds": 1e308},
        '{"argv": ["true"], "timeout_seconds": Infinity}',
        {"argv": ["true"], "timeout_seconds": float("nan")},
        {"argv": ["true"], "timeout_seconds": -1},
    ],
    "todo_write": [{"todos": [{"content": "\ud800", "status": "pending"}]}, {"todos": "all"}],
    "plan_write": [{"content": "plan \ud800"}, {"content": ""}],
    "plan_exit": [{"summary": "\ud800"}],
    "load_skill": [{"name": "../../etc"}, {"name": "\x00"}, {"name": "x" * 500}, {"name": 7}],
    "create_task": [{"subject": "s\x00\ud800", "description": "\udcff"}],
    "add_dependency": [{"task_id": "task_\ud800", "blocked_by": ["\x00"]}],
    "list_tasks": [{"status": "nonsense"}, {"ready": "yes"}],
    "get_task": [{"task_id": "\x00"}],
    "claim_task": [{"task_id": "x" * 10_000}],
    "complete_task": [{"task_id": "\ud800", "result": "\x00"}],
    "fail_task": [{"task_id": "nope", "reason": "\ud800"}],
    "cancel_task": [{"task_id": "\ud800", "reason": "\x00"}, {"task_id": 7}],
    "request_completion": [{"summary": "done \ud800"}],
    "ask_user": [{"question": "why \ud800?"}],
    "agent_spawn": [
        {"agent": "../../etc/passwd", "task": "x"},
        {"agent": "nope", "task": "\ud800\x00"},
        {"agent": "explorer", "task": ""},
        {"agent": "explorer", "task": "x", "inputs": "not an object"},
        {"agent": "explorer", "task": "x", "on_failure": "explode"},
        {"agent": "E" * 100, "task": "x"},
    ],
    "agent_wait": [
        {"ids": []},
        {"ids": ["\x00", "run_\ud800"]},
        {"ids": ["task_nope"], "timeout_seconds": -1},
        {"ids": "all"},
    ],
    "agent_result": [{"id": "\ud800"}, {"id": "task_nope"}, {"id": 7}],
    "handoff": [{"agent": "nope", "note": "x"}, {"agent": "../x", "note": "\ud800"}],
    "apply_patch": [
        {"artifact": "art_nope"},
        {"artifact": "../../etc/passwd"},
        {"artifact": "\x00"},
    ],
}


def test_every_builtin_tool_is_covered() -> None:
    assert set(HOSTILE_ARGUMENTS) == {t.name for t in BUILTIN_TOOLS}


@pytest.mark.parametrize("name", sorted(HOSTILE_ARGUMENTS))
def test_hostile_arguments_to_each_builtin_become_outcomes(tmp_path: Path, name: str) -> None:
    turns = [{"tool_calls": [{"name": name, "arguments": a}]} for a in HOSTILE_ARGUMENTS[name]]
    harness, state = run_script(tmp_path, turns)
    try:
        events = assert_not_stranded(harness, state)
        failures = [e.data for e in events if e.type is EventType.TOOL_FAILED]
        for failure in failures:
            assert failure["error_kind"] and failure["message"], failure
            assert "Traceback" not in failure["message"]
        if name not in ENDING:
            assert f"no turn {len(turns)}" in (state.reason or ""), state.reason
    finally:
        harness.close()


@pytest.mark.postgres
def test_hostile_arguments_to_every_builtin_on_postgresql(tmp_path: Path) -> None:
    """PostgreSQL refuses NUL in text columns and non-standard JSON: still only outcomes."""
    if reason := postgres_unavailable():
        pytest.skip(f"PostgreSQL not tested: {reason}")
    turns = [
        {"tool_calls": [{"name": name, "arguments": arguments}]}
        for name, cases in sorted(HOSTILE_ARGUMENTS.items())
        if name not in ENDING
        for arguments in cases
    ]
    with scratch_database() as url:
        harness, state = run_script(tmp_path, turns, store=url)
        try:
            assert_not_stranded(harness, state)
            assert f"no turn {len(turns)}" in (state.reason or ""), state.reason
        finally:
            harness.close()


def test_model_text_is_made_valid_and_the_change_recorded(tmp_path: Path) -> None:
    turns = [
        {
            "content": "thinking \ud800 aloud",
            "reasoning": "\udcff",
            "tool_calls": [
                {"id": "same", "name": "read\ud800", "arguments": "{}"},
                {"id": "same", "name": "read_file", "arguments": '{"path": "f\\ud800.txt"}'},
            ],
        },
        {"content": "done \ud83d\ude00"},
    ]
    harness, state = run_script(tmp_path, turns)
    try:
        events = assert_not_stranded(harness, state)
        assert state.status is RunStatus.COMPLETED
        first = next(e.data for e in events if e.type is EventType.MODEL_RESPONDED)
        assert first["content"] == "thinking \ufffd aloud"
        assert first["reasoning"] == "\ufffd"
        calls = first["tool_calls"]
        assert [c["id"] for c in calls] == ["same", "same#2"]
        assert calls[0]["name"] == "read\ufffd"
        assert json.loads(calls[1]["arguments"]) == {"path": "f\ufffd.txt"}
        assert any("content" in note for note in first["sanitized"])
        assert any("tool_calls[1].id" in note for note in first["sanitized"])
        failed = {e.data["call_id"]: e.data for e in events if e.type is EventType.TOOL_FAILED}
        assert failed["same"]["error_kind"] == "unknown_tool"
        assert "does not exist" in failed["same#2"]["message"]
        final = [e.data for e in events if e.type is EventType.MODEL_RESPONDED][-1]
        assert final["content"] == "done \U0001f600" and "sanitized" not in final
    finally:
        harness.close()


def test_names_that_are_not_utf8_are_shown_escaped_and_reach_the_same_file(
    tmp_path: Path,
) -> None:
    turns = [
        {
            "tool_calls": [
                {"name": "list_dir", "arguments": {}},
                {"name": "glob", "arguments": {"pattern": "*\\xff*"}},
                {"name": "grep", "arguments": {"pattern": "not utf-8"}},
            ]
        },
        {
            "tool_calls": [
                {"name": "read_file", "arguments": {"path": "bad\\xffname.txt"}},
                {
                    "name": "edit_file",
                    "arguments": {
                        "path": "bad\\xffname.txt",
                        "old_text": "not utf-8",
                        "new_text": "edited",
                    },
                },
                {"name": "list_dir", "arguments": {"path": "dir\\x0aname"}},
            ]
        },
        {"content": "done"},
    ]
    harness, state = run_script(tmp_path, turns)
    try:
        events = assert_not_stranded(harness, state)
        out = [e.data["output"] for e in events if e.type is EventType.TOOL_FINISHED]
        listing, globbed, grepped, read, edited, inner = out
        assert "bad\\xffname.txt  (" in listing and "dir\\x0aname/" in listing
        assert globbed == "bad\\xffname.txt"
        assert grepped.startswith("bad\\xffname.txt:1: caf\ufffd not utf-8")
        assert read == "     1\tcaf\ufffd not utf-8"
        assert edited == "edited bad\\xffname.txt: replaced 1 occurrence at line 1"
        assert inner == "dir\\x0aname is empty"
        real = os.path.join(os.fsencode(tmp_path / "ws"), BAD_NAME)
        with open(real, "rb") as handle:
            assert handle.read() == b"caf\xe9 edited\n"
        assert list(state.changed_files) == ["bad\\xffname.txt"]
    finally:
        harness.close()


def test_a_path_no_file_can_have_is_an_argument_error_before_the_policy(tmp_path: Path) -> None:
    turns = [
        {
            "tool_calls": [
                {"name": "write_file", "arguments": {"path": "a/" + "x" * 256, "content": "x"}},
                {"name": "read_file", "arguments": {"path": "a\x00b"}},
                {"name": "list_dir", "arguments": {"path": "caf\\xc3\\xa9"}},
            ]
        }
    ]
    harness, state = run_script(tmp_path, turns)
    try:
        events = assert_not_stranded(harness, state)
        failed = [e.data for e in events if e.type is EventType.TOOL_FAILED]
        assert [f["error_kind"] for f in failed] == ["invalid_arguments"] * 3
        assert "a component 'xxx" in failed[0]["message"] and "255 bytes" in failed[0]["message"]
        assert "NUL" in failed[1]["message"]
        assert "write 'café'" in failed[2]["message"]
    finally:
        harness.close()


# --- a tool that breaks, in each of its parts ------------------------------------------


class Stubborn(BaseModel):
    value: str

    @field_validator("value")
    @classmethod
    def explode(cls, value: str) -> str:
        if value == "boom":
            raise RuntimeError("validator exploded")  # not a ValueError: pydantic lets it out
        return value


def _broken_intent(ctx: ToolContext, path: str) -> dict[str, str]:
    raise KeyError("intent exploded")


@tool(effect=Effect.READ)
def buggy_read(ctx: ToolContext, path: str) -> ToolResult:
    """A tool with a bug."""
    raise ZeroDivisionError("division by zero in the tool")


@tool(effect=Effect.WRITE, recovery=Recovery.VERIFY_THEN_CONTINUE, intent=_broken_intent)
def buggy_write(ctx: ToolContext, path: str) -> ToolResult:
    """A write whose intent has a bug."""
    raise AssertionError("never reached: the intent fails first")


@tool(effect=Effect.READ)
def picky(ctx: ToolContext, item: Stubborn) -> ToolResult:
    """A tool whose argument validation has a bug."""
    return ToolResult(output=item.value)


def test_a_tool_exception_its_intent_or_its_arguments_become_tool_errors(tmp_path: Path) -> None:
    registry = default_registry()
    for extra in (buggy_read, buggy_write, picky):
        registry.register(extra)
    turns = [
        {
            "tool_calls": [
                {"name": "buggy_read", "arguments": {"path": "x"}},
                {"name": "buggy_write", "arguments": {"path": "x"}},
                {"name": "picky", "arguments": {"item": {"value": "boom"}}},
                {"name": "picky", "arguments": {"item": {"value": "fine"}}},
            ]
        },
        {"content": "done"},
    ]
    ws = hostile_workspace(tmp_path)
    harness = Harness(
        store=f"sqlite:///{tmp_path / 'keel.db'}", model=ScriptedModel(turns), tools=registry
    )
    try:
        state = harness.run("break", cwd=ws, mode="auto", sandbox="off").state
        events = assert_not_stranded(harness, state)
        assert state.status is RunStatus.COMPLETED
        failed = {
            e.data["tool"] + ":" + e.data["call_id"]: e.data
            for e in events
            if e.type is EventType.TOOL_FAILED
        }
        by_tool = {key.split(":")[0]: data for key, data in failed.items()}
        assert by_tool["buggy_read"]["error_kind"] == "tool_exception"
        assert by_tool["buggy_read"]["message"] == "ZeroDivisionError: division by zero in the tool"
        assert by_tool["buggy_write"]["error_kind"] == "tool_exception"
        assert "KeyError" in by_tool["buggy_write"]["message"]
        assert by_tool["picky"]["error_kind"] == "invalid_arguments"
        assert "validator exploded" in by_tool["picky"]["message"]
        assert not [e for e in events if e.type is EventType.TOOL_STARTED]  # nothing began
        finished = [e.data for e in events if e.type is EventType.TOOL_FINISHED]
        assert [f["output"] for f in finished] == ["fine"]
    finally:
        harness.close()


# --- what still reaches the driver ends the run, never strands it ------------------------


class BrokenModel:
    """A model adapter with a bug: its first answer raises something that is not a ModelError."""

    spec = "broken:adapter"

    def __init__(self, error: Callable[[], Exception]) -> None:
        self.error = error

    def complete(self, request: ModelRequest) -> ModelTurn:
        if request.step == 0:
            raise self.error()
        raise ModelError("only one turn", transient=False)


def test_an_unexpected_exception_in_the_loop_fails_the_run_with_its_type(tmp_path: Path) -> None:
    ws = hostile_workspace(tmp_path)
    model = BrokenModel(lambda: TypeError("adapter bug: 'NoneType' is not subscriptable\x00"))
    harness = Harness(store=f"sqlite:///{tmp_path / 'keel.db'}", model=model)
    try:
        outcome = harness.run("trip", cwd=ws, sandbox="off")
        assert outcome.status is RunStatus.FAILED
        assert outcome.stop_reason == (
            "internal_error: TypeError: adapter bug: 'NoneType' is not subscriptable"
        )
        stored = harness.store.load_run(outcome.id)
        assert stored.status is RunStatus.FAILED and stored.reason == outcome.stop_reason
        error = (stored.result or {})["error"]
        assert error["type"] == "TypeError" and error["frames"]
        # A resume finds it finished: nothing is driven again.
        assert harness.resume(outcome.id).status is RunStatus.FAILED
    finally:
        harness.close()


def test_a_link_with_an_escaped_name_is_judged_where_it_leads(tmp_path: Path) -> None:
    """Spelling a name in bytes does not walk around the policy: a link named
    ``\\xfflink`` to ``.env`` is a read of a secret, and asks first."""
    ws = hostile_workspace(tmp_path)
    (ws / ".env").write_text("API_TOKEN=hunter2hunter2\n")
    os.symlink(".env", os.path.join(os.fsencode(ws), b"\xfflink"))
    turns = [{"tool_calls": [{"name": "read_file", "arguments": {"path": "\\xfflink"}}]}]
    harness = Harness(store=f"sqlite:///{tmp_path / 'keel.db'}", model=ScriptedModel(turns))
    try:
        outcome = harness.run("peek", cwd=ws, mode="auto", sandbox="off")
        assert outcome.status is RunStatus.WAITING
        events = list(iter_all_events(harness.store, outcome.id))
        asked = next(e.data for e in events if e.type is EventType.APPROVAL_REQUESTED)
        assert asked["rule"] == "secret"
        assert not [e for e in events if e.type is EventType.TOOL_FINISHED]
    finally:
        harness.close()
