"""Record a run against a real loopback provider, then replay it with no provider at all.

The recording run is the real ``keel`` command (or the Python API) with the real HTTP
adapter talking to ``FakeProvider`` on 127.0.0.1, on a workspace where read_file and
write_file really run. The replay runs in a fresh copy of that workspace, at the same
path (the system prompt names it), with a fresh store and no API key: its events must
be the recording's, but for what `normalised` names; and a replay where something the
model sees changed must stop at that step, saying which message differs.
"""

from __future__ import annotations

import json
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from keel.core.events import Event, EventType
from keel.core.status import RunStatus
from keel.models.cassette import ReplayModel
from keel.runtime.harness import Harness
from keel.store.base import iter_all_events
from keel.testing.cli import KeelWorkspace, expect
from keel.testing.provider import FakeProvider

API_KEY = "sk-live-4f7a9c2e1b8d6f3a0c5e7b9d2f4a6c8e-secret"
GOAL = "copy notes.txt to out.txt in upper case"
NOTES = "hello from the notes\n"
MODEL = "openai:gpt-4o"

# What differs between two runs of the same events, each for a stated reason.
VARYING_FIELDS = {
    "event_id": "a fresh uuid per event",
    "hash": "each event's hash chains over its id and time",
    "recorded_at": "when the event was stored",
    "elapsed_s": "how long the model, a tool or a verifier took",
}


def normalised(events: list[Event], *, run_id: str, model_spec: str) -> list[dict[str, Any]]:
    """`events` as dicts with exactly these replaced: the `VARYING_FIELDS`, the run id
    (also inside values, e.g. an idempotency key ``<run_id>:<call_id>``) and the model
    spec (the recording run says ``openai:gpt-4o``, the replay ``replay:FILE``)."""

    def scrub(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: f"<{k}>" if k in VARYING_FIELDS else scrub(v) for k, v in value.items()}
        if isinstance(value, list):
            return [scrub(v) for v in value]
        if isinstance(value, str):
            return "<model spec>" if value == model_spec else value.replace(run_id, "<run_id>")
        return value

    return [scrub(event.to_dict()) for event in events]


def assert_same_run(replayed: list[dict[str, Any]], recorded: list[dict[str, Any]]) -> None:
    """Event by event, so a failure shows the first event that differs and how."""
    assert [e["type"] for e in replayed] == [e["type"] for e in recorded]
    for again, before in zip(replayed, recorded, strict=True):
        assert again == before


def script_provider(provider: FakeProvider) -> None:
    """Four turns: read, write (saying the key on the way), read back, answer."""
    provider.reply(tool_calls=[("read_file", {"path": "notes.txt"})], usage=(120, 10))
    provider.reply(
        f"writing it now; I will not use {API_KEY}",
        tool_calls=[("write_file", {"path": "out.txt", "content": NOTES.upper()})],
        usage=(160, 20),
    )
    provider.reply(tool_calls=[("read_file", {"path": "out.txt"})], usage=(200, 10))
    provider.reply(f"done: out.txt holds the notes in upper case ({API_KEY})", usage=(240, 12))


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    with FakeProvider() as server:
        yield server


@pytest.fixture
def template(tmp_path: Path) -> Path:
    """The pristine workspace every run starts from a copy of."""
    root = tmp_path / "template"
    root.mkdir()
    (root / "notes.txt").write_text(NOTES, encoding="utf-8")
    return root


def fresh_workspace(template: Path, at: Path, *, notes: str = NOTES) -> Path:
    """A fresh copy of `template` at `at` (the path the recording ran at): what was
    there is moved aside, so the system prompt's workspace line stays the same."""
    if at.exists():
        aside = next(
            at.with_name(f"{at.name}-before-{n}")
            for n in range(100)
            if not at.with_name(f"{at.name}-before-{n}").exists()
        )
        at.rename(aside)
    shutil.copytree(template, at)
    (at / "notes.txt").write_text(notes, encoding="utf-8")
    return at


def assert_cassette_holds_no_credentials(cassette: Path) -> None:
    text = cassette.read_text(encoding="utf-8")
    assert API_KEY not in text
    assert "[redacted:OPENAI_API_KEY]" in text  # the key was there to leak, and was redacted
    assert "authorization" not in text.lower()
    assert "bearer" not in text.lower()


# --- the keel command ----------------------------------------------------------------------


def keel_in(root: Path, store: Path, **env: str) -> KeelWorkspace:
    return KeelWorkspace(root=root, store_url=f"sqlite:///{store}", env=dict(env))


