"""`PlainHTTPPool`, the HTTP/1.1 pool behind every plain ``http://`` model client.

Each guarantee is checked on real sockets on 127.0.0.1: against `FakeProvider`, and
against `HandServer` below, a keep-alive server written on raw sockets for what a
provider does to a pool and FakeProvider does not script (dropping an idle connection,
``Connection: close`` on every answer, holding answers until told) and for what only
the server can see (which connection carried which request, bytes arriving on a
connection while it is still answering, a connection closed by the client).
"""

from __future__ import annotations

import contextlib
import json
import random
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from keel.models.connections import (
    PlainHTTPPool,
    close_shared_clients,
    plain_http_client,
    shared_client,
)
from keel.testing.provider import FakeProvider

ASK = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
WAIT = 10.0  # seconds a test waits for something that takes milliseconds
_TCP_FIN_WAIT2 = 5  # tcpi_state once the peer acknowledged our FIN


def wait_until(condition: Callable[[], bool], what: str) -> None:
    """Wait (bounded) for `condition`, which another thread makes true."""
    deadline = time.monotonic() + WAIT
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting: {what}")
        time.sleep(0.005)


@dataclass(frozen=True)
class Served:
    """One request as the server saw it: the token it carried, on which connection."""

    token: str
    connection: int
    port: int


