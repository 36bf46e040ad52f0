"""Secrets never reach the event log: tool output, verifier output and commands' env."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from keel.core.status import RunStatus
from keel.models.openai_compat import OpenAICompatModel
from keel.runtime.harness import Harness
from keel.testing import FakeProvider

SECRET = "sk-live-7f3a9c1e5b2d4f60"


def test_a_leaked_api_key_is_redacted_everywhere_it_would_be_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / ".env").write_text(f"OPENAI_API_KEY={SECRET}\n")
    db = tmp_path / "keel.db"
    with FakeProvider() as provider:
        provider.reply(tool_calls=[("read_file", {"path": ".env"})])
        provider.reply(
            tool_calls=[("run_command", {"argv": ["sh", "-c", "echo key=$OPENAI_API_KEY"]})]
        )
        provider.reply(content=f"the key is {SECRET}")
        model = OpenAICompatModel(
            spec="openai:m", model="m", base_url=provider.base_url, api_key=SECRET
        )
        harness = Harness(store=f"sqlite:///{db}", model=model)
        outcome = harness.run(
            "look at the config",
            cwd=workspace,
            mode="auto",
            verify=["cat .env", "echo verifier-env=$OPENAI_API_KEY"],
        )
        sent = json.dumps(provider.requests)

    assert outcome.status is RunStatus.COMPLETED
    events = list(harness.events(outcome.id))
    logged = json.dumps([e.to_dict() for e in events])
    assert SECRET not in logged
    assert "[redacted:OPENAI_API_KEY]" in logged  # the read and the final answer
    finished = [e.data for e in events if e.data.get("tool") == "run_command"]
    assert "key=\n" in finished[-1]["output"]  # the command never saw the key
    for ref in outcome.evidence:
        _, content = harness.store.get_artifact(ref.removeprefix("artifact:"))
        assert SECRET.encode() not in content
    harness.close()
    raw = sqlite3.connect(db)
    try:
        for (data,) in raw.execute("SELECT data FROM events"):
            assert SECRET not in data
        for (content,) in raw.execute("SELECT content FROM artifacts"):
            assert SECRET.encode() not in content
        for (snapshot,) in raw.execute("SELECT snapshot FROM runs"):
            assert SECRET not in snapshot
    finally:
        raw.close()
    assert SECRET not in sent  # the model never saw it either (the key travels as a header)
