"""How a turn ended decides what the loop does next, end to end through the HTTP adapter.

The model is the real OpenAI-compatible adapter talking to ``FakeProvider`` on
127.0.0.1 (which checks every request against a strict server's rules); the store is a
real SQLite file. A turn cut at the length limit is never final and its calls never run;
a refused turn fails the run at once; a reason no profile knows is recorded and treated
as ``stop``; the provider's error kinds become the run's stop-reason words.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from keel.core.events import Event, EventType
from keel.core.state import RunState
from keel.core.status import RunStatus
from keel.models.resolve import resolve_model
from keel.runtime.harness import Harness, RunOutcome
from keel.testing.provider import FakeProvider
from keel.testing.recorded import load_fixture

CUT_ARGUMENTS = '{"path": "big.py", "content": "def f(x):\\n    return x +'


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    with FakeProvider(strict=True) as server:
        yield server


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("hello world\n", encoding="utf-8")
    return ws


MakeHarness = Callable[..., Harness]


@pytest.fixture
def make_harness(
    tmp_path: Path, provider: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> Iterator[MakeHarness]:
    """A Harness on a real SQLite file whose model is ``SPEC`` resolved as the CLI does,
    pointed at the FakeProvider (retries a millisecond apart: none is expected here)."""
    made: list[Harness] = []
    monkeypatch.chdir(tmp_path)  # no .keel/config.toml: built-in prices only

    def make(spec: str = "openai:gpt-4o-mini", **options: Any) -> Harness:
        provider_name = spec.partition(":")[0].upper()
        environ = {
            f"{provider_name}_API_KEY": "sk-test",
            f"{provider_name}_BASE_URL": provider.base_url,
            "KEEL_MODEL_MAX_ATTEMPTS": "3",
            "KEEL_MODEL_MAX_WAIT": "0.01",
        }
        model = resolve_model(spec, cwd=tmp_path, environ=environ)
        harness = Harness(store=f"sqlite:///{tmp_path}/keel.db", model=model, **options)
        made.append(harness)
        return harness

    yield make
    for harness in made:
        harness.close()


def events_of(harness: Harness, outcome: RunOutcome | str) -> list[Event]:
    run_id = outcome if isinstance(outcome, str) else outcome.id
    return list(harness.events(run_id))


def of_type(events: list[Event], kind: EventType) -> list[Event]:
    return [e for e in events if e.type is kind]


def assistant_messages(request: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in request["messages"] if m["role"] == "assistant"]


# --- length --------------------------------------------------------------------------------


def test_a_reply_cut_at_the_length_limit_is_recorded_the_model_told_and_the_run_goes_on(
    make_harness: MakeHarness, provider: FakeProvider, workspace: Path
) -> None:
    provider.reply("The answer starts here and then", finish_reason="length")
    provider.reply("Short answer: done.")
    harness = make_harness()

    outcome = harness.run("explain", cwd=workspace)

    assert (outcome.status, outcome.stop_reason) == (
        RunStatus.COMPLETED,
        "completed without verifiers",
    )
    cut, final = of_type(events_of(harness, outcome), EventType.MODEL_RESPONDED)
    assert cut.data["finish_reason"] == "length"
    assert final.data["finish_reason"] == "stop"
    # the cut reply was not taken as the final answer: the model saw it marked, then a note
    [shown] = assistant_messages(provider.requests[1])
    assert shown["content"].startswith("The answer starts here and then")
    assert "cut at the output length limit" in shown["content"]
    note = provider.requests[1]["messages"][-1]
    assert note["role"] == "user" and "cut off at the output length limit" in note["content"]
    assert outcome.state.result is not None
    assert outcome.state.result["summary"] == "Short answer: done."
    assert provider.violations == []


def test_a_cut_reply_with_incomplete_tool_arguments_runs_none_of_its_calls(
    make_harness: MakeHarness, provider: FakeProvider, workspace: Path
) -> None:
    """Hand-written reply: no public cassette holds a `length` answer whose tool
    arguments were cut mid-JSON (tests/fixtures/providers/README.md lists the search)."""
    provider.reply(
        tool_calls=[("read_file", {"path": "a.txt"}), ("write_file", CUT_ARGUMENTS)],
        finish_reason="length",
    )
    provider.reply("I will write it in smaller parts later.")
    harness = make_harness()

    outcome = harness.run("write big.py", cwd=workspace)

    assert outcome.status is RunStatus.COMPLETED
    events = events_of(harness, outcome)
    for kind in (EventType.TOOL_STARTED, EventType.TOOL_FINISHED, EventType.TOOL_FAILED):
        assert of_type(events, kind) == [], kind
    assert not (workspace / "big.py").exists()
    [cut, _] = of_type(events, EventType.MODEL_RESPONDED)
    assert [c["name"] for c in cut.data["tool_calls"]] == ["read_file", "write_file"]  # on record
    # what was sent next is valid for a strict server: no unanswered call, no tool result
    second = provider.requests[1]
    assert [m["role"] for m in second["messages"]][-2:] == ["assistant", "user"]
    [shown] = assistant_messages(second)
    assert not shown.get("tool_calls")
    assert "2 unfinished tool call(s) were not run" in shown["content"]
    assert all(m["role"] != "tool" for m in second["messages"])
    assert "none of them ran" in second["messages"][-1]["content"]
    assert provider.violations == []
    assert outcome.state.usage.tool_calls == 0


def test_a_third_cut_reply_running_fails_the_run_model_output_truncated(
    make_harness: MakeHarness, provider: FakeProvider, workspace: Path
) -> None:
    for _ in range(3):
        provider.reply(tool_calls=[("write_file", CUT_ARGUMENTS)], finish_reason="length")
    provider.reply("never asked")
    harness = make_harness()

    outcome = harness.run("write big.py", cwd=workspace)

    assert (outcome.status, outcome.stop_reason) == (RunStatus.FAILED, "model_output_truncated")
    assert outcome.state.result is not None
    assert outcome.state.result["truncated_turns"] == 3
    assert len(provider.requests) == 3 and provider.pending == 1
    notes = [
        e.data["text"]
        for e in of_type(events_of(harness, outcome), EventType.NOTE_ADDED)
        if "length limit" in e.data["text"]
    ]
    assert len(notes) == 2
    assert not (workspace / "big.py").exists()


def test_a_resumed_run_counts_the_cut_replies_of_the_process_before(
    make_harness: MakeHarness, provider: FakeProvider, workspace: Path
) -> None:
    provider.reply("part one", finish_reason="length")
    provider.reply("part two", finish_reason="length")
    responded: list[Event] = []

    def count(event: Event, state: RunState) -> None:
        if event.type is EventType.MODEL_RESPONDED:
            responded.append(event)

    first = make_harness(on_event=count)
    state = first.create("explain at length", cwd=workspace)
    stopped = first.execute(state.run_id, should_stop=lambda: len(responded) >= 2)
    assert stopped.status is RunStatus.RUNNING and stopped.state.truncated_turns == 2
    first.close()

    provider.reply("part three", finish_reason="length")
    second = make_harness()  # another process: the count comes from the log alone
    outcome = second.resume(state.run_id)

    assert (outcome.status, outcome.stop_reason) == (RunStatus.FAILED, "model_output_truncated")
    assert outcome.state.result is not None and outcome.state.result["truncated_turns"] == 3
    assert len(provider.requests) == 3


# --- refusals and unknown reasons ----------------------------------------------------------


def test_a_content_filter_stop_fails_the_run_and_the_model_is_not_asked_again(
    make_harness: MakeHarness, provider: FakeProvider, workspace: Path
) -> None:
    """Hand-written reply: no recorded 200 with finish_reason content_filter was found;
    Azure's recorded 400 content_filter runs in the test below."""
    provider.reply("I cannot", finish_reason="content_filter")
    provider.reply("never asked")
    harness = make_harness()

    outcome = harness.run("something filtered", cwd=workspace)

    assert (outcome.status, outcome.stop_reason) == (
        RunStatus.FAILED,
        "provider_refused:content_filter",
    )
    assert len(provider.requests) == 1 and provider.pending == 1
    [responded] = of_type(events_of(harness, outcome), EventType.MODEL_RESPONDED)
    assert responded.data["finish_reason"] == "content_filter"


