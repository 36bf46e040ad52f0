"""``keel token`` and ``keel serve`` as users run them: real processes, a real store."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from live_server import ServeProcessFactory

from keel.cli.serve import is_loopback
from keel.runtime.api_tokens import hash_token, well_formed
from keel.store.url import open_store
from keel.testing.cli import DONE, call, turn

TIMEOUT_S = 60


def keel(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "keel", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "200", "HOME": str(cwd)},
        check=False,
    )


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'keel.db'}"


def test_token_create_prints_it_once_and_stores_only_its_hash(
    tmp_path: Path, store_url: str
) -> None:
    made = keel(tmp_path, "token", "create", "ci-bot", "--store", store_url)
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    assert well_formed(token) and made.stdout.count(token) == 1
    assert "not stored" in " ".join(made.stderr.split())

    store = open_store(store_url)
    try:
        found = store.token_by_hash(hash_token(token))
        assert found is not None and found.name == "ci-bot"
    finally:
        store.close()
    assert token.encode() not in (tmp_path / "keel.db").read_bytes()

    listed = keel(tmp_path, "token", "list", "--store", store_url)
    assert "ci-bot" in listed.stdout and token not in listed.stdout
    as_json = json.loads(keel(tmp_path, "token", "list", "--json", "--store", store_url).stdout)
    assert [(t["name"], t["revoked_at"]) for t in as_json] == [("ci-bot", None)]
    assert "token" not in as_json[0]


def test_token_revoke_and_the_refusals_in_the_words_of_the_store(
    tmp_path: Path, store_url: str
) -> None:
    assert keel(tmp_path, "token", "create", "ops", "--store", store_url).returncode == 0
    twice = keel(tmp_path, "token", "create", "ops", "--store", store_url)
    assert twice.returncode == 2 and "already exists" in twice.stderr
    bad = keel(tmp_path, "token", "create", "no spaces", "--store", store_url)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr

    revoked = keel(tmp_path, "token", "revoke", "ops", "--store", store_url)
    assert revoked.returncode == 0 and "revoked" in revoked.stdout
    again = keel(tmp_path, "token", "revoke", "ops", "--store", store_url)
    assert again.returncode == 2 and "no live token named" in again.stderr
    [row] = json.loads(keel(tmp_path, "token", "list", "--json", "--store", store_url).stdout)
    assert row["name"] == "ops" and row["revoked_at"] is not None

    reused = keel(tmp_path, "token", "create", "ops", "--json", "--store", store_url)
    assert reused.returncode == 0 and well_formed(json.loads(reused.stdout)["token"])


def test_loopback_is_exactly_127_0_0_0_8_ipv6_1_and_localhost() -> None:
    for host in ("127.0.0.1", "127.8.9.10", "::1", "[::1]", "localhost", "LOCALHOST"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "10.0.0.1", "192.168.1.10", "example.internal", "128.0.0.1"):
        assert not is_loopback(host), host


@pytest.mark.parametrize("host", ["0.0.0.0", "example.internal"])
def test_serve_refuses_a_non_loopback_address_while_no_live_token_exists(
    tmp_path: Path, store_url: str, host: str
) -> None:
    store = open_store(store_url)
    store.create_token("gone", hash_token("keel_" + "x" * 43))
    store.revoke_token("gone")  # a revoked token is no token
    store.close()

    refused = keel(tmp_path, "serve", "--host", host, "--port", "0", "--store", store_url)

    assert refused.returncode == 2, refused
    message = " ".join(refused.stderr.split())
    assert f"refusing to listen on {host}" in message
    assert "keel token create NAME" in message and "Traceback" not in message
    assert refused.stdout == ""  # no start line: it never listened


def test_serve_answers_with_a_token_and_stops_cleanly_on_sigterm(
    tmp_path: Path, store_url: str, serve_process: ServeProcessFactory
) -> None:
    token = keel(tmp_path, "token", "create", "me", "--store", store_url).stdout.strip()
    served = serve_process(store_url, token=token)

    assert served.url.startswith("http://127.0.0.1:")
    assert "(console at /, API docs at /docs)" in served.output()
    auth = {"Authorization": f"Bearer {token}"}
    assert httpx.get(served.url + "/readyz", headers=auth).json() == {"store": "ok"}
    assert httpx.get(served.url + "/healthz").status_code == 401

    assert served.stop(signal.SIGTERM) == 0
    assert "Traceback" not in served.output()


def test_serve_with_workers_executes_a_submitted_run_and_releases_leases_on_stop(
    tmp_path: Path,
    store_url: str,
    serve_process: ServeProcessFactory,
    poll_until: Callable[..., Any],
) -> None:
    token = keel(tmp_path, "token", "create", "me", "--store", store_url).stdout.strip()
    workspace = tmp_path / "ws"
    workspace.mkdir()
    model = workspace / "turns.json"
    model.write_text(json.dumps([turn(call("write_file", path="a.txt", content="hi\n")), DONE]))
    served = serve_process(store_url, workers=2, token=token)
    client = httpx.Client(base_url=served.url, headers={"Authorization": f"Bearer {token}"})

    run = client.post(
        "/runs", json={"goal": "write a", "workspace": str(workspace), "model": f"scripted:{model}"}
    ).json()
    poll_until(lambda: client.get(f"/runs/{run['id']}").json()["status"] == "completed")
    assert (workspace / "a.txt").read_text() == "hi\n"
    client.close()

    assert served.stop(signal.SIGINT) == 0
    store = open_store(store_url)
    try:
        assert store.current_run_lease(run["id"]) is None
    finally:
        store.close()


def test_serve_with_a_broken_store_url_says_why_and_exits_2(tmp_path: Path) -> None:
    refused = keel(tmp_path, "serve", "--port", "0", "--store", "mysql://db/keel")
    assert refused.returncode == 2 and "unknown store URL" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and refused.stdout == ""
    with socket.socket() as taken:  # a port another program listens on
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        store = f"sqlite:///{tmp_path / 'k.db'}"
        busy = keel(tmp_path, "serve", "--port", str(port), "--store", store)
    assert busy.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in busy.stderr


def test_serve_keeps_api_runs_inside_its_workspace_roots(
    tmp_path: Path, store_url: str, serve_process: ServeProcessFactory
) -> None:
    missing = keel(tmp_path, "serve", "--workspace-root", str(tmp_path / "nope"), "--port", "0")
    assert missing.returncode == 2 and "--workspace-root" in missing.stderr
    assert missing.stdout == ""
    token = keel(tmp_path, "token", "create", "me", "--store", store_url).stdout.strip()
    root = tmp_path / "repos"
    (root / "a").mkdir(parents=True)
    served = serve_process(store_url, token=token, extra_args=("--workspace-root", str(root)))
    auth = {"Authorization": f"Bearer {token}"}
    for workspace, status in ((root / "a", 201), (tmp_path, 422)):
        body = {"goal": "g", "workspace": str(workspace), "model": "openai:m"}
        assert httpx.post(served.url + "/runs", json=body, headers=auth).status_code == status
    assert served.stop(signal.SIGTERM) == 0
