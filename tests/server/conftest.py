"""Fixtures for server tests: a REAL uvicorn on 127.0.0.1, a real store, real tokens.

Nothing here is an in-process test client: every request crosses a loopback socket.

Fixtures (use them from any test under ``tests/server``):

``server`` -> ``LiveServer``
    ``create_app(ServeConfig(...))`` served by ``uvicorn.Server`` in a thread of the
    test process, on a socket bound to 127.0.0.1:<free port>, against a fresh SQLite
    file in ``tmp_path``, no embedded workers, with one live token named ``tester``.
    Its attributes:
      ``url``        ``http://127.0.0.1:PORT``
      ``token``      the bearer token (``keel_…``); ``name`` its name ("tester")
      ``store_url``  the store's URL; ``store`` a separate Store handle on it (arrange
                     runs and tasks, check what the server wrote) — closed at teardown
      ``client``     ``httpx.Client`` with ``base_url`` and ``Authorization`` set
      ``anon``       ``httpx.Client`` with ``base_url`` only (no token)
      ``workspace``  an existing directory usable as a run's workspace
      ``headers``    ``{"Authorization": "Bearer TOKEN"}`` (for your own clients)
      ``app``        the FastAPI application being served
      ``add_token(name) -> str``  another live token on the same store

``start_server`` -> ``ServerFactory``
    ``start_server(store_url=None, *, workers=0, model=None, token_name="tester",
    keepalive_seconds=15.0, console=True) -> LiveServer``: as ``server`` with your
    settings (``store_url=None``: a new SQLite file under ``tmp_path``; pass a
    PostgreSQL URL — see ``postgres_url`` — for a shared store). Any number; all stopped
    at teardown, in reverse order (embedded workers finish their step and release
    their leases).

``serve_process`` -> ``ServeProcessFactory``
    ``serve_process(store_url, *, workers=0, extra_args=(), env=None) -> ServeProcess``:
    a real ``python -m keel serve --host 127.0.0.1 --port 0`` subprocess (cwd
    ``tmp_path``); waits for its start line and for ``/healthz`` to answer.
    ``ServeProcess``: ``url``, ``process`` (Popen), ``stop()`` (SIGTERM, wait; returns
    the exit code), ``output()`` (stdout+stderr so far, after stop). The caller creates
    a token on the store first (``create_token(store, name)``).

``postgres_url`` -> str
    A scratch PostgreSQL database (dropped at teardown); the test is skipped with the
    reason when ``KEEL_TEST_POSTGRES_URL`` is unset. Mark such tests
    ``@pytest.mark.postgres``.

``token_maker`` -> ``create_token(store, name) -> str``: a live token made the way
``keel token create`` makes one (for stores you opened yourself).

``poll_until`` -> ``wait_for(condition, *, timeout=10.0, interval=0.02)``: calls
``condition`` until it returns something truthy (which it returns), else fails the test.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from live_server import (
    START_TIMEOUT_S,
    LiveServer,
    ServeProcess,
    ServeProcessFactory,
    ServerFactory,
    create_token,
    serve_command,
    wait_for,
    wait_for_start_line,
    wait_until_answering,
)

from keel.server.app import create_app
from keel.server.config import ServeConfig
from keel.store.base import Store
from keel.store.url import open_store
from keel.testing.stores import postgres_unavailable, scratch_database


@pytest.fixture
def token_maker() -> Callable[[Store, str], str]:
    return create_token


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[ServerFactory]:
    started: list[LiveServer] = []
    count = 0

    def start(
        store_url: str | None = None,
        *,
        workers: int = 0,
        model: str | None = None,
        token_name: str = "tester",
        keepalive_seconds: float = 15.0,
        console: bool = True,
        workspace_roots: tuple[Path, ...] = (),
    ) -> LiveServer:
        nonlocal count
        count += 1
        home = tmp_path / f"server-{count}"
        workspace = home / "workspace"
        workspace.mkdir(parents=True)
        url = store_url or f"sqlite:///{home / 'keel.db'}"
        store = open_store(url)
        token = create_token(store, token_name) if token_name else ""
        config = ServeConfig(
            store_url=url,
            workers=workers,
            owner=f"test-server-{count}",
            console=console,
            model=model,
            poll_interval=0.05,
            keepalive_seconds=keepalive_seconds,
            workspace_roots=workspace_roots,
        )
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        app = create_app(config)
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        thread = threading.Thread(
            target=server.run, kwargs={"sockets": [sock]}, name=f"uvicorn-{port}", daemon=True
        )
        thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                store.close()
                raise RuntimeError(f"the test server on port {port} did not start")
            time.sleep(0.01)
        sock.close()  # uvicorn listens on its own duplicate of it
        base = f"http://127.0.0.1:{port}"
        live = LiveServer(
            url=base,
            token=token,
            name=token_name,
            store_url=url,
            store=store,
            client=httpx.Client(
                base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=30
            ),
            anon=httpx.Client(base_url=base, timeout=30),
            workspace=workspace,
            app=app,
            _server=server,
            _thread=thread,
        )
        started.append(live)
        return live

    yield start
    for live in reversed(started):
        live.stop()


@pytest.fixture
def server(start_server: ServerFactory) -> LiveServer:
    return start_server()


@pytest.fixture
def postgres_url() -> Iterator[str]:
    reason = postgres_unavailable()
    if reason is not None:
        pytest.skip(reason)
    with scratch_database() as url:
        yield url


@pytest.fixture
def serve_process(tmp_path: Path) -> Iterator[ServeProcessFactory]:
    running: list[ServeProcess] = []

    def spawn(
        store_url: str,
        *,
        workers: int = 0,
        token: str | None = None,
        extra_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> ServeProcess:
        log_path = tmp_path / f"serve-{len(running) + 1}.log"
        log = log_path.open("w")
        command = serve_command(
            store_url,
            *("--host", "127.0.0.1", "--port", "0", "--workers", str(workers), "--poll", "0.05"),
            *extra_args,
        )
        process = subprocess.Popen(
            command,
            cwd=tmp_path,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **(env or {})},
        )
        log.close()
        proc = ServeProcess(url="", process=process, log_path=log_path)
        running.append(proc)
        proc.url = wait_for_start_line(proc)
        if token is not None:
            wait_until_answering(proc.url, token)
        return proc

    yield spawn
    for proc in reversed(running):
        if proc.process.poll() is None:
            proc.stop()


@pytest.fixture
def poll_until() -> Callable[..., Any]:
    return wait_for