def test_an_openai_refusal_fails_the_run_carrying_the_refusal_text(
    make_harness: MakeHarness, provider: FakeProvider, workspace: Path
) -> None:
    provider.reply(refusal="I'm sorry, I can't assist with that.")
    provider.reply("never asked")
    harness = make_harness()

    outcome = harness.run("something refused", cwd=workspace)

    assert (outcome.status, outcome.stop_reason) == (RunStatus.FAILED, "provider_refused:refusal")
    assert outcome.state.result is not None
    assert outcome.state.result["refusal"] == "I'm sorry, I can't assist with that."
    assert len(provider.requests) == 1
    [responded] = of_type(events_of(harness, outcome), EventType.MODEL_RESPONDED)
    assert responded.data["refusal"] == "I'm sorry, I can't assist with that."


def test_a_finish_reason_no_profile_knows_is_recorded_and_treated_as_stop(
    make_harness: MakeHarness, provider: FakeProvider, workspace: Path
) -> None:
    provider.reply("All done.", finish_reason="eos_token_reached")
    harness = make_harness()

    outcome = harness.run("say done", cwd=workspace)

    assert outcome.status is RunStatus.COMPLETED
    [responded] = of_type(events_of(harness, outcome), EventType.MODEL_RESPONDED)
    assert responded.data["finish_reason"] == "stop"
    assert responded.data["provider_finish_reason"] == "eos_token_reached"


