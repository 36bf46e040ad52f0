"""One pooled HTTP client per provider and process, shared by every run and worker slot.

Opening a client costs a TLS context (tens of milliseconds) and every new connection a
TCP and TLS handshake; a run makes a model call per turn and a worker runs many at
once. So clients are kept per ``(base URL, timeout)`` for the life of the process:
keep-alive connections are reused across turns, runs and threads, and HTTP/2 is used
where the server offers it over TLS (one connection carries many concurrent requests).
The pool allows `MAX_CONNECTIONS` connections, enough for 64 concurrent runs each with a
request in flight and a connection being replaced.

A plain ``http://`` server (a local vLLM or Ollama, the test provider) speaks HTTP/1.1
only, one request per connection at a time, so a busy worker keeps one connection per
slot. httpcore's own pool rescans every connection under its lock three times per
request (one ``poll`` system call per idle connection, and for each idle one a count of
all of them): with 64 connections that is about a millisecond of CPU per request. Such
clients get `PlainHTTPPool` instead, which takes and gives back a connection in
constant time.

A client holds no credentials: the API key goes in each request's headers, so two
models with different keys can share a connection pool. httpx is imported on first
use, so a ``keel`` command that never calls an HTTP model does not pay for it.
`close_shared_clients` closes them all (the harness calls it when it closes); a later
call opens a new one. A forked child never uses its parent's clients (their sockets are
shared with the parent): it opens its own.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    import httpcore
    import httpx

MAX_CONNECTIONS = 128
MAX_KEEPALIVE_CONNECTIONS = 64
KEEPALIVE_EXPIRY = 60.0  # seconds an idle connection is kept; below typical server limits


class _Pool:
    """The process's clients by ``(base URL, timeout)``, and the process they belong to."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.clients: dict[tuple[str, float], httpx.Client] = {}
        self.pid = os.getpid()

    def forget_parents_clients(self) -> None:
        """In a forked child, drop (without closing) the clients inherited from the
        parent: closing them would shut connections the parent still uses. Called under
        the lock."""
        pid = os.getpid()
        if pid != self.pid:
            self.clients.clear()
            self.pid = pid


_pool = _Pool()


def shared_client(base_url: str, timeout: float) -> httpx.Client:
    """The process's client for `base_url` with `timeout` seconds per network operation,
    opened on first use and again after it was closed."""
    key = (base_url.rstrip("/"), float(timeout))
    client = _pool.clients.get(key)
    if client is not None and not client.is_closed and _pool.pid == os.getpid():
        return client
    with _pool.lock:
        _pool.forget_parents_clients()
        client = _pool.clients.get(key)
        if client is None or client.is_closed:
            client = _open(key[0], timeout)
            _pool.clients[key] = client
        return client


def close_shared_clients() -> None:
    """Close every shared client of this process (idempotent). A request still in
    flight on another thread fails, and the adapter's retry opens a new client."""
    with _pool.lock:
        _pool.forget_parents_clients()
        clients = list(_pool.clients.values())
        _pool.clients.clear()
    for client in clients:
        client.close()


def _open(base_url: str, timeout: float) -> httpx.Client:
    if base_url.startswith("http://"):
        return plain_http_client(timeout)
    return _client(timeout, http2=True)  # HTTP/2 is offered only through TLS (ALPN)


def plain_http_client(
    timeout: float,
    *,
    max_connections: int = MAX_CONNECTIONS,
    max_idle: int = MAX_KEEPALIVE_CONNECTIONS,
    keepalive_expiry: float = KEEPALIVE_EXPIRY,
) -> httpx.Client:
    """A client for plain ``http://`` servers whose direct requests go through a
    `PlainHTTPPool` with these limits (`shared_client` uses the defaults)."""
    client = _client(
        timeout,
        http2=False,  # h2 is not even imported
        max_connections=max_connections,
        max_idle=max_idle,
        keepalive_expiry=keepalive_expiry,
    )
    _use_plain_pool(
        client,
        PlainHTTPPool(
            max_connections=max_connections, max_idle=max_idle, keepalive_expiry=keepalive_expiry
        ),
    )
    return client


