"""Secrets never reach the event log: tool output, verifier output, commands' env, the
goal and verify commands a run is created with; and where the redactor finds its values."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path

import pytest

from keel.core.errors import ConfigError
from keel.core.events import EventType
from keel.core.status import RunStatus
from keel.models.openai_compat import OpenAICompatModel
from keel.runtime.harness import Harness
from keel.runtime.secrets import (
    dotenv_files,
    dotenv_text_secrets,
    load_redactor,
    read_dotenv,
    refresh_redactor,
)
from keel.testing import FakeProvider, ScriptedModel

SECRET = "sk-live-7f3a9c1e5b2d4f60"


def test_a_leaked_api_key_is_redacted_everywhere_it_would_be_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / ".env").write_text(f"OPENAI_API_KEY={SECRET}\n")
    (workspace / "config.txt").write_text(f"key: {SECRET}\n")
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
            verify=["cat config.txt", "echo verifier-env=$OPENAI_API_KEY"],
        )
        for _ in range(5):  # reading .env and unsandboxed commands may need approval
            if outcome.status is not RunStatus.WAITING:
                break
            harness.approve(outcome.id)
            outcome = harness.resume(outcome.id)
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
        for (snapshot,) in raw.execute("SELECT snapshot FROM run_snapshots"):
            assert SECRET not in snapshot
    finally:
        raw.close()
    assert SECRET not in sent  # the model never saw it either (the key travels as a header)


# --- where the values come from ----------------------------------------------------------


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_dotenv_files_are_found_at_the_top_and_below_within_bounds(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    wanted = [
        _write(ws / ".env", "A=1\n"),
        _write(ws / ".env.local", "A=1\n"),
        _write(ws / "config" / ".env.production", "A=1\n"),
        _write(ws / "a" / "b" / "c" / ".env", "A=1\n"),  # three levels below: still read
    ]
    _write(ws / "a" / "b" / "c" / "d" / ".env", "A=1\n")  # four levels: not
    _write(ws / "node_modules" / "pkg" / ".env", "A=1\n")  # dependencies: not
    _write(ws / ".git" / ".env", "A=1\n")
    _write(ws / "config" / "settings.env", "A=1\n")  # not a .env name
    _write(ws / "deploy" / ".envrc", "A=1\n")
    _write(tmp_path / "outside" / ".env", "A=1\n")
    (ws / "linked").symlink_to(tmp_path / "outside")  # a symlinked directory is not entered

    assert sorted(dotenv_files(ws)) == sorted(wanted)
    assert dotenv_files(ws, depth=0) == [ws / ".env", ws / ".env.local"]


def test_a_virtualenv_called_env_is_not_searched(tmp_path: Path) -> None:
    _write(tmp_path / ".env" / "lib" / "python3.11" / "site" / ".env", "X_TOKEN=abcdef123456\n")
    assert dotenv_files(tmp_path) == []


def test_a_fifo_planted_as_dotenv_is_skipped_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / ".env")
    started = time.monotonic()
    assert read_dotenv(tmp_path / ".env") == []
    assert load_redactor(tmp_path, cwd=tmp_path, environ={}).secrets == ()
    assert time.monotonic() - started < 5


def test_the_redactor_holds_values_of_workspace_and_working_directory_dotenv_files(
    tmp_path: Path,
) -> None:
    ws, cwd = tmp_path / "ws", tmp_path / "cwd"
    _write(ws / ".env", "SERVICE_TOKEN=ws-dotenv-Qz81mK42\nENVIRONMENT=production\n")
    _write(ws / "config" / ".env.production", "UPSTREAM_ID=a9F3kL20xQ7mZ15pW4\nHOST=localhost\n")
    _write(ws / ".env.example", "SERVICE_TOKEN=changeme\n")
    _write(cwd / ".env", "DEEPSEEK_API_KEY=sk-cwd-4417aa\n")
    _write(cwd / "sub" / ".env", "DEEP_TOKEN=not-read-below-cwd-1\n")  # cwd: top level only
    redactor = load_redactor(ws, cwd=cwd, environ={"OPENAI_API_KEY": "sk-env-99c1ab"})

    assert dict((v, n) for n, v in redactor.secrets) == {
        "sk-env-99c1ab": "OPENAI_API_KEY",
        "ws-dotenv-Qz81mK42": "SERVICE_TOKEN",
        "a9F3kL20xQ7mZ15pW4": "UPSTREAM_ID",
        "sk-cwd-4417aa": "DEEPSEEK_API_KEY",
    }
    text = "production localhost changeme ws-dotenv-Qz81mK42"
    assert redactor.scrub_text(text) == "production localhost changeme [redacted:SERVICE_TOKEN]"


def test_dotenv_values_are_held_as_written_and_as_interpolated(tmp_path: Path) -> None:
    _write(tmp_path / ".env", "BASE=abc\nAPI_TOKEN=${BASE}-tok-123456\n")
    redactor = load_redactor(tmp_path, cwd=tmp_path, environ={})
    assert {v for _, v in redactor.secrets} == {"${BASE}-tok-123456", "abc-tok-123456"}


def test_refresh_adds_values_written_during_the_run_and_forgets_none(tmp_path: Path) -> None:
    env_file = _write(tmp_path / ".env", "FIRST_TOKEN=first-123456\n")
    redactor = load_redactor(tmp_path, cwd=tmp_path, environ={})
    assert refresh_redactor(redactor, tmp_path, cwd=tmp_path, environ={}) is redactor

    env_file.write_text("SECOND_TOKEN=second-654321\n", encoding="utf-8")  # the model wrote it
    refreshed = refresh_redactor(redactor, tmp_path, cwd=tmp_path, environ={})
    assert refreshed.scrub_text("first-123456 second-654321") == (
        "[redacted:FIRST_TOKEN] [redacted:SECOND_TOKEN]"
    )


def test_dotenv_text_about_to_be_written_yields_its_secrets() -> None:
    text = 'SECRET_KEY="django-insecure-8f7a6b5c4d3e"\nDEBUG=true\nPORT=8000\n'
    assert set(dotenv_text_secrets(text)) == {("SECRET_KEY", "django-insecure-8f7a6b5c4d3e")}
    assert dotenv_text_secrets("API_KEY=changeme\n", template=True) == []


# --- what a run is created with ----------------------------------------------------------

DEPLOY_TOKEN = "dpl-tok-88c1e4a9f27b3d65"
DB_URL = "postgres://keel:S3cretPass-7c2e91@db.internal:5432/app"


@pytest.fixture
def creating(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Harness, Path]:
    monkeypatch.setenv("DEPLOY_TOKEN", DEPLOY_TOKEN)
    monkeypatch.chdir(tmp_path)
    workspace = tmp_path / "ws"
    _write(workspace / ".env", "SERVICE_TOKEN=ws-dotenv-Qz81mK42\n")
    harness = Harness(store=f"sqlite:///{tmp_path / 'keel.db'}", model=ScriptedModel([]))
    return harness, workspace


def test_the_goal_is_stored_redacted(creating: tuple[Harness, Path], tmp_path: Path) -> None:
    harness, workspace = creating
    goal = f"deploy with {DEPLOY_TOKEN}, check {DB_URL}, use ws-dotenv-Qz81mK42"
    state = harness.create(goal, cwd=workspace, verify=['test -n "$DEPLOY_TOKEN"'])
    expected = (
        "deploy with [redacted:DEPLOY_TOKEN], check "
        "postgres://keel:[redacted]@db.internal:5432/app, use [redacted:SERVICE_TOKEN]"
    )
    assert state.goal == expected
    (created,) = [e for e in harness.events(state.run_id) if e.type is EventType.RUN_CREATED]
    assert created.data["goal"] == expected
    assert created.data["options"]["verify"] == ['test -n "$DEPLOY_TOKEN"']
    harness.close()
    content = (tmp_path / "keel.db").read_bytes()
    for secret in (DEPLOY_TOKEN, "S3cretPass-7c2e91", "ws-dotenv-Qz81mK42"):
        assert secret.encode() not in content


@pytest.mark.parametrize(
    ("command", "named"),
    [
        (f"curl -fsS -H 'Authorization: Bearer {DEPLOY_TOKEN}' https://x/ok", "DEPLOY_TOKEN"),
        ("./check --token ws-dotenv-Qz81mK42", "SERVICE_TOKEN"),
        (f"psql {DB_URL} -c 'select 1'", "a credential inside a URL"),
    ],
    ids=["environment", "dotenv", "url"],
)
def test_a_verify_command_holding_a_secret_is_refused_and_nothing_is_stored(
    creating: tuple[Harness, Path], command: str, named: str
) -> None:
    harness, workspace = creating
    with pytest.raises(ConfigError) as refused:
        harness.create("check the deploy", cwd=workspace, verify=["pytest -q", command])
    message = str(refused.value)
    assert "--verify command 2" in message
    assert named in message
    assert "[sandbox] env" in message and ".keel/config.toml" in message
    for secret in (DEPLOY_TOKEN, "S3cretPass-7c2e91", "ws-dotenv-Qz81mK42"):
        assert secret not in message
    assert harness.store.list_runs() == []
    harness.close()


def test_a_provider_error_that_echoes_the_key_is_stored_redacted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OpenAI's 401 quotes the key it was sent; the run keeps the provider's whole
    error body in its stop reason, and that must not carry the key to the log."""
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    db = tmp_path / "keel.db"
    body = {
        "error": {
            "message": f"Incorrect API key provided: {SECRET}. You can find your API key at …",
            "type": "invalid_request_error",
            "code": "invalid_api_key",
        }
    }
    with FakeProvider() as provider:
        provider.raw(401, json.dumps(body))
        model = OpenAICompatModel(
            spec="openai:m", model="m", base_url=provider.base_url, api_key=SECRET
        )
        with Harness(store=f"sqlite:///{db}", model=model) as harness:
            outcome = harness.run("hello", cwd=workspace)
            logged = json.dumps([e.to_dict() for e in harness.events(outcome.id)])

    assert outcome.status is RunStatus.FAILED
    assert (outcome.stop_reason or "").startswith("authentication: ")
    assert "Incorrect API key provided" in logged
    assert SECRET not in logged
    raw = sqlite3.connect(db)
    try:
        for (data,) in raw.execute("SELECT data FROM events"):
            assert SECRET not in data
        for (snapshot,) in raw.execute("SELECT snapshot FROM run_snapshots"):
            assert SECRET not in snapshot
    finally:
        raw.close()
