"""A real ``keel serve`` on loopback for the web console's tests, and a headless Chromium.

One server per session: a real SQLite file, two embedded worker slots executing
scripted-model runs, a token made with ``keel token create``. The browser is Debian's
``/usr/bin/chromium`` driven by Playwright (never a downloaded browser); without it (or
without the ``playwright`` package) ``test_console.py`` is skipped, saying why (pytest's
``-ra`` prints the reason in the summary).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from keel.core.tasks import TaskStatus
from keel.runtime.api_tokens import hash_token, make_token
from keel.store.url import open_store

KEEL = [sys.executable, "-m", "keel.cli.app"]
REPO = Path(__file__).resolve().parents[2]
TERMINAL = {"completed", "failed", "blocked", "cancelled"}


@pytest.fixture(scope="session")
def screenshots() -> Path:
    """Where screenshots go: $KEEL_TEST_ARTIFACTS/console, else test-results/console."""
    base = os.environ.get("KEEL_TEST_ARTIFACTS")
    root = Path(base) if base else REPO / "test-results"
    folder = root / "console"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class KeelServer:
    """A running ``keel serve``: its URL, a live token, and the files it works in."""

    url: str
    token: str
    root: Path
    store_url: str
    process: subprocess.Popen[str]
    tasks: dict[str, str] = field(default_factory=dict)  # name -> task id

    def api(self, token: str | None = None) -> httpx.Client:
        return httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token or self.token}"},
            timeout=10,
        )

    def script(self, name: str, turns: list[dict[str, Any]]) -> str:
        path = self.root / f"{name}.json"
        path.write_text(json.dumps(turns))
        return f"scripted:{path}"

    def workspace(self, name: str) -> Path:
        path = self.root / "ws" / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def submit(self, goal: str, name: str, turns: list[dict[str, Any]], **extra: Any) -> str:
        body = {
            "goal": goal,
            "workspace": str(self.workspace(name)),
            "model": self.script(name, turns),
            "mode": "edit",
            **extra,
        }
        with self.api() as api:
            response = api.post("/runs", json=body)
        assert response.status_code == 201, response.text
        run_id: str = response.json()["id"]
        return run_id

    def view(self, run_id: str) -> dict[str, Any]:
        with self.api() as api:
            response = api.get(f"/runs/{run_id}")
        assert response.status_code == 200, response.text
        view: dict[str, Any] = response.json()
        return view

    def wait_for(self, run_id: str, *statuses: str, timeout: float = 20.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        view = self.view(run_id)
        while view["status"] not in statuses:
            if time.monotonic() > deadline or (view["status"] in TERMINAL):
                raise AssertionError(f"run {run_id} is {view['status']}, not {statuses}: {view}")
            time.sleep(0.1)
            view = self.view(run_id)
        return view

    def new_token(self, name: str) -> str:
        """A second live token (revoke it with ``revoke``)."""
        token = make_token()
        store = open_store(self.store_url)
        try:
            store.create_token(name, hash_token(token))
        finally:
            store.close()
        return token

    def revoke(self, name: str) -> None:
        store = open_store(self.store_url)
        try:
            store.revoke_token(name)
        finally:
            store.close()

    def events(self, run_id: str) -> list[dict[str, Any]]:
        with self.api() as api:
            response = api.get(f"/runs/{run_id}/events")
        assert response.status_code == 200, response.text
        events: list[dict[str, Any]] = response.json()["events"]
        return events


def _seed_tasks(store_url: str) -> dict[str, str]:
    """A task graph with every status, none ready (so no worker claims one):
    schema (completed) -> api (in progress) -> docs (pending) -> release (pending);
    schema -> load test (failed) -> release; an abandoned idea (cancelled)."""
    store = open_store(store_url)
    try:
        schema = store.create_task("design the schema", actor="lead")
        api = store.create_task("write the API", actor="lead", blocked_by=[schema.id])
        load = store.create_task("load test", actor="lead", blocked_by=[schema.id])
        docs = store.create_task("write the docs", actor="lead", blocked_by=[api.id])
        release = store.create_task("release", actor="lead", blocked_by=[docs.id, load.id])
        idea = store.create_task("an abandoned idea", actor="lead")
        store.cancel_task(idea.id, actor="lead", reason="not needed")
        held = store.claim_task(owner="tester", lease_seconds=3600, task_id=schema.id)
        assert held is not None
        store.complete_task(schema.id, owner="tester", token=held.lease_token, result="done")
        store.claim_task(owner="tester", lease_seconds=3600, task_id=api.id)
        held = store.claim_task(owner="tester", lease_seconds=3600, task_id=load.id)
        assert held is not None
        store.fail_task(load.id, owner="tester", reason="too slow", token=held.lease_token)
        found = {t.id: t.status for t in store.list_tasks()}
        assert found[docs.id] is TaskStatus.PENDING and found[api.id] is TaskStatus.IN_PROGRESS
        return {
            "schema": schema.id,
            "api": api.id,
            "load": load.id,
            "docs": docs.id,
            "release": release.id,
            "idea": idea.id,
        }
    finally:
        store.close()


def start_serve(root: Path, store_url: str, port: int, *, workers: int) -> subprocess.Popen[str]:
    """``keel serve`` on 127.0.0.1:``port``, once it answers ``/healthz`` (any token:
    a 401 is an answer)."""
    env = {**os.environ, "KEEL_LEASE_TTL": "30"}
    env.pop("KEEL_MODEL", None)
    log_path = root / f"serve-{port}.log"
    with log_path.open("a") as log:
        process = subprocess.Popen(
            [
                *KEEL,
                *("serve", "--host", "127.0.0.1", "--port", str(port)),
                *("--workers", str(workers), "--poll", "0.1", "--store", store_url),
            ],
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
    deadline = time.monotonic() + 30
    while True:
        if process.poll() is not None:
            raise AssertionError(f"keel serve exited: {log_path.read_text()}")
        try:
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
            return process
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            stop_serve(process)
            raise AssertionError(f"keel serve never answered: {log_path.read_text()}")
        time.sleep(0.05)


def stop_serve(process: subprocess.Popen[str]) -> None:
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="session")
def keel_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KeelServer]:
    root = tmp_path_factory.mktemp("console")
    store_url = f"sqlite:///{root / 'keel.db'}"
    token = make_token()
    store = open_store(store_url)
    try:  # what `keel token create` does (tests/server cover the command itself)
        store.create_token("console", hash_token(token))
    finally:
        store.close()
    tasks = _seed_tasks(store_url)
    port = free_port()
    process = start_serve(root, store_url, port, workers=2)
    try:
        yield KeelServer(
            url=f"http://127.0.0.1:{port}",
            token=token,
            root=root,
            store_url=store_url,
            process=process,
            tasks=tasks,
        )
    finally:
        stop_serve(process)


@pytest.fixture
def replica_server(keel_server: KeelServer) -> Iterator[Callable[[int], subprocess.Popen[str]]]:
    """Starts another ``keel serve`` (no workers) on the same store at a given port
    (``free_port()`` for a new one); all are stopped after the test."""
    started: list[subprocess.Popen[str]] = []

    def start(port: int) -> subprocess.Popen[str]:
        process = start_serve(keel_server.root, keel_server.store_url, port, workers=0)
        started.append(process)
        return process

    yield start
    for process in started:
        stop_serve(process)


@pytest.fixture
def unused_port() -> int:
    return free_port()