class HandServer:
    """An HTTP/1.1 keep-alive server on raw sockets, one thread per connection.

    A request's headers steer its answer: ``x-token`` is echoed in a JSON body with the
    connection's number, ``x-delay`` waits that many seconds first, ``x-hold`` waits
    until `release`, ``x-body-bytes`` answers with that many bytes instead. With
    `close_each` every answer says ``Connection: close`` and the connection is closed.
    Recorded: `served` (in arrival order), `log` (``received``/``answering`` events in
    order), `accepted` connections, `closed_by_client` (connection numbers whose client
    closed them), `overlaps` (connections where a request's bytes arrived before the
    previous answer was written: two requests on one connection at once), `errors`.
    """

    def __init__(self, *, close_each: bool = False) -> None:
        self.close_each = close_each
        self.served: list[Served] = []
        self.log: list[tuple[str, str]] = []
        self.accepted = 0
        self.closed_by_client: set[int] = set()
        self.overlaps: list[int] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._idle: set[socket.socket] = set()
        self._sockets: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._release = threading.Event()
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def __enter__(self) -> HandServer:
        thread = threading.Thread(target=self._accept, daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._release.set()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for thread in list(self._threads):
            thread.join(timeout=WAIT)
        self._listener.close()

    def release(self) -> None:
        """Let every held answer (``x-hold``) go, and later ones through at once."""
        self._release.set()

    def received(self, token: str) -> bool:
        with self._lock:
            return ("received", token) in self.log

    def connection_of(self, token: str) -> int:
        with self._lock:
            return next(s.connection for s in self.served if s.token == token)

    def drop_idle(self) -> int:
        """Close (send FIN on) every connection waiting for its next request, as a
        server whose keep-alive timeout passed does; returns only once each client has
        acknowledged the FIN (so its socket reads as closed). Returns how many."""
        with self._lock:
            idle = list(self._idle)
            self._idle.clear()
        for sock in idle:
            sock.shutdown(socket.SHUT_WR)
        for sock in idle:
            wait_until(lambda s=sock: _tcp_state(s) == _TCP_FIN_WAIT2, "the client's ACK")
        return len(idle)

    # --- serving ------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                sock, (_, port) = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self.accepted += 1
                number = self.accepted
                self._sockets.add(sock)
            thread = threading.Thread(target=self._serve, args=(sock, number, port), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _serve(self, sock: socket.socket, number: int, port: int) -> None:
        sock.settimeout(None)
        buffer = bytearray()
        try:
            while not self._stop.is_set():
                with self._lock:
                    self._idle.add(sock)
                head = _read_head(sock, buffer)
                with self._lock:
                    self._idle.discard(sock)
                if head is None:
                    self._closed_by_client(number)
                    return
                if not self._answer(sock, buffer, head, number, port):
                    return
        except OSError:  # the client went away mid-answer (it closed a response early)
            self._closed_by_client(number)
        except Exception as exc:  # reported to the test, not to a thread hook
            with self._lock:
                self.errors.append(f"connection {number}: {type(exc).__name__}: {exc}")
        finally:
            with self._lock:
                self._idle.discard(sock)
                self._sockets.discard(sock)
            sock.close()

    def _closed_by_client(self, number: int) -> None:
        if not self._stop.is_set():
            with self._lock:
                self.closed_by_client.add(number)

    def _answer(
        self, sock: socket.socket, buffer: bytearray, head: dict[str, str], number: int, port: int
    ) -> bool:
        """Answer one request; False when the connection is to be closed."""
        _read_exactly(sock, buffer, int(head.get("content-length", "0")))
        token = head.get("x-token", "")
        with self._lock:
            self.served.append(Served(token, number, port))
            self.log.append(("received", token))
        if "x-hold" in head:
            self._release.wait()
        if "x-delay" in head:
            self._stop.wait(float(head["x-delay"]))
        if buffer or _readable(sock):
            with self._lock:
                self.overlaps.append(number)
        if "x-body-bytes" in head:
            body = b"x" * int(head["x-body-bytes"])
            kind = "application/octet-stream"
        else:
            body = json.dumps({"token": token, "connection": number}).encode()
            kind = "application/json"
        lines = [
            "HTTP/1.1 200 OK",
            f"Content-Type: {kind}",
            f"Content-Length: {len(body)}",
        ]
        if self.close_each:
            lines.append("Connection: close")
        with self._lock:
            self.log.append(("answering", token))
            if not self.close_each:
                self._idle.add(sock)  # before the client can see the end of the answer
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        return not self.close_each


def _read_head(sock: socket.socket, buffer: bytearray) -> dict[str, str] | None:
    """The next request's headers (lower-case names), or None at a clean end."""
    while b"\r\n\r\n" not in buffer:
        data = sock.recv(65536)
        if not data:
            if buffer:
                raise ValueError(f"connection ended inside a request head: {bytes(buffer)!r}")
            return None
        buffer += data
    end = buffer.index(b"\r\n\r\n")
    lines = buffer[:end].decode("latin-1").split("\r\n")
    del buffer[: end + 4]
    if not lines[0].startswith(("GET ", "POST ")) or not lines[0].endswith(" HTTP/1.1"):
        raise ValueError(f"not an HTTP/1.1 request line: {lines[0]!r}")
    fields = (line.split(":", 1) for line in lines[1:])
    return {name.strip().lower(): value.strip() for name, value in fields}


def _read_exactly(sock: socket.socket, buffer: bytearray, size: int) -> bytes:
    while len(buffer) < size:
        data = sock.recv(65536)
        if not data:
            raise ValueError("connection ended inside a request body")
        buffer += data
    body = bytes(buffer[:size])
    del buffer[:size]
    return body


def _readable(sock: socket.socket) -> bool:
    """Bytes (or an end) already wait on `sock`, without consuming them."""
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
    except BlockingIOError:
        return False


def _tcp_state(sock: socket.socket) -> int:
    return int(struct.unpack("B", sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1))[0])


# --- fixtures ---------------------------------------------------------------------------


@pytest.fixture
def server() -> Iterator[HandServer]:
    with HandServer() as running:
        yield running
    assert running.errors == []
    assert running.overlaps == []


MakeClient = Callable[..., httpx.Client]


@pytest.fixture
def make_client() -> Iterator[MakeClient]:
    """`plain_http_client(...)` for one test, closed after it."""
    clients: list[httpx.Client] = []

    def make(timeout: float | httpx.Timeout = WAIT, **limits: Any) -> httpx.Client:
        client = plain_http_client(WAIT, **limits)
        client.timeout = timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


def ask(client: httpx.Client, base_url: str, token: str, **headers: str) -> dict[str, Any]:
    """One request carrying `token`; the server's JSON answer, checked to echo it."""
    response = client.post(
        f"{base_url}/echo",
        content=b"{}",
        headers={"x-token": token, **{k.replace("_", "-"): v for k, v in headers.items()}},
    )
    assert response.status_code == 200
    answer: dict[str, Any] = response.json()
    assert answer["token"] == token
    return answer


# --- the pool is the one in use -------------------------------------------------------------


def test_plain_http_clients_use_the_plain_pool_and_tls_ones_do_not() -> None:
    plain = shared_client("http://127.0.0.1:9/v1", 5.0)
    secure = shared_client("https://127.0.0.1:9/v1", 5.0)
    assert isinstance(getattr(plain._transport, "_pool", None), PlainHTTPPool)
    assert not isinstance(getattr(secure._transport, "_pool", None), PlainHTTPPool)


# --- 1. reuse -------------------------------------------------------------------------------


def test_sequential_requests_reuse_one_connection() -> None:
    with FakeProvider() as provider:
        provider.reply("one").reply("two").reply("three")
        client = shared_client(provider.base_url, WAIT)
        url = f"{provider.base_url}/chat/completions"
        assert client.post(url, json=ASK).json()["choices"][0]["message"]["content"] == "one"
        with client.stream("POST", url, json={**ASK, "stream": True}) as response:
            streamed = b"".join(response.iter_bytes())  # read to the end, as the adapter does
        assert b'"two"' in streamed and streamed.rstrip().endswith(b"data: [DONE]")
        assert client.post(url, json=ASK).json()["choices"][0]["message"]["content"] == "three"
    assert len(set(provider.peer_ports)) == 1
    assert provider.connections == 1


# --- 2. a connection the server dropped while idle --------------------------------------------


def test_a_connection_the_server_closed_while_idle_is_replaced(
    server: HandServer, make_client: MakeClient
) -> None:
    client = make_client()
    first = ask(client, server.base_url, "before")
    assert server.drop_idle() == 1
    second = ask(client, server.base_url, "after")  # no error reaches the caller
    assert second["connection"] != first["connection"]
    assert server.accepted == 2


# --- 3. a response closed before its end ------------------------------------------------------


@pytest.mark.parametrize("read_first_piece", [False, True], ids=["unread", "partly-read"])
def test_a_response_closed_before_its_end_does_not_give_its_connection_back(
    server: HandServer, make_client: MakeClient, read_first_piece: bool
) -> None:
    client = make_client()
    body_bytes = 4_000_000 if read_first_piece else 100  # a small one sits whole in the buffer
    with client.stream(
        "POST",
        f"{server.base_url}/big",
        headers={"x-token": "big", "x-body-bytes": str(body_bytes)},
    ) as response:
        assert response.status_code == 200
        if read_first_piece:
            assert next(response.iter_bytes())
    answer = ask(client, server.base_url, "next")
    assert answer["connection"] != server.connection_of("big")
    assert server.accepted == 2
    wait_until(lambda: server.connection_of("big") in server.closed_by_client, "big closed")


# --- 4. keep-alive expiry -----------------------------------------------------------------------


def test_an_idle_connection_past_its_keepalive_expiry_is_replaced(
    server: HandServer, make_client: MakeClient
) -> None:
    client = make_client(keepalive_expiry=0.2)
    first = ask(client, server.base_url, "first")
    time.sleep(0.5)  # idle past its expiry
    second = ask(client, server.base_url, "second")
    assert second["connection"] != first["connection"]
    wait_until(lambda: first["connection"] in server.closed_by_client, "the expired one closed")


def test_expired_idle_connections_that_are_never_taken_are_closed(
    server: HandServer, make_client: MakeClient
) -> None:
    """Most recently used first leaves the oldest idle ones at the bottom: giving a
    connection back closes those past their expiry instead of keeping them forever."""
    client = make_client(keepalive_expiry=1.0)
    both = [
        threading.Thread(target=ask, args=(client, server.base_url, name), kwargs={"x_hold": "1"})
        for name in ("a", "b")
    ]
    for thread in both:
        thread.start()
    wait_until(lambda: server.received("a") and server.received("b"), "two connections busy")
    server.release()
    for thread in both:
        thread.join(timeout=WAIT)
    assert server.accepted == 2
    time.sleep(0.6)
    refresh = ask(client, server.base_url, "refresh")  # takes the most recent, keeps it fresh
    time.sleep(0.6)  # now the other one has been idle for more than the expiry
    last = ask(client, server.base_url, "last")
    used = {refresh["connection"], last["connection"]}
    wait_until(
        lambda: {1, 2} - used <= server.closed_by_client,
        "the connection left idle closed by the client",
    )


# --- 5. the cap on connections -------------------------------------------------------------------


def test_a_request_beyond_the_cap_waits_for_a_connection_to_free(
    server: HandServer, make_client: MakeClient
) -> None:
    client = make_client(max_connections=2, max_idle=2)
    results: dict[str, Any] = {}

    def run(token: str, **headers: str) -> None:
        try:
            results[token] = ask(client, server.base_url, token, **headers)
        except Exception as exc:  # reported by the assertions below
            results[token] = exc

    held = [threading.Thread(target=run, args=(t,), kwargs={"x_hold": "1"}) for t in "ab"]
    for thread in held:
        thread.start()
    wait_until(lambda: server.received("a") and server.received("b"), "two requests held")
    third = threading.Thread(target=run, args=("c",))
    third.start()
    time.sleep(0.3)  # time for the third to reach the pool (its waiting is what is checked)
    assert not server.received("c")
    server.release()
    for thread in [*held, third]:
        thread.join(timeout=WAIT)
    assert all(isinstance(results[t], dict) for t in "abc"), results
    assert server.accepted == 2
    assert results["c"]["connection"] in {results["a"]["connection"], results["b"]["connection"]}
    first_answer = min(server.log.index(("answering", t)) for t in "ab")
    assert first_answer < server.log.index(("received", "c"))


def test_a_request_beyond_the_cap_gives_up_at_the_pool_timeout(
    server: HandServer, make_client: MakeClient
) -> None:
    client = make_client(httpx.Timeout(WAIT, pool=0.2), max_connections=1, max_idle=1)
    held: dict[str, Any] = {}
    thread = threading.Thread(
        target=lambda: held.update(ask(client, server.base_url, "held", x_hold="1"))
    )
    thread.start()
    wait_until(lambda: server.received("held"), "the first request held")
    with pytest.raises(httpx.PoolTimeout):
        ask(client, server.base_url, "refused")
    assert not server.received("refused")
    server.release()
    thread.join(timeout=WAIT)
    assert held["token"] == "held"
    assert ask(client, server.base_url, "later")["connection"] == held["connection"]


# --- 6. many threads at once -----------------------------------------------------------------


def test_many_threads_each_get_their_own_answer_on_a_connection_of_their_own(
    server: HandServer, make_client: MakeClient
) -> None:
    cap = 8
    client = make_client(max_connections=cap, max_idle=cap)
    threads, per_thread = 32, 10
    start = threading.Barrier(threads)
    failures: list[str] = []
    answered: list[str] = []
    lock = threading.Lock()

    def work(number: int) -> None:
        rng = random.Random(number)
        start.wait()
        for i in range(per_thread):
            token = f"{number}-{i}"
            delay = f"{rng.uniform(0, 0.003):.4f}"
            try:
                answer = ask(client, server.base_url, token, x_delay=delay)
            except Exception as exc:  # reported by the assertions below
                with lock:
                    failures.append(f"{token}: {type(exc).__name__}: {exc}")
            else:
                with lock:
                    answered.append(answer["token"])

    workers = [threading.Thread(target=work, args=(n,), daemon=True) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
    assert not any(worker.is_alive() for worker in workers)
    assert failures == []
    assert sorted(answered) == sorted(f"{n}-{i}" for n in range(threads) for i in range(per_thread))
    assert len(server.served) == threads * per_thread
    assert server.accepted <= cap
    assert server.overlaps == []  # checked by the fixture too; said here as the point


# --- 7. closing while a request is in flight ------------------------------------------------


def test_closing_the_shared_clients_fails_a_request_in_flight_and_later_ones_reconnect(
    server: HandServer,
) -> None:
    client = shared_client(server.base_url, WAIT * 3)
    outcome: list[BaseException | dict[str, Any]] = []

    def in_flight() -> None:
        try:
            outcome.append(ask(client, server.base_url, "held", x_hold="1"))
        except Exception as exc:  # the failure is what is checked
            outcome.append(exc)

    thread = threading.Thread(target=in_flight)
    thread.start()
    try:
        wait_until(lambda: server.received("held"), "the request in flight")
        close_shared_clients()
        thread.join(timeout=WAIT)  # it fails now, not when the held answer would come
        assert not thread.is_alive()
        assert len(outcome) == 1 and isinstance(outcome[0], httpx.TransportError), outcome
        assert ("answering", "held") not in server.log
    finally:
        server.release()
        thread.join(timeout=WAIT)
    reopened = shared_client(server.base_url, WAIT * 3)
    assert reopened is not client and client.is_closed
    assert ask(reopened, server.base_url, "after")["token"] == "after"


def test_a_request_waiting_for_a_connection_fails_when_the_pool_closes(
    server: HandServer, make_client: MakeClient
) -> None:
    client = make_client(WAIT * 3, max_connections=1, max_idle=1)  # reads outlast the test
    outcomes: dict[str, BaseException | None] = {}

    def run(token: str, **headers: str) -> None:
        try:
            ask(client, server.base_url, token, **headers)
            outcomes[token] = None
        except Exception as exc:  # the failure is what is checked
            outcomes[token] = exc

    held = threading.Thread(target=run, args=("held",), kwargs={"x_hold": "1"})
    held.start()
    wait_until(lambda: server.received("held"), "the request in flight")
    waiting = threading.Thread(target=run, args=("waiting",))
    waiting.start()
    time.sleep(0.2)  # time for it to wait in the pool
    client.close()
    for thread in (held, waiting):
        thread.join(timeout=WAIT)
        assert not thread.is_alive()
    assert isinstance(outcomes["held"], httpx.TransportError)
    assert isinstance(outcomes["waiting"], (httpx.TransportError, RuntimeError))
    assert not server.received("waiting")


# --- 8. Connection: close ------------------------------------------------------------------------


def test_answers_saying_connection_close_work_and_their_connections_are_not_reused(
    make_client: MakeClient,
) -> None:
    with HandServer(close_each=True) as server:
        client = make_client()
        answers = [ask(client, server.base_url, f"t{i}") for i in range(5)]
    assert server.errors == []
    assert [a["connection"] for a in answers] == [1, 2, 3, 4, 5]
    assert server.accepted == 5