# --- the provider's error kinds as stop reasons ----------------------------------------------


def test_out_of_credit_is_not_retried_and_the_run_says_to_add_credit(
    make_harness: MakeHarness, provider: FakeProvider, workspace: Path
) -> None:
    provider.fail(402, "Insufficient Balance")
    provider.reply("never asked")
    harness = make_harness("deepseek:deepseek-chat")

    outcome = harness.run("say done", cwd=workspace)

    assert outcome.status is RunStatus.FAILED
    reason = outcome.stop_reason or ""
    assert reason.startswith("out_of_credit: ") and "Insufficient Balance" in reason
    assert len(provider.requests) == 1
    assert of_type(events_of(harness, outcome), EventType.RETRY_SCHEDULED) == []


def test_openais_insufficient_quota_429_is_out_of_credit_not_a_rate_limit(
    make_harness: MakeHarness, provider: FakeProvider, workspace: Path
) -> None:
    body = {
        "error": {
            "message": "You exceeded your current quota, please check your plan and billing.",
            "type": "insufficient_quota",
            "code": "insufficient_quota",
        }
    }
    provider.raw(429, json.dumps(body)).reply("never asked")
    harness = make_harness()

    outcome = harness.run("say done", cwd=workspace)

    assert (outcome.stop_reason or "").startswith("out_of_credit: ")
    assert len(provider.requests) == 1


def test_a_conversation_longer_than_the_context_fails_context_overflow(
    make_harness: MakeHarness, provider: FakeProvider, workspace: Path
) -> None:
    provider.fail(
        400,
        "This model's maximum context length is 65536 tokens. However, you requested "
        "81234 tokens (81234 in the messages, 0 in the completion). Please reduce the "
        "length of the messages or completion.",
    )
    harness = make_harness("deepseek:deepseek-chat")

    outcome = harness.run("say done", cwd=workspace)

    reason = outcome.stop_reason or ""
    assert outcome.status is RunStatus.FAILED
    assert reason.startswith("context_overflow: ") and "maximum context length" in reason
    assert len(provider.requests) == 1


def test_a_plain_provider_error_keeps_the_model_error_wording(
    make_harness: MakeHarness, provider: FakeProvider, workspace: Path
) -> None:
    provider.fail(422, "Unprocessable: tools[0].function.name is invalid")
    harness = make_harness()

    outcome = harness.run("say done", cwd=workspace)

    assert (outcome.stop_reason or "").startswith("model_error: ")
    assert "tools[0].function.name is invalid" in (outcome.stop_reason or "")


@pytest.mark.parametrize(
    ("fixture", "spec", "reason", "says"),
    [
        ("deepseek_error_402", "deepseek:deepseek-chat", "out_of_credit: ", "add credit"),
        ("openai_error_429_insufficient_quota", "openai:gpt-4o-mini", "out_of_credit: ", "quota"),
        (
            "azure_error_400_content_filter",
            "openai:gpt-4o-mini",
            "provider_refused:content_filter: ",
            "ResponsibleAIPolicyViolation",
        ),
        (
            "deepseek_error_400_context_length",
            "deepseek:deepseek-chat",
            "context_overflow: ",
            "maximum context length",
        ),
        ("openai_error_401_invalid_api_key", "openai:gpt-4o-mini", "authentication: ", "API key"),
    ],
)
def test_a_recorded_provider_refusal_ends_the_run_with_its_own_reason_and_no_retry(
    make_harness: MakeHarness,
    provider: FakeProvider,
    workspace: Path,
    fixture: str,
    spec: str,
    reason: str,
    says: str,
) -> None:
    """Bodies the providers really sent (tests/fixtures/providers): each stops the run at
    the first answer, with a stop reason a person can act on, and nothing is retried."""
    provider.raw_fixture(load_fixture(fixture))
    provider.reply("never asked")
    harness = make_harness(spec)

    outcome = harness.run("say done", cwd=workspace)

    assert outcome.status is RunStatus.FAILED
    stop_reason = outcome.stop_reason or ""
    assert stop_reason.startswith(reason), stop_reason
    assert says.lower() in stop_reason.lower()
    assert len(provider.requests) == 1
    assert of_type(events_of(harness, outcome), EventType.RETRY_SCHEDULED) == []
