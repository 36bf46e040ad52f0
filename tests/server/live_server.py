"""What the server tests share: a live uvicorn (``LiveServer``), a ``keel serve``
subprocess (``ServeProcess``), tokens and polling. The fixtures that make them are in
``conftest.py``; test modules import these names from here (``from live_server import
...``), never from ``conftest``, whose module name is shared by every test folder."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx
import uvicorn
from fastapi import FastAPI

from keel.runtime.api_tokens import hash_token, make_token
from keel.store.base import Store

START_TIMEOUT_S = 20.0


def create_token(store: Store, name: str) -> str:
    """A new live token named ``name`` (its hash stored), as ``keel token create``."""
    token = make_token()
    store.create_token(name, hash_token(token))
    return token


@dataclass(kw_only=True)
class LiveServer:
    url: str
    token: str
    name: str
    store_url: str
    store: Store
    client: httpx.Client
    anon: httpx.Client
    workspace: Path
    app: FastAPI
    _server: uvicorn.Server
    _thread: threading.Thread
    _clients: list[httpx.Client] = field(default_factory=list)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def add_token(self, name: str) -> str:
        return create_token(self.store, name)

    def stop(self) -> None:
        for client in (self.client, self.anon, *self._clients):
            client.close()
        self._server.should_exit = True
        self._thread.join(timeout=60)
        self.store.close()


class ServerFactory(Protocol):
    def __call__(
        self,
        store_url: str | None = None,
        *,
        workers: int = 0,
        model: str | None = None,
        token_name: str = "tester",
        keepalive_seconds: float = 15.0,
        console: bool = True,
        workspace_roots: tuple[Path, ...] = (),
    ) -> LiveServer: ...


@dataclass(kw_only=True)
class ServeProcess:
    url: str
    process: subprocess.Popen[str]
    log_path: Path

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")


class ServeProcessFactory(Protocol):
    def __call__(
        self,
        store_url: str,
        *,
        workers: int = 0,
        token: str | None = None,
        extra_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> ServeProcess: ...


def serve_command(store_url: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "keel", "serve", "--store", store_url, *args]


def wait_for_start_line(proc: ServeProcess) -> str:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        for line in proc.output().splitlines():
            if line.startswith("keel serve: http://"):
                return line.split()[2]
        if proc.process.poll() is not None:
            raise RuntimeError(f"keel serve exited {proc.process.returncode}:\n{proc.output()}")
        time.sleep(0.02)
    raise RuntimeError(f"keel serve printed no start line:\n{proc.output()}")


def wait_until_answering(url: str, token: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/healthz", headers={"Authorization": f"Bearer {token}"}).is_success:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.02)
    raise RuntimeError(f"{url}/healthz did not answer")


def wait_for(condition: Callable[[], Any], *, timeout: float = 10.0, interval: float = 0.02) -> Any:
    """Poll ``condition`` until it returns something truthy (returned) or time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)
