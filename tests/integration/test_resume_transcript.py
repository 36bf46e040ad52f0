"""A resumed long run shows the model exactly the conversation a never-stopped process
would: the continuation of the latest compaction, as stored, and every message since.

The crashed process is the real ``keel run`` command, killed (SIGKILL, ``KEEL_FAULT``)
between a model's answer and its commit; the resumed process and the never-stopped one
are harnesses in this process whose ``ScriptedModel`` records every request.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from keel.core.budget import Budget
from keel.core.events import EventType
from keel.core.status import RunStatus
from keel.loop.transcript import TRANSCRIPT_TAIL_EVENTS, Transcript, recent_transcript
from keel.models.base import ModelRequest
from keel.runtime.harness import Harness
from keel.store.url import open_store
from keel.testing import ScriptedModel

KEEL = str(Path(sys.executable).with_name("keel"))
STEPS = 300
CRASH_AT = 150  # the model's 150th answer is never committed
GOAL = "read notes.txt in parts"
TOOLS = "read_file,todo_write"
CONTEXT = 3000


def script() -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = []
    for i in range(STEPS):
        if i % 60 == 0:
            items = [
                {"content": f"read part {i // 60}", "status": "in_progress"},
                {"content": f"note what part {i // 60} says", "status": "pending"},
            ]
            turns.append({"tool_calls": [{"name": "todo_write", "arguments": {"todos": items}}]})
        elif i % 11 == 5:
            turns.append({"tool_calls": [{"name": "read_file", "arguments": {"path": "gone.txt"}}]})
        else:
            arguments = {"path": "notes.txt", "offset": i % 390 + 1, "limit": 4}
            turns.append({"tool_calls": [{"name": "read_file", "arguments": arguments}]})
    turns.append({"tool_calls": [{"name": "request_completion", "arguments": {"summary": "ok"}}]})
    return turns


def wire(request: ModelRequest) -> str:
    return json.dumps([asdict(m) for m in request.messages], sort_keys=True)


def test_a_run_killed_mid_way_resumes_with_requests_byte_identical_to_a_never_stopped_run(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    lines = (f"line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(400))
    (ws / "notes.txt").write_text("".join(lines), encoding="utf-8")
    script_file = tmp_path / "script.json"
    script_file.write_text(json.dumps(script()), encoding="utf-8")
    url = f"sqlite:///{tmp_path / 'keel.db'}"
    budget = ["--max-steps", "400", "--max-tool-calls", "400"]

    never_stopped = ScriptedModel(script())
    with Harness(store=url, model=never_stopped) as harness:
        reference = harness.run(
            GOAL,
            cwd=ws,
            budget=Budget(max_steps=400, max_tool_calls=400),
            tools=TOOLS.split(","),
            context_tokens=CONTEXT,
        )
    assert reference.status is RunStatus.COMPLETED, reference.stop_reason

    env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
    env.update(KEEL_FAULT=f"mid_model_step:{CRASH_AT}", KEEL_STORE=url)
    crashed = subprocess.run(
        [KEEL, "run", GOAL, "--model", f"scripted:{script_file}", "--cwd", str(ws), *budget,
         "--tools", TOOLS, "--context-tokens", str(CONTEXT), "--json"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert crashed.returncode == -9, crashed.stderr
    run_id = json.loads(crashed.stdout.splitlines()[0])["run_id"]
    with open_store(url) as store:
        before = [e for e in store.read_events(run_id) if e.type is EventType.CONTEXT_COMPACTED]
        assert store.load_run(run_id).usage.steps == CRASH_AT - 1
    assert len(before) >= 3  # the resumed process starts from a stored continuation

    resumed = ScriptedModel(script())
    with Harness(store=url, model=resumed) as harness:
        outcome = harness.resume(run_id)
        events = list(harness.events(run_id))
    assert outcome.status is RunStatus.COMPLETED, outcome.stop_reason

    assert resumed.requests[0].step == CRASH_AT - 1  # the lost answer is asked again
    by_step = {r.step: r for r in never_stopped.requests}
    for request in resumed.requests:
        assert wire(request) == wire(by_step[request.step]), request.step
    after = [e for e in events if e.type is EventType.CONTEXT_COMPACTED][len(before) :]
    assert len(after) >= 3  # and the resumed process went on compacting the same way
    assert [e.data["text"] for e in after] == [
        e.data["text"]
        for e in events_of(url, reference.id)
        if e.type is EventType.CONTEXT_COMPACTED
    ][len(before) :]


def events_of(url: str, run_id: str) -> list[Any]:
    with open_store(url) as store:
        return list(store.read_events(run_id))


def test_a_run_waiting_for_an_answer_rebuilds_its_view_from_the_latest_compaction(
    tmp_path: Path,
) -> None:
    """The rebuilt transcript reads the log back only to the latest compaction, and the
    resumed request is the continuation and every message since, as a fold of the whole
    log shows it."""
    (tmp_path / "a.txt").write_text("hello\n" * 30)
    turns: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "read_file", "arguments": {"path": "a.txt", "limit": i % 30 + 1}}]}
        for i in range(150)
    ]
    turns.append({"tool_calls": [{"name": "ask_user", "arguments": {"question": "go on?"}}]})
    turns.append({"content": "done"})
    url = f"sqlite:///{tmp_path / 'keel.db'}"
    budget = Budget(max_steps=300, max_tool_calls=300)
    with Harness(store=url, model=ScriptedModel(turns)) as first:
        waiting = first.run("read a lot", cwd=tmp_path, budget=budget, context_tokens=CONTEXT)
    assert waiting.status is RunStatus.WAITING

    resumed_model = ScriptedModel(turns)
    with Harness(store=url, model=resumed_model) as second:
        second.answer(waiting.id, "yes")
        with open_store(url) as store:
            events = list(store.read_events(waiting.id))
            answered = Transcript(events)
            rebuilt = recent_transcript(store, store.load_run(waiting.id))
        outcome = second.resume(waiting.id)
        second_events = list(second.events(waiting.id))

    assert outcome.status is RunStatus.COMPLETED
    latest = [e for e in events if e.type is EventType.CONTEXT_COMPACTED][-1]
    assert rebuilt.view() == answered.view() and rebuilt.tokens == answered.tokens
    assert rebuilt.compaction == latest.data
    assert min(entry.seq for entry in rebuilt) > latest.data["through_seq"]
    (request,) = resumed_model.requests
    assert request.step == 151
    # The answer made the request pass the threshold: the resumed process compacted again
    # and sent the view a fold of the log up to that request shows.
    asked = next(
        e.seq
        for e in second_events
        if e.type is EventType.MODEL_REQUESTED and e.data["step"] == 152
    )
    sent = Transcript(e for e in second_events if e.seq < asked)
    assert list(request.messages[2:]) == sent.view()  # system, goal, then the view
    assert sent.compaction is not None and sent.compaction["step"] == 151


def test_a_kept_part_longer_than_the_first_window_is_read_back_whole(tmp_path: Path) -> None:
    """The latest compaction lies before the last TRANSCRIPT_TAIL_EVENTS events: the
    events between it and that window are read as well, and the view is the fold's."""
    (tmp_path / "a.txt").write_text("hi\n")
    turns: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "read_file", "arguments": {"path": "a.txt", "limit": i + 1}}]}
        for i in range(700)
    ]
    turns.append({"content": "done"})
    url = f"sqlite:///{tmp_path / 'keel.db'}"
    with Harness(store=url, model=ScriptedModel(turns)) as harness:
        outcome = harness.run(
            "read a lot",
            cwd=tmp_path,
            budget=Budget(max_steps=800, max_tool_calls=800),
            context_tokens=20_000,
        )
    assert outcome.status is RunStatus.COMPLETED, outcome.stop_reason
    with open_store(url) as store:
        state = store.load_run(outcome.id)
        events = list(store.read_events(outcome.id))
        rebuilt = recent_transcript(store, state)
    latest = [e for e in events if e.type is EventType.CONTEXT_COMPACTED][-1]
    assert latest.data["through_seq"] < state.last_seq - TRANSCRIPT_TAIL_EVENTS
    whole = Transcript(events)
    assert rebuilt.view() == whole.view() and rebuilt.tokens == whole.tokens
