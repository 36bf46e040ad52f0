"""A PostgreSQL server shared by many worker processes on many hosts.

Connections come from a ``psycopg_pool.ConnectionPool`` in autocommit mode: most
store operations are one statement (a CTE or a server-side function), so one
round trip is one transaction. Blocks that need several statements use
``transaction()``. Every session runs with ``TimeZone=UTC`` so timestamps come
back as UTC datetimes. A deadlock or serialization failure of a single statement
is retried (nothing was written); any other server error becomes a ``StoreError``
naming the server without its password.

Opening fails fast and says why: one direct connection is tried first, with libpq's
``connect_timeout`` (5 s unless the URL sets one), and its failure — refused port,
unknown host, missing database, refused user — becomes one line
(``keel.store.postgres.connect_errors``) instead of the pool retrying in the
background until its timeout.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Final, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit

import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import ConnectionPool, PoolTimeout

from keel.core.errors import ConfigError, KeelError, StoreError
from keel.store.postgres.connect_errors import connect_failure, connect_kwargs

T = TypeVar("T")
RETRIES: Final = 5
POOL_MAX: Final = 8
APPLICATION_NAME: Final = "keel"
SYNCHRONOUS_COMMIT: Final = ("on", "off", "local", "remote_write", "remote_apply")
_RETRYABLE = (pg_errors.DeadlockDetected, pg_errors.SerializationFailure)


def redacted(url: str) -> str:
    """The URL without its password, for messages."""
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(":" + parts.password + "@", ":***@")
        return parts._replace(netloc=netloc).geturl()
    return url


def session_settings(url: str) -> tuple[str, str]:
    """``(libpq URL, options)``: Keel's own ``synchronous_commit`` query parameter is
    taken out of the URL and becomes a session setting next to ``TimeZone=UTC``.

    ``?synchronous_commit=off`` trades the last fraction of a second of commits on a
    *server* crash for not waiting on fsync at each commit (PostgreSQL never corrupts
    or half-applies a transaction either way); the default is ``on``.
    """
    parts = urlsplit(url)
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    kept = [(k, v) for k, v in pairs if k != "synchronous_commit"]
    mode = next((v for k, v in reversed(pairs) if k == "synchronous_commit"), "on").lower()
    if mode not in SYNCHRONOUS_COMMIT:
        raise ConfigError(
            f"store URL {redacted(url)}: synchronous_commit must be one of "
            + ", ".join(SYNCHRONOUS_COMMIT)
        )
    options = f"-c TimeZone=UTC -c synchronous_commit={mode}"
    if len(kept) == len(pairs):
        return url, options  # nothing of Keel's to take out: libpq reads it as written
    # Built by hand: urlunsplit drops the "//" of an empty host (postgresql:///db?host=…).
    query = f"?{urlencode(kept)}" if kept else ""
    fragment = f"#{parts.fragment}" if parts.fragment else ""
    return f"{parts.scheme}://{parts.netloc}{parts.path}{query}{fragment}", options


def connect(url: str, *, application_name: str = APPLICATION_NAME) -> psycopg.Connection[Any]:
    """One autocommit UTC session outside the pool (the listener, migrations, tests).

    A failure raises the one-line ``ConfigError``/``StoreError`` saying what failed."""
    conninfo, options = session_settings(url)
    return _connect_once(
        conninfo,
        redacted(url),
        {
            "autocommit": True,
            "options": options,
            "application_name": application_name,
            **connect_kwargs(conninfo),
        },
    )


def _connect_once(conninfo: str, location: str, kwargs: dict[str, Any]) -> psycopg.Connection[Any]:
    try:
        return psycopg.connect(conninfo, **kwargs)
    except psycopg.Error as exc:
        raise connect_failure(conninfo, location, exc) from exc


class Database:
    """A pool of sessions on one PostgreSQL database."""

    def __init__(self, url: str, *, max_size: int = POOL_MAX, timeout: float = 30.0) -> None:
        self.url = url
        self.location = redacted(url)
        self._closed = False
        conninfo, options = session_settings(url)
        kwargs: dict[str, Any] = {
            "autocommit": True,
            "options": options,
            "application_name": APPLICATION_NAME,
            **connect_kwargs(conninfo),
        }
        # Fail fast with the reason: the pool would only retry in the background and
        # report "pool initialization incomplete" after its whole timeout.
        _connect_once(conninfo, self.location, kwargs).close()
        self.pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            conninfo,
            min_size=1,
            max_size=max_size,
            timeout=timeout,
            kwargs=kwargs,
            name="keel",
            open=False,
        )
        try:
            self.pool.open(wait=True, timeout=timeout)
        except (psycopg.Error, PoolTimeout) as exc:
            self.pool.close()
            raise StoreError(f"cannot connect to PostgreSQL at {self.location}: {exc}") from exc

    def translate(self, exc: psycopg.Error) -> StoreError:
        return StoreError(f"PostgreSQL at {self.location}: {exc}")

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled autocommit session; server errors become StoreError."""
        if self._closed:
            raise StoreError(f"the store at {self.location} is closed")
        try:
            with self.pool.connection() as conn:
                yield conn
        except KeelError:
            raise
        except PoolTimeout as exc:
            raise StoreError(f"no free connection to PostgreSQL at {self.location}: {exc}") from exc
        except psycopg.Error as exc:
            raise self.translate(exc) from exc

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled session inside one transaction: committed on success, else rolled back."""
        with self.connection() as conn, conn.transaction():
            yield conn

    def run(self, action: Callable[[psycopg.Connection[Any]], T]) -> T:
        """``action(conn)`` on a pooled session, retried after a deadlock or serialization
        failure (the failed attempt wrote nothing)."""
        for attempt in range(RETRIES):
            try:
                with self.connection() as conn:
                    return action(conn)
            except StoreError as exc:
                if not isinstance(exc.__cause__, _RETRYABLE) or attempt == RETRIES - 1:
                    raise
                time.sleep(0.005 * (attempt + 1))
        raise AssertionError("unreachable")  # pragma: no cover

    def close(self) -> None:
        self._closed = True
        self.pool.close()