def test_a_replayed_run_has_the_recorded_runs_events(
    tmp_path: Path, provider: FakeProvider, template: Path
) -> None:
    script_provider(provider)
    cassette = tmp_path / "run.cassette"
    ws = fresh_workspace(template, tmp_path / "ws")
    live = keel_in(
        ws,
        tmp_path / "recorded.db",
        OPENAI_BASE_URL=provider.base_url,
        OPENAI_API_KEY=API_KEY,
        KEEL_MODEL_STREAM="0",
    )

    recorded_id, result = live.start(GOAL, "--model", MODEL, "--record", str(cassette))
    expect(result, 0)
    recorded = live.events(recorded_id)

    assert provider.pending == 0 and len(provider.requests) == 4
    assert all(h.get("authorization") == f"Bearer {API_KEY}" for h in provider.headers)
    assert_cassette_holds_no_credentials(cassette)
    lines = cassette.read_text(encoding="utf-8").splitlines()
    assert json.loads(lines[0])["model"] == MODEL
    assert steps_in(cassette) == [0, 1, 2, 3]

    ws = fresh_workspace(template, tmp_path / "ws")
    replay_spec = f"replay:{cassette}"
    offline = keel_in(ws, tmp_path / "replayed.db")  # no key, no base URL: no provider
    replayed_id, result = offline.start(GOAL, "--model", replay_spec)
    expect(result, 0)
    replayed = offline.events(replayed_id)

    assert len(provider.requests) == 4  # the replay asked the provider nothing
    assert (ws / "out.txt").read_text(encoding="utf-8") == NOTES.upper()  # tools really ran
    kinds = [e.type for e in recorded]
    assert kinds.count(EventType.MODEL_RESPONDED) == 4
    assert kinds.count(EventType.TOOL_FINISHED) == 3
    assert_same_run(
        normalised(replayed, run_id=replayed_id, model_spec=replay_spec),
        normalised(recorded, run_id=recorded_id, model_spec=MODEL),
    )


@pytest.mark.parametrize(
    ("goal", "notes", "expected"),
    [
        (
            GOAL,
            "goodbye from the notes\n",
            "replay diverged at step 2: message 3 (tool) content differs: "
            "recorded '     1\\thello from the notes' now '     1\\tgoodbye from the notes'",
        ),
        (
            "copy notes.txt to out.txt in lower case",
            NOTES,
            "replay diverged at step 1: message 0 (system) content differs: recorded '…",
        ),
    ],
    ids=["a-file-the-model-reads", "the-goal"],
)
def test_a_replay_stops_at_the_first_request_that_differs(
    tmp_path: Path,
    provider: FakeProvider,
    template: Path,
    goal: str,
    notes: str,
    expected: str,
) -> None:
    script_provider(provider)
    cassette = tmp_path / "run.cassette"
    ws = fresh_workspace(template, tmp_path / "ws")
    live = keel_in(
        ws,
        tmp_path / "recorded.db",
        OPENAI_BASE_URL=provider.base_url,
        OPENAI_API_KEY=API_KEY,
        KEEL_MODEL_STREAM="0",
    )
    expect(live.start(GOAL, "--model", MODEL, "--record", str(cassette))[1], 0)

    ws = fresh_workspace(template, tmp_path / "ws", notes=notes)
    offline = keel_in(ws, tmp_path / "replayed.db")
    run_id, result = offline.start(goal, "--model", f"replay:{cassette}")

    expect(result, 1)
    state = offline.state(run_id)
    assert state.status is RunStatus.FAILED
    assert expected in (state.reason or "")
    assert not (ws / "out.txt").exists()  # stopped before the write it would have replayed
    if goal != GOAL:
        assert "lower case" in (state.reason or "")  # the excerpt shows what changed


