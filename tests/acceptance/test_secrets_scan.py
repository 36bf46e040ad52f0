"""The planted-secrets scan (issue 10): no planted secret is on record, byte for byte.

Known, unique secrets are planted in every place a run can carry them: the process
environment (an API key, a ``*_TOKEN``, a ``DATABASE_URL`` with a password), the
workspace's ``.env`` (a value by name, one by shape, a non-ASCII one), the goal, the
model's own words and tool arguments, a file the model reads, a command's output, an
output long enough to go to an artifact, a verifier's log, a new file in the diff, and
an untracked ``.env.local`` that must stay out of the diff. Then the SQLite database
(main file, ``-wal``, ``-shm``) and every artifact (read through the store API) are
searched for each secret as UTF-8 and as JSON escapes. A ``--verify`` command holding a
secret is refused (exit 2, ``ConfigError``) with nothing stored.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from keel.core.errors import ConfigError
from keel.core.events import Event, EventType
from keel.core.status import RunStatus
from keel.runtime.harness import Harness, RunOutcome
from keel.store.base import Store, iter_all_events
from keel.store.url import open_store
from keel.testing import ScriptedModel
from keel.tools.base import Effect, ToolContext, ToolResult, tool
from keel.tools.builtin import default_registry

ENV_API_KEY = "sk-test-ENVKEY-4f9a1c7e2b8d5063"  # OPENAI_API_KEY in the environment
DEPLOY_TOKEN = "dpl-tok-88c1e4a9f27b3d65"  # DEPLOY_TOKEN in the environment
DB_PASSWORD = "S3cretPass-7c2e91"
DB_URL = f"postgres://keel:{DB_PASSWORD}@db.internal:5432/app"  # DATABASE_URL
DOTENV_TOKEN = "ws-dotenv-Qz81mK42pL07xV93"  # SERVICE_TOKEN in the workspace's .env
DOTENV_SHAPED = "a9F3kL20xQ7mZ15pW4uT6"  # UPSTREAM_ID in .env: a credential by its shape
DOTENV_UNICODE = "Pässwört-unicode-61be"  # LEGACY_PASSWORD in .env (JSON escapes it)
LOCAL_TOKEN = "local-only-5e7d2c9a1b3f"  # LOCAL_API_TOKEN in the untracked .env.local
LOCAL_MARKER = "plain words from the local override"  # no rule redacts it: only left out

SECRETS = {
    "OPENAI_API_KEY": ENV_API_KEY,
    "DEPLOY_TOKEN": DEPLOY_TOKEN,
    "DATABASE_URL password": DB_PASSWORD,
    "DATABASE_URL": DB_URL,
    "SERVICE_TOKEN": DOTENV_TOKEN,
    "UPSTREAM_ID": DOTENV_SHAPED,
    "LEGACY_PASSWORD": DOTENV_UNICODE,
    "LOCAL_API_TOKEN": LOCAL_TOKEN,
    ".env.local content": LOCAL_MARKER,
}
ENVIRONMENT = {"OPENAI_API_KEY": ENV_API_KEY, "DEPLOY_TOKEN": DEPLOY_TOKEN, "DATABASE_URL": DB_URL}
SETTINGS = (
    f"DATABASE_URL={DB_URL}\n"
    f"db_password: {DB_PASSWORD}\n"
    f"openai_key: {ENV_API_KEY}\n"
    f"service_token: {DOTENV_TOKEN}\n"
    f"upstream: {DOTENV_SHAPED}\n"
    f"legacy: {DOTENV_UNICODE}\n"
)
GOAL = f"Deploy with token {DEPLOY_TOKEN} to {DB_URL}; the service token is {DOTENV_TOKEN}"
LONG_OUTPUT = 70_000  # characters: more than an event keeps inline (64,000)
MAX_DECISIONS = 20  # approvals a run may ask for before the test gives up


# --- planting ----------------------------------------------------------------------------


def git(workspace: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=Keel Test", "-c", "user.email=test@example.com", *args],
        cwd=workspace,
        check=True,
        capture_output=True,
        timeout=60,
    )


def planted_workspace(root: Path) -> Path:
    """A git work tree: settings and a long log committed; .env and .env.local untracked."""
    ws = root / "ws"
    ws.mkdir()
    (ws / "settings.txt").write_text(SETTINGS, encoding="utf-8")
    (ws / "build.log").write_text("x" * LONG_OUTPUT + "\n" + SETTINGS, encoding="utf-8")
    (ws / "README.md").write_text("a service to deploy\n", encoding="utf-8")
    git(ws, "init", "-q")
    git(ws, "add", "settings.txt", "build.log", "README.md")
    git(ws, "commit", "-q", "-m", "start")
    (ws / ".env").write_text(
        f"SERVICE_TOKEN={DOTENV_TOKEN}\n"
        f"UPSTREAM_ID={DOTENV_SHAPED}\n"
        f"LEGACY_PASSWORD={DOTENV_UNICODE}\n"
        "ENVIRONMENT=production\n",
        encoding="utf-8",
    )
    (ws / ".env.local").write_text(
        f"LOCAL_API_TOKEN={LOCAL_TOKEN}\nGREETING={LOCAL_MARKER}\n", encoding="utf-8"
    )
    return ws


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No git or dotfile configuration of the caller's; the working directory is ``tmp_path``."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.chdir(tmp_path)
    return tmp_path


# run_command keeps at most 30,000 characters of output (head and tail), below the 64,000
# an event keeps inline; a tool whose output is not capped takes the artifact path.
@tool(effect=Effect.READ)
def show_build_log(ctx: ToolContext, path: str) -> ToolResult:
    """Show a whole log file however long: an output that goes to an artifact."""
    return ToolResult(output=(ctx.workspace / path).read_text(encoding="utf-8"))


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def turn(*calls: dict[str, Any], content: str | None = None) -> dict[str, Any]:
    played: dict[str, Any] = {"tool_calls": list(calls)}
    if content is not None:
        played["content"] = content
    return played


# --- scanning ----------------------------------------------------------------------------


def forms(secret: str) -> set[bytes]:
    """The bytes a secret is stored as: UTF-8, and JSON-escaped (ASCII or not)."""
    return {
        secret.encode("utf-8"),
        json.dumps(secret)[1:-1].encode("utf-8"),
        json.dumps(secret, ensure_ascii=False)[1:-1].encode("utf-8"),
    }


def database_files(db: Path) -> dict[str, bytes]:
    files = [db, *(db.with_name(db.name + suffix) for suffix in ("-wal", "-shm", "-journal"))]
    return {path.name: path.read_bytes() for path in files if path.exists()}


def artifacts(store: Store, db: Path) -> dict[str, bytes]:
    """Every artifact in the store, read through the store API (ids listed from the file)."""
    raw = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        ids = [row[0] for row in raw.execute("SELECT id FROM artifacts")]
    finally:
        raw.close()
    found: dict[str, bytes] = {}
    for art_id in ids:
        meta, content = store.get_artifact(art_id)
        found[f"artifact {meta.name} ({art_id})"] = content
    return found


def findings(blobs: dict[str, bytes]) -> list[str]:
    """Where each planted secret sits on record (empty when none does)."""
    return [
        f"{where} holds {name} as {form!r}"
        for where, content in blobs.items()
        for name, secret in SECRETS.items()
        for form in sorted(forms(secret))
        if form in content
    ]


def assert_none_on_record(blobs: dict[str, bytes]) -> None:
    leaks = findings(blobs)
    assert not leaks, "planted secrets on record:\n" + "\n".join(leaks)


# --- the run through the Python API ------------------------------------------------------


def drive(harness: Harness, outcome: RunOutcome) -> RunOutcome:
    """Approve whatever the run asks (reading .env, unsandboxed commands) until it ends."""
    for _ in range(MAX_DECISIONS):
        if outcome.status is not RunStatus.WAITING:
            return outcome
        pending = outcome.state.pending
        assert pending is not None and pending.kind != "question", pending
        harness.approve(outcome.id)
        outcome = harness.resume(outcome.id)
    raise AssertionError(f"run {outcome.id} still waits after {MAX_DECISIONS} approvals")


def tool_outputs(events: list[Event], tool_name: str) -> list[dict[str, Any]]:
    return [
        e.data for e in events if e.type is EventType.TOOL_FINISHED and e.data["tool"] == tool_name
    ]


def test_a_run_carrying_planted_secrets_everywhere_leaves_none_on_record(
    isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in ENVIRONMENT.items():
        monkeypatch.setenv(name, value)
    ws = planted_workspace(isolated)
    db = isolated / "keel.db"
    long_command = f"head -c {LONG_OUTPUT} /dev/zero | tr '\\0' x; echo; cat settings.txt"
    model = ScriptedModel(
        [
            turn(call("read_file", path=".env"), content=f"Reading; I was handed {ENV_API_KEY}."),
            turn(call("read_file", path="settings.txt")),
            turn(call("run_command", argv=["cat", "settings.txt"])),
            turn(call("run_command", argv=["echo", DEPLOY_TOKEN, DOTENV_TOKEN, DB_URL])),
            turn(call("run_command", argv=["sh", "-c", long_command])),  # secrets in the tail
            turn(call("show_build_log", path="build.log")),
            turn(
                call(
                    "write_file",
                    path="notes.md",
                    content=f"deployed with {DEPLOY_TOKEN} to {DB_URL}, upstream {DOTENV_SHAPED}\n",
                )
            ),
            turn(
                call("request_completion", summary=f"deployed using {DEPLOY_TOKEN} and {DB_URL}"),
                content=f"All done; {DOTENV_TOKEN} and {DOTENV_UNICODE} worked.",
            ),
        ]
    )
    tools = default_registry()
    tools.register(show_build_log)
    harness = Harness(store=f"sqlite:///{db}", model=model, tools=tools)

    outcome = drive(harness, harness.run(GOAL, cwd=ws, mode="auto", verify=["cat settings.txt"]))

    assert outcome.status is RunStatus.COMPLETED, outcome.stop_reason
    model.assert_consumed()
    events = list(harness.events(outcome.id))
    stored = artifacts(harness.store, db)
    on_record = {**database_files(db), **stored}
    harness.close()
    on_record.update({f"{name} (closed)": content for name, content in database_files(db).items()})

    assert_none_on_record(on_record)
    # Each planted path was really taken, so the scan is not vacuous.
    (env_read,) = [d for d in tool_outputs(events, "read_file") if d["arguments"]["path"] == ".env"]
    assert "[redacted:SERVICE_TOKEN]" in env_read["output"]
    assert any(d["output"].startswith("x" * 100) for d in tool_outputs(events, "show_build_log"))
    names = " ".join(stored)
    assert "artifact diff.patch" in names and "artifact verify-1.log" in names
    assert "artifact output-" in names  # the long output went to an artifact
    (diff,) = [content for where, content in stored.items() if "diff.patch" in where]
    assert b"notes.md" in diff
    assert b".env.local" not in diff and b"b/.env" not in diff  # untracked secrets left out


def test_create_refuses_a_verify_command_holding_a_secret_and_stores_nothing(
    isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in ENVIRONMENT.items():
        monkeypatch.setenv(name, value)
    ws = planted_workspace(isolated)
    db = isolated / "keel.db"
    harness = Harness(store=f"sqlite:///{db}", model=ScriptedModel([]))
    for command, named in (
        (f"curl -H 'Authorization: Bearer {DEPLOY_TOKEN}' https://x/ok", "DEPLOY_TOKEN"),
        (f"./smoke --token {DOTENV_TOKEN}", "SERVICE_TOKEN"),
        (f"psql '{DB_URL}' -c 'select 1'", "DATABASE_URL"),
    ):
        with pytest.raises(ConfigError, match=named) as refused:
            harness.create("deploy", cwd=ws, verify=[command])
        assert findings({"the message": str(refused.value).encode()}) == []
    assert harness.store.list_runs() == []
    harness.close()
    assert findings(database_files(db)) == []


# --- the same through the `keel` command -------------------------------------------------


class Keel:
    """Runs ``keel`` in the planted workspace, the secrets in its environment only."""

    def __init__(self, root: Path, workspace: Path) -> None:
        self.workspace = workspace
        self.db = root / "keel.db"
        self.script_path = root / "script.json"
        cleared = ("KEEL_MODEL", "KEEL_STORE", "KEEL_FAULT", "OPENAI_BASE_URL")
        self.env = {k: v for k, v in os.environ.items() if k not in cleared}
        self.env.update(ENVIRONMENT)
        self.env.update({"KEEL_STORE": f"sqlite:///{self.db}", "COLUMNS": "200"})

    def script(self, turns: list[dict[str, Any]]) -> str:
        self.script_path.write_text(json.dumps(turns), encoding="utf-8")
        return f"scripted:{self.script_path}"

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "keel", *args],
            cwd=self.workspace,
            env=self.env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def events(self, run_id: str) -> Iterator[Event]:
        store = open_store(f"sqlite:///{self.db}")
        try:
            yield from list(iter_all_events(store, run_id))
        finally:
            store.close()


@pytest.fixture
def keel(isolated: Path) -> Keel:
    return Keel(isolated, planted_workspace(isolated))


def test_keel_run_leaves_no_planted_secret_on_record(keel: Keel) -> None:
    model = keel.script(
        [
            turn(call("read_file", path="settings.txt")),
            turn(call("run_command", argv=["cat", "settings.txt"])),
            turn(call("write_file", path="notes.md", content=f"used {DEPLOY_TOKEN}\n")),
            turn(call("request_completion", summary=f"done with {DEPLOY_TOKEN}")),
        ]
    )
    result = keel("run", GOAL, "--model", model, "--mode", "auto", "--verify", "cat settings.txt")
    run_id = result.stdout.splitlines()[0].strip() if result.stdout else ""
    assert re.fullmatch(r"run_\w+", run_id), result
    for _ in range(MAX_DECISIONS):
        if result.returncode != 3:
            break
        assert keel("approve", run_id).returncode == 0
        result = keel("resume", run_id)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"

    (created,) = [e for e in keel.events(run_id) if e.type is EventType.RUN_CREATED]
    assert "[redacted:DEPLOY_TOKEN]" in created.data["goal"]
    store = open_store(f"sqlite:///{keel.db}")
    try:
        stored = artifacts(store, keel.db)
    finally:
        store.close()
    assert any("verify-1.log" in where for where in stored)
    assert_none_on_record({**database_files(keel.db), **stored})


@pytest.mark.parametrize(
    ("command", "named"),
    [
        (f"curl -H 'Authorization: Bearer {DEPLOY_TOKEN}' https://x/ok", "DEPLOY_TOKEN"),
        (f"./smoke --token {DOTENV_TOKEN}", "SERVICE_TOKEN"),
        (f"psql '{DB_URL}' -c 'select 1'", "a credential inside a URL"),
    ],
    ids=["environment", "dotenv", "url"],
)
def test_keel_run_refuses_a_verify_command_holding_a_secret(
    keel: Keel, command: str, named: str
) -> None:
    model = keel.script([turn(call("request_completion", summary="done"))])
    result = keel("run", "deploy", "--model", model, "--verify", "true", "--verify", command)

    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr
    message = " ".join(result.stderr.split())
    assert "--verify command 2" in message and named in message
    assert '[sandbox] env = ["' in message
    assert findings({"stdout": result.stdout.encode(), "stderr": result.stderr.encode()}) == []
    if keel.db.exists():
        store = open_store(f"sqlite:///{keel.db}")
        try:
            assert store.list_runs() == []
        finally:
            store.close()
        assert findings(database_files(keel.db)) == []
