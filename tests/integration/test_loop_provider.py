"""The agent loop end to end through the real OpenAI-compatible adapter.

The model is ``OpenAICompatModel`` talking HTTP to ``FakeProvider`` on 127.0.0.1; the
store is a real SQLite file; tools really change files in a temporary workspace.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from keel.core.events import Event, EventType
from keel.core.status import RunStatus
from keel.models.openai_compat import OpenAICompatModel
from keel.models.resolve import resolve_model
from keel.runtime.harness import Harness, RunOutcome
from keel.testing.provider import FakeProvider


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    with FakeProvider() as server:
        yield server


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("hello world\n", encoding="utf-8")
    return ws


MakeHarness = Callable[..., Harness]


@pytest.fixture
def make_harness(tmp_path: Path, provider: FakeProvider) -> Iterator[MakeHarness]:
    """A Harness on a real SQLite file whose model is the HTTP adapter (millisecond backoff)."""
    made: list[Harness] = []

    def make(**model_settings: Any) -> Harness:
        settings: dict[str, Any] = {
            "spec": "openai:some-model",
            "model": "some-model",
            "base_url": provider.base_url,
            "api_key": "sk-test",
            "max_attempts": 3,
            "max_wait": 2.0,
            "initial_wait": 0.001,
            "timeout": 2.0,
        }
        settings.update(model_settings)
        harness = Harness(
            store=f"sqlite:///{tmp_path}/keel.db", model=OpenAICompatModel(**settings)
        )
        made.append(harness)
        return harness

    yield make
    for harness in made:
        harness.close()


def events_of(harness: Harness, outcome: RunOutcome) -> list[Event]:
    events = list(harness.events(outcome.id))
    assert [e.seq for e in events] == list(range(1, len(events) + 1)), "events have gaps"
    return events


def of_type(events: list[Event], kind: EventType) -> list[Event]:
    return [e for e in events if e.type is kind]


def tool_messages(request: dict[str, Any]) -> dict[str, str]:
    """tool_call_id -> content of every tool result in one request the provider got."""
    return {m["tool_call_id"]: m["content"] for m in request["messages"] if m["role"] == "tool"}


# --- a whole run ------------------------------------------------------------------------


def test_a_multi_step_run_edits_files_feeds_results_back_verifies_and_completes(
    make_harness: MakeHarness, provider: FakeProvider, workspace: Path
) -> None:
    provider.reply(
        tool_calls=[("read_file", {"path": "a.txt"})],
        reasoning_content="SECRET-CHAIN-OF-THOUGHT",
        usage=(100, 20),
    )
    provider.reply(
        tool_calls=[
            ("edit_file", {"path": "a.txt", "old_text": "hello", "new_text": "bye"}),
            ("write_file", {"path": "notes/b.txt", "content": "new file\n"}),
        ],
        usage=(150, 30),
    )
    provider.reply(content="Replaced hello with bye and wrote notes.", usage=(200, 10))
    harness = make_harness()

    outcome = harness.run(
        "replace hello with bye",
        cwd=workspace,
        verify=["grep -q bye a.txt && test -f notes/b.txt"],
    )

    assert (outcome.status, outcome.stop_reason) == (RunStatus.COMPLETED, "verified")
    assert (workspace / "a.txt").read_text() == "bye world\n"
    assert (workspace / "notes" / "b.txt").read_text() == "new file\n"

    # what reached the provider: three turns, each tool result fed back by its call id
    assert len(provider.requests) == 3
    assert "hello world" in tool_messages(provider.requests[1])["call_fake_0_0"]
    second = tool_messages(provider.requests[2])
    assert set(second) == {"call_fake_0_0", "call_fake_1_0", "call_fake_1_1"}
    assert all(not text.startswith("error") for text in second.values())
    sent = json.dumps(provider.requests)
    assert "reasoning_content" not in sent and "SECRET-CHAIN-OF-THOUGHT" not in sent
    assert provider.headers[0]["authorization"] == "Bearer sk-test"

    # the record: gapless events, usage, and evidence bound to the final revision
    events = events_of(harness, outcome)
    assert events[-1].type is EventType.STATUS_CHANGED
    assert of_type(events, EventType.MODEL_RESPONDED)[0].data["reasoning"] == (
        "SECRET-CHAIN-OF-THOUGHT"
    )
    state = outcome.state
    assert (state.usage.steps, state.usage.tool_calls, state.usage.tokens) == (3, 3, 510)
    assert state.mutation_revision == 2
    assert set(state.changed_files) == {"a.txt", "notes/b.txt"}
    [record] = state.validations
    assert record.passed and record.mutation_revision == 2
    assert record.file_hashes == state.changed_files
    assert outcome.evidence == [f"artifact:{record.artifact}"]
    assert record.artifact is not None
    _, log = harness.store.get_artifact(record.artifact)
    assert b"$ grep -q bye a.txt" in log and b"[exit code 0]" in log

    # a second process sees exactly the same run
    reloaded = Harness(store=harness.store.url).get(outcome.id)
    assert reloaded.to_dict() == state.to_dict()


# --- provider failures ------------------------------------------------------------------


def test_a_429_is_retried_with_a_recorded_retry_and_the_run_completes(
    make_harness: MakeHarness, provider: FakeProvider, workspace: Path
) -> None:
    provider.fail(429, "Rate limit reached for requests").reply(content="done")
    harness = make_harness()

    outcome = harness.run("say done", cwd=workspace)

    assert outcome.status is RunStatus.COMPLETED
    [retry] = of_type(events_of(harness, outcome), EventType.RETRY_SCHEDULED)
    assert retry.data["status_code"] == 429
    assert retry.data["attempt"] == 1
    assert "Rate limit reached" in retry.data["error"]
    assert len(provider.requests) == 2


def test_a_provider_failing_with_500_until_give_up_fails_the_run_naming_the_error(
    make_harness: MakeHarness, provider: FakeProvider, workspace: Path
) -> None:
    for _ in range(3):
        provider.fail(500, "The server is overloaded")
    harness = make_harness(max_attempts=3)

    outcome = harness.run("say done", cwd=workspace)

    assert outcome.status is RunStatus.FAILED
    reason = outcome.stop_reason or ""
    assert reason.startswith("model_error:")
    assert "gave up after 3 attempt(s)" in reason
    assert "HTTP 500: The server is overloaded" in reason
    assert len(of_type(events_of(harness, outcome), EventType.RETRY_SCHEDULED)) == 2
    assert len(provider.requests) == 3


def test_a_401_fails_the_run_at_once_with_the_providers_message(
    make_harness: MakeHarness, provider: FakeProvider, workspace: Path
) -> None:
    provider.fail(401, "Incorrect API key provided: sk-tes**")
    provider.reply(content="never served")
    harness = make_harness()

    outcome = harness.run("say done", cwd=workspace)

    assert outcome.status is RunStatus.FAILED
    assert "HTTP 401: Incorrect API key provided" in (outcome.stop_reason or "")
    assert "OPENAI_API_KEY" in (outcome.stop_reason or "")
    assert len(provider.requests) == 1
    assert of_type(events_of(harness, outcome), EventType.RETRY_SCHEDULED) == []


def test_a_hung_provider_times_out_is_retried_and_the_run_completes(
    make_harness: MakeHarness, provider: FakeProvider, workspace: Path
) -> None:
    provider.hang(5.0).reply(content="done")
    harness = make_harness(timeout=0.3)

    outcome = harness.run("say done", cwd=workspace)

    assert outcome.status is RunStatus.COMPLETED
    [retry] = of_type(events_of(harness, outcome), EventType.RETRY_SCHEDULED)
    assert "no answer within 0.3s" in retry.data["error"]
    assert retry.data["status_code"] is None


def test_a_dropped_connection_is_retried(
    make_harness: MakeHarness, provider: FakeProvider, workspace: Path
) -> None:
    provider.disconnect().reply(content="done")
    harness = make_harness()

    outcome = harness.run("say done", cwd=workspace)

    assert outcome.status is RunStatus.COMPLETED
    [retry] = of_type(events_of(harness, outcome), EventType.RETRY_SCHEDULED)
    assert "connection failed" in retry.data["error"]


# --- bad tool calls ----------------------------------------------------------------------


def test_malformed_and_mistyped_arguments_reach_the_model_as_errors_and_the_run_goes_on(
    make_harness: MakeHarness, provider: FakeProvider, workspace: Path
) -> None:
    provider.reply(tool_calls=[("write_file", '{"path": "a.txt", "content": "x"')])
    provider.reply(tool_calls=[("write_file", {"path": "a.txt", "content": ["x"]})])
    provider.reply(tool_calls=[("write_file", {"path": "a.txt", "content": "fixed\n"})])
    provider.reply(content="done")
    harness = make_harness()

    outcome = harness.run("write a.txt", cwd=workspace)

    assert outcome.status is RunStatus.COMPLETED
    malformed = tool_messages(provider.requests[1])["call_fake_0_0"]
    assert malformed.startswith("error (invalid_arguments):")
    assert "write_file" in malformed and "JSON" in malformed
    mistyped = tool_messages(provider.requests[2])["call_fake_1_0"]
    assert mistyped.startswith("error (invalid_arguments):")
    assert "content" in mistyped
    assert (workspace / "a.txt").read_text() == "fixed\n"
    state = outcome.state
    assert state.failed_attempts == 2
    assert state.usage.tool_calls == 3
    failed = of_type(events_of(harness, outcome), EventType.TOOL_FAILED)
    assert failed[0].data["arguments"] == '{"path": "a.txt", "content": "x"'


def test_an_unknown_tool_is_reported_to_the_model_with_the_available_tools(
    make_harness: MakeHarness, provider: FakeProvider, workspace: Path
) -> None:
    provider.reply(tool_calls=[("delete_repo", {})]).reply(content="done")
    harness = make_harness()

    outcome = harness.run("go", cwd=workspace)

    assert outcome.status is RunStatus.COMPLETED
    message = tool_messages(provider.requests[1])["call_fake_0_0"]
    assert "unknown tool 'delete_repo'" in message and "read_file" in message
    assert outcome.state.failed_attempts == 1


def test_the_openai_spec_is_configured_from_the_environment_including_retry_settings(
    tmp_path: Path, provider: FakeProvider, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", provider.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    monkeypatch.setenv("KEEL_MODEL_MAX_WAIT", "0.05")
    monkeypatch.setenv("KEEL_MODEL_TIMEOUT", "0.3")
    provider.hang(5.0).reply(content="done")

    with Harness(store=f"sqlite:///{tmp_path}/keel.db", model="openai:some-model") as harness:
        outcome = harness.run("say done", cwd=workspace)
        events = events_of(harness, outcome)

    assert outcome.status is RunStatus.COMPLETED
    assert outcome.state.options.model == "openai:some-model"
    [retry] = of_type(events, EventType.RETRY_SCHEDULED)
    assert "no answer within 0.3s" in retry.data["error"]
    assert retry.data["wait_seconds"] <= 0.05
    assert provider.requests[-1]["model"] == "some-model"
    assert provider.headers[-1]["authorization"] == "Bearer sk-from-env"


# --- reasoning sent back -----------------------------------------------------------------


def test_deepseek_thinking_mode_gets_the_reasoning_of_earlier_tool_call_turns_back(
    tmp_path: Path, workspace: Path
) -> None:
    """DeepSeek answers 400 when an assistant turn that made tool calls comes back without
    its reasoning_content (its thinking-mode guide); FakeProvider enforces that rule."""
    with FakeProvider(rules="deepseek", strict=True) as provider:
        provider.reply(
            tool_calls=[("read_file", {"path": "a.txt"})], reasoning_content="R1: read a.txt first"
        )
        provider.reply(
            tool_calls=[("edit_file", {"path": "a.txt", "old_text": "hello", "new_text": "bye"})],
            reasoning_content="R2: now replace the word",
        )
        provider.reply(content="Replaced hello with bye.", reasoning_content="R3: done")
        environ = {"DEEPSEEK_API_KEY": "sk-test", "DEEPSEEK_BASE_URL": provider.base_url}
        model = resolve_model("deepseek:deepseek-reasoner", cwd=tmp_path, environ=environ)
        with Harness(store=f"sqlite:///{tmp_path}/keel.db", model=model) as harness:
            outcome = harness.run("replace hello with bye", cwd=workspace)

        assert outcome.status is RunStatus.COMPLETED, outcome.stop_reason
        assert (workspace / "a.txt").read_text() == "bye world\n"
        assert len(provider.requests) == 3
        assert provider.violations == []

        def reasoning_sent(request: dict[str, Any]) -> list[str | None]:
            return [
                m.get("reasoning_content") for m in request["messages"] if m["role"] == "assistant"
            ]

        assert reasoning_sent(provider.requests[0]) == []
        assert reasoning_sent(provider.requests[1]) == ["R1: read a.txt first"]
        assert reasoning_sent(provider.requests[2]) == [
            "R1: read a.txt first",
            "R2: now replace the word",
        ]