def test_a_run_that_crashed_while_recording_resumes_into_the_same_cassette(
    tmp_path: Path, provider: FakeProvider, template: Path
) -> None:
    provider.reply(tool_calls=[("read_file", {"path": "notes.txt"})])
    lost = {"path": "out.txt", "content": "answer the crash lost\n"}
    provider.reply(tool_calls=[("write_file", lost)])
    kept = {"path": "out.txt", "content": NOTES.upper()}
    provider.reply(tool_calls=[("write_file", kept)])  # step 2 asked again after the crash
    provider.reply("done")
    cassette = tmp_path / "run.cassette"
    ws = fresh_workspace(template, tmp_path / "ws")
    store = tmp_path / "recorded.db"
    env = {"OPENAI_BASE_URL": provider.base_url, "OPENAI_API_KEY": API_KEY}
    live = keel_in(ws, store, **env, KEEL_MODEL_STREAM="0", KEEL_FAULT="mid_model_step:2")

    # Killed after step 2's answer was recorded, before the run stored it.
    crashed = live.keel("run", GOAL, "--model", MODEL, "--record", str(cassette))
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert steps_in(cassette) == [0, 1]

    with Harness(store=f"sqlite:///{store}") as harness:
        (run,) = harness.store.list_runs()
    again = keel_in(ws, store, **env, KEEL_MODEL_STREAM="0")
    expect(again.keel("resume", run.run_id, "--record", str(cassette)), 0)
    with Harness(store=f"sqlite:///{store}") as harness:
        assert harness.get(run.run_id).status is RunStatus.COMPLETED
        recorded = list(iter_all_events(harness.store, run.run_id))
    assert steps_in(cassette) == [0, 1, 1, 2]  # the last exchange for a step wins

    ws = fresh_workspace(template, tmp_path / "ws")
    offline = keel_in(ws, tmp_path / "replayed.db")
    replayed_id, result = offline.start(GOAL, "--model", f"replay:{cassette}")
    expect(result, 0)

    assert (ws / "out.txt").read_text(encoding="utf-8") == NOTES.upper()
    # The recorded run also holds its crash and resume: compare what the model said and
    # what the tools did (type and data of those events), in order.
    turns = (EventType.MODEL_RESPONDED, EventType.TOOL_FINISHED)
    again = normalised(
        [e for e in offline.events(replayed_id) if e.type in turns],
        run_id=replayed_id,
        model_spec=f"replay:{cassette}",
    )
    before = normalised(
        [e for e in recorded if e.type in turns], run_id=run.run_id, model_spec=MODEL
    )
    assert len(before) == 5  # 3 turns, 2 tool results: the lost answer is in neither
    assert [(e["type"], e["data"]) for e in again] == [(e["type"], e["data"]) for e in before]


def steps_in(cassette: Path) -> list[int]:
    return [json.loads(line)["step"] for line in cassette.read_text("utf-8").splitlines()[1:]]


# --- the Python API ------------------------------------------------------------------------


def test_the_python_api_records_and_replays_the_same_run(
    tmp_path: Path, provider: FakeProvider, template: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script_provider(provider)
    cassette = tmp_path / "run.cassette"
    ws = fresh_workspace(template, tmp_path / "ws")
    # In the process environment, as for `keel run`: the run's redactor knows the key.
    monkeypatch.setenv("OPENAI_BASE_URL", provider.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    monkeypatch.setenv("KEEL_MODEL_STREAM", "0")
    with Harness(store=f"sqlite:///{tmp_path}/recorded.db", model=MODEL) as harness:
        first = harness.run(GOAL, cwd=ws, record=cassette)
        recorded = list(iter_all_events(harness.store, first.id))
    assert first.status is RunStatus.COMPLETED, first.stop_reason
    assert_cassette_holds_no_credentials(cassette)

    monkeypatch.delenv("OPENAI_API_KEY")  # a replay needs no provider
    monkeypatch.delenv("OPENAI_BASE_URL")
    ws = fresh_workspace(template, tmp_path / "ws")
    replay = ReplayModel.from_file(cassette, spec="replay:run.cassette")
    with Harness(store=f"sqlite:///{tmp_path}/replayed.db", model=replay) as harness:
        second = harness.run(GOAL, cwd=ws)
        replayed = list(iter_all_events(harness.store, second.id))

    assert second.status is RunStatus.COMPLETED, second.stop_reason
    assert len(provider.requests) == 4
    assert_same_run(
        normalised(replayed, run_id=second.id, model_spec="replay:run.cassette"),
        normalised(recorded, run_id=first.id, model_spec=MODEL),
    )


def test_a_cassette_replays_in_another_checkout_under_a_wall_time_budget(
    tmp_path: Path, provider: FakeProvider, template: Path
) -> None:
    """The system prompt names the workspace's path and the wall time left: neither is
    something a regression test should depend on, and neither stops a replay."""
    script_provider(provider)
    cassette = tmp_path / "run.cassette"
    here = fresh_workspace(template, tmp_path / "first-checkout" / "ws")
    live = keel_in(
        here,
        tmp_path / "recorded.db",
        OPENAI_BASE_URL=provider.base_url,
        OPENAI_API_KEY=API_KEY,
    )
    _, result = live.start(GOAL, "--model", MODEL, "--timeout", "600", "--record", str(cassette))
    expect(result, 0)
    text = cassette.read_text(encoding="utf-8")
    assert str(here) not in text  # written as <workspace>: the cassette is portable
    assert "Workspace: <workspace>" in text

    there = fresh_workspace(template, tmp_path / "elsewhere" / "clone")
    offline = keel_in(there, tmp_path / "replayed.db")
    replayed_id, result = offline.start(GOAL, "--model", f"replay:{cassette}", "--timeout", "900")
    expect(result, 0)
    assert (there / "out.txt").read_text(encoding="utf-8") == NOTES.upper()
    assert offline.state(replayed_id).status is RunStatus.COMPLETED
    assert len(provider.requests) == 4