def _client(
    timeout: float,
    *,
    http2: bool,
    max_connections: int = MAX_CONNECTIONS,
    max_idle: int = MAX_KEEPALIVE_CONNECTIONS,
    keepalive_expiry: float = KEEPALIVE_EXPIRY,
) -> httpx.Client:
    import httpx  # noqa: PLC0415 - imported on first use: it costs every `keel` start 0.15 s

    return httpx.Client(
        http2=http2,
        timeout=httpx.Timeout(timeout),
        limits=httpx.Limits(
            max_connections=max_connections,
            max_keepalive_connections=max_idle,
            keepalive_expiry=keepalive_expiry,
        ),
        headers={"User-Agent": "keel"},
        follow_redirects=False,
    )


def _use_plain_pool(client: httpx.Client, pool: PlainHTTPPool) -> None:
    """Give `client`'s direct transport `pool` (proxied requests, which go through other
    transports, keep httpcore's). An httpx that no longer keeps its pool where this
    looks keeps its own: slower, never wrong."""
    import httpcore  # noqa: PLC0415 - loaded with httpx
    import httpx  # noqa: PLC0415

    transport = getattr(client, "_transport", None)
    if isinstance(transport, httpx.HTTPTransport) and isinstance(
        getattr(transport, "_pool", None), httpcore.ConnectionPool
    ):
        transport._pool.close()  # it has no connection yet
        setattr(transport, "_pool", pool)  # noqa: B010 - a private attribute, typed otherwise


_OriginKey = tuple[bytes, bytes, int]


def _key(origin: httpcore.Origin) -> _OriginKey:
    """`origin` as a dictionary key (httpcore's ``Origin`` has no hash)."""
    return (origin.scheme, origin.host, origin.port)


