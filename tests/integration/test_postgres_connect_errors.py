"""A PostgreSQL store that cannot connect says what failed, in one line, within seconds.

Refused ports, unknown hosts and silent servers need no server; a missing database and
an unknown user are asked of the local server (``KEEL_TEST_POSTGRES_URL``). That server
trusts every local connection, so a wrong password cannot be provoked there: a loopback
server speaking the PostgreSQL wire protocol asks for a password and refuses it, as a
real server with password authentication does, and libpq reports it in its own words.
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from keel.core.errors import ConfigError, KeelError, StoreError
from keel.store.url import open_store
from keel.testing.stores import POSTGRES_URL_ENV, postgres_unavailable, scratch_database

pytest.importorskip("psycopg", reason="psycopg is not installed: pip install 'keel[postgres]'")

KEEL = str(Path(sys.executable).with_name("keel"))
FEW_SECONDS = 3.0


def refusal(url: str) -> tuple[KeelError, float]:
    """The error opening a store at ``url`` raises, and how long it took."""
    started = time.monotonic()
    with pytest.raises(KeelError) as caught:
        open_store(url).close()
    return caught.value, time.monotonic() - started


def local_url(*, user: str | None = None, dbname: str | None = None) -> str:
    if reason := postgres_unavailable():
        pytest.skip(f"PostgreSQL not tested: {reason}")
    parts = urlsplit(os.environ[POSTGRES_URL_ENV])
    netloc = parts.netloc if user is None else f"{user}@{parts.hostname}:{parts.port or 5432}"
    path = parts.path if dbname is None else f"/{dbname}"
    return urlunsplit(parts._replace(netloc=netloc, path=path))


def keel_tasks_list(store: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
    return subprocess.run(
        [KEEL, "tasks", "list", "--store", store],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


# --- no server needed ------------------------------------------------------------------


def test_a_refused_port_names_host_and_port_at_once() -> None:
    error, took = refusal("postgresql://keel:s3cret-pw@127.0.0.1:1/keel")
    assert isinstance(error, StoreError) and not isinstance(error, ConfigError)
    assert "PostgreSQL at 127.0.0.1:1: connection refused" in str(error)
    assert "s3cret-pw" not in str(error) and "\n" not in str(error)
    assert took < FEW_SECONDS


def test_an_unknown_host_is_named() -> None:
    error, took = refusal("postgresql://keel@keel-no-such-host.invalid:5432/keel")
    assert isinstance(error, ConfigError)
    assert "unknown host 'keel-no-such-host.invalid'" in str(error)
    assert took < FEW_SECONDS


@contextmanager
def silent_server() -> Iterator[int]:
    """A port that accepts connections and never says a word."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()


def test_a_silent_server_is_given_up_after_the_connect_timeout() -> None:
    with silent_server() as port:
        error, took = refusal(f"postgresql://keel@127.0.0.1:{port}/keel?connect_timeout=2")
    assert isinstance(error, StoreError)
    assert f"127.0.0.1:{port}: no answer within 2 s" in str(error)
    assert 1.5 < took < 2 + FEW_SECONDS


@contextmanager
def password_refusing_server() -> Iterator[int]:
    """Speaks just enough of the PostgreSQL protocol to ask for a password and refuse it
    (SQLSTATE 28P01), as a server with password authentication does."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)

    def read_exact(conn: socket.socket, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = conn.recv(size - len(data))
            if not chunk:
                raise ConnectionError("client went away")
            data += chunk
        return data

    def serve(conn: socket.socket) -> None:
        with conn:
            while True:  # SSL / GSS requests, then the startup message
                (length,) = struct.unpack("!i", read_exact(conn, 4))
                body = read_exact(conn, length - 4)
                if struct.unpack("!i", body[:4])[0] in (80877103, 80877104):
                    conn.sendall(b"N")  # no SSL, no GSS encryption here
                    continue
                break
            conn.sendall(b"R" + struct.pack("!ii", 8, 3))  # cleartext password, please
            read_exact(conn, 1)
            (length,) = struct.unpack("!i", read_exact(conn, 4))
            read_exact(conn, length - 4)
            fields = b"".join(
                code + text.encode() + b"\0"
                for code, text in (
                    (b"S", "FATAL"),
                    (b"V", "FATAL"),
                    (b"C", "28P01"),
                    (b"M", 'password authentication failed for user "alice"'),
                )
            )
            conn.sendall(b"E" + struct.pack("!i", len(fields) + 5) + fields + b"\0")

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with suppress(ConnectionError, OSError):
                serve(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()


def test_a_refused_password_names_the_user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGPASSFILE", os.devnull)
    with password_refusing_server() as port:
        error, took = refusal(f"postgresql://alice:wrong-pw@127.0.0.1:{port}/app")
        missing, _ = refusal(f"postgresql://alice@127.0.0.1:{port}/app")
    assert isinstance(error, ConfigError)
    assert f'PostgreSQL at 127.0.0.1:{port} refused user "alice": authentication failed' in str(
        error
    )
    assert "wrong-pw" not in str(error)
    assert took < FEW_SECONDS
    assert isinstance(missing, ConfigError)
    assert 'wants a password for user "alice"' in str(missing)


def test_the_cli_prints_one_line_and_exits_2_within_seconds() -> None:
    started = time.monotonic()
    proc = keel_tasks_list("postgresql://keel:s3cret-pw@127.0.0.1:1/keel")
    took = time.monotonic() - started
    assert proc.returncode == 2, proc
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "PostgreSQL at 127.0.0.1:1: connection refused" in lines[0]
    assert "s3cret-pw" not in proc.stderr
    assert took < FEW_SECONDS + 2  # the interpreter's own start-up included


# --- the local server ------------------------------------------------------------------


def test_a_missing_database_is_named_with_how_to_create_it() -> None:
    url = local_url(dbname="keel_no_such_database")
    error, took = refusal(url)
    assert isinstance(error, ConfigError)
    text = str(error)
    assert 'has no database "keel_no_such_database"' in text
    assert "createdb" in text and "keel_no_such_database" in text.split("createdb", 1)[1]
    assert took < FEW_SECONDS
    proc = keel_tasks_list(url)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert 'no database "keel_no_such_database"' in proc.stderr


def test_an_unknown_user_is_named() -> None:
    error, took = refusal(local_url(user="keel_no_such_role"))
    assert isinstance(error, ConfigError)
    assert 'has no user (role) "keel_no_such_role"' in str(error)
    assert took < FEW_SECONDS


def test_a_good_url_still_opens_and_keeps_its_query_parameters() -> None:
    local_url()  # skips without a server
    with scratch_database() as url:
        store = open_store(url + "?synchronous_commit=off&connect_timeout=3")
        try:
            assert store.list_tasks() == []
        finally:
            store.close()