class PlainHTTPPool:
    """HTTP/1.1 connections for plain ``http://``, shared by threads (httpcore's
    ``ConnectionPool`` interface: ``handle_request``, ``close``).

    A request takes the most recently used idle connection to its origin (checked once:
    not expired, not closed by the server) or opens a new one, and has it to itself
    until its response is closed. Closing the response gives the connection back when
    it is reusable (the body was read to its end, the server did not say
    ``Connection: close``), and closes it otherwise or when `max_idle` are idle already;
    giving one back also closes the idle ones of its origin that have outlived
    `keepalive_expiry` (most recently used first means the oldest are never taken, and
    a server drops them: they would linger half-closed). At most `max_connections` are
    open; a request beyond waits for one, up to the ``pool`` timeout
    (``httpcore.PoolTimeout``). `close` shuts every connection down, in use or not: a
    request in flight fails at once (a socket only closed, as httpcore's pool does,
    leaves its reader blocked until the answer or the read timeout) and later ones,
    and those waiting for a connection, are refused.
    """

    def __init__(self, *, max_connections: int, max_idle: int, keepalive_expiry: float) -> None:
        self._max_connections = max_connections
        self._max_idle = max_idle
        self._keepalive_expiry = keepalive_expiry
        self._changed = threading.Condition(threading.Lock())
        # Per origin, idle connections with when they were given back, oldest first.
        self._idle: dict[_OriginKey, deque[tuple[float, httpcore.HTTPConnection]]] = {}
        self._idle_count = 0
        self._open: dict[httpcore.HTTPConnection, _Dialer] = {}
        self._closed = False

    def handle_request(self, request: httpcore.Request) -> httpcore.Response:
        import httpcore  # noqa: PLC0415 - loaded with httpx

        origin = request.url.origin
        timeouts = request.extensions.get("timeout", {})
        while True:
            connection = self._take(origin, timeouts.get("pool"))
            try:
                response = connection.handle_request(request)
            except httpcore.ConnectionNotAvailable:
                self._discard(connection)  # taken by nobody else, so only when unusable
                continue
            except BaseException:
                self._discard(connection)
                raise
            return httpcore.Response(
                status=response.status,
                headers=response.headers,
                content=_ReturnedOnClose(response, self, _key(origin), connection),
                extensions=response.extensions,
            )

    def _take(self, origin: httpcore.Origin, timeout: float | None) -> httpcore.HTTPConnection:
        import httpcore  # noqa: PLC0415 - loaded with httpx

        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            stale: httpcore.HTTPConnection | None = None
            with self._changed:
                if self._closed:
                    raise RuntimeError("the connection pool is closed")
                idle = self._idle.get(_key(origin))
                if idle:
                    candidate = idle.pop()[1]
                    self._idle_count -= 1
                elif len(self._open) < self._max_connections:
                    dialer = _Dialer()
                    connection = httpcore.HTTPConnection(
                        origin=origin,
                        keepalive_expiry=self._keepalive_expiry,
                        network_backend=cast("httpcore.NetworkBackend", dialer),
                    )
                    self._open[connection] = dialer
                    return connection
                else:
                    candidate = None
                    stale = self._oldest_idle()
                    if stale is None:
                        left = None if deadline is None else deadline - time.monotonic()
                        if left is not None and left <= 0:
                            raise httpcore.PoolTimeout("no connection became free in time")
                        self._changed.wait(left)
            if candidate is not None:
                # A server may have closed it while idle: then it reads as readable
                # (one `poll`), and is replaced rather than failing the request.
                if candidate.is_idle() and not candidate.has_expired():
                    return candidate
                stale = candidate
            if stale is not None:
                self._discard(stale)

    def _oldest_idle(self) -> httpcore.HTTPConnection | None:
        """An idle connection to another origin, taken out to make room (under the lock)."""
        for idle in self._idle.values():
            if idle:
                self._idle_count -= 1
                return idle.popleft()[1]
        return None

    def give_back(self, origin: _OriginKey, connection: httpcore.HTTPConnection) -> None:
        """`connection`'s response was closed: keep it for reuse, or close it; close the
        connections to `origin` idle for longer than the keep-alive expiry."""
        now = time.monotonic()
        closing: list[httpcore.HTTPConnection] = []
        with self._changed:
            idle = self._idle.setdefault(origin, deque())
            while idle and now - idle[0][0] > self._keepalive_expiry:
                closing.append(idle.popleft()[1])
                self._idle_count -= 1
            if (
                not self._closed
                and connection in self._open
                and self._idle_count < self._max_idle
                and connection.is_idle()
            ):
                idle.append((now, connection))
                self._idle_count += 1
            else:
                closing.append(connection)
            for gone in closing:
                self._open.pop(gone, None)
            self._changed.notify(len(closing) + 1)  # each is room for a waiting request
        for gone in closing:
            gone.close()

    def _discard(self, connection: httpcore.HTTPConnection) -> None:
        with self._changed:
            self._open.pop(connection, None)
            self._changed.notify()
        connection.close()

    def close(self) -> None:
        with self._changed:
            self._closed = True
            connections = list(self._open.items())
            self._open.clear()
            self._idle.clear()
            self._idle_count = 0
            self._changed.notify_all()
        for connection, dialer in connections:
            dialer.shut_down()  # wakes a request blocked reading it (closing would not)
            connection.close()

    def __enter__(self) -> PlainHTTPPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Dialer:
    """One connection's network backend (httpcore's ``NetworkBackend``, for plain TCP):
    opens its socket and keeps it, so that `PlainHTTPPool.close` can shut it down.
    Closing a socket does not wake a thread blocked reading it; shutting it down does."""

    def __init__(self) -> None:
        self._stream: httpcore.NetworkStream | None = None
        self._shut = False

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        import httpcore  # noqa: PLC0415 - loaded with httpx

        stream = httpcore.SyncBackend().connect_tcp(
            host, port, timeout, local_address, socket_options
        )
        self._stream = stream
        if self._shut:  # the pool closed while this connected
            self.shut_down()
        return stream

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def shut_down(self) -> None:
        self._shut = True
        stream = self._stream
        sock = None if stream is None else stream.get_extra_info("socket")
        if isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):  # already closed
                sock.shutdown(socket.SHUT_RDWR)


class _ReturnedOnClose:
    """A response body whose connection goes back to the pool when it is closed."""

    def __init__(
        self,
        response: httpcore.Response,
        pool: PlainHTTPPool,
        origin: _OriginKey,
        connection: httpcore.HTTPConnection,
    ) -> None:
        self._stream = response.stream
        self._pool = pool
        self._origin = origin
        self._connection = connection
        self._closed = False

    def __iter__(self) -> Iterator[bytes]:
        # The connection's own stream closes itself (and so the connection) on an error.
        return iter(self._stream)  # type: ignore[arg-type]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            close = getattr(self._stream, "close", None)
            if close is not None:
                close()
        finally:
            self._pool.give_back(self._origin, self._connection)


__all__ = [
    "KEEPALIVE_EXPIRY",
    "MAX_CONNECTIONS",
    "MAX_KEEPALIVE_CONNECTIONS",
    "PlainHTTPPool",
    "close_shared_clients",
    "plain_http_client",
    "shared_client",
]
