"""Why a PostgreSQL connection attempt failed, in one line a person can act on.

libpq reports a failed connection as text (psycopg attaches no SQLSTATE to it), so
the failures a user can fix are recognised by libpq's wording: a refused port, a
host name that does not resolve, a missing database, a refused user or password, no
answer within ``connect_timeout``. Each becomes one line naming what failed (host and
port, host name, database, user) and what to do; mistakes in the URL are
``ConfigError``, an unreachable server ``StoreError``. Anything else keeps libpq's
first line. The password is never part of a message.
"""

from __future__ import annotations

import getpass
import os
import re
from dataclasses import dataclass
from typing import Any, Final

import psycopg
from psycopg.conninfo import conninfo_to_dict

from keel.core.errors import ConfigError, KeelError, StoreError

CONNECT_TIMEOUT_S: Final = 5  # libpq's connect_timeout unless the URL or PGCONNECT_TIMEOUT sets one

_MISSING_DATABASE = re.compile(r'database "(?P<name>[^"]*)" does not exist')
_MISSING_ROLE = re.compile(r'role "(?P<name>[^"]*)" does not exist')
_BAD_PASSWORD = re.compile(r'(password|\w+) authentication failed for user "(?P<name>[^"]*)"')
_NO_HBA_ENTRY = "no pg_hba.conf entry"
_NO_PASSWORD = "no password supplied"
_REFUSED = ("connection refused", "no such file or directory")  # TCP port, Unix socket
_UNKNOWN_HOST = ("failed to resolve host", "could not translate host name")
_TIMEOUT = "timeout expired"


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """Where a connection was headed, as libpq would resolve the URL's defaults."""

    host: str
    port: str
    user: str
    dbname: str
    timeout: str  # connect_timeout in seconds, as libpq was given it

    @classmethod
    def of(cls, conninfo: str) -> Target:
        try:
            params = conninfo_to_dict(conninfo)
        except psycopg.Error:
            params = {}
        user = str(params.get("user") or os.environ.get("PGUSER") or _os_user())
        return cls(
            host=str(params.get("host") or os.environ.get("PGHOST") or "localhost"),
            port=str(params.get("port") or os.environ.get("PGPORT") or "5432"),
            user=user,
            dbname=str(params.get("dbname") or os.environ.get("PGDATABASE") or user),
            timeout=str(
                params.get("connect_timeout")
                or os.environ.get("PGCONNECT_TIMEOUT")
                or CONNECT_TIMEOUT_S
            ),
        )

    @property
    def waited(self) -> str:
        """The timeout libpq applied: it waits at least 2 seconds."""
        try:
            return str(max(2, int(self.timeout)))
        except ValueError:
            return self.timeout

    @property
    def address(self) -> str:
        if self.host.startswith("/"):  # a Unix socket directory
            return f"{self.host}/.s.PGSQL.{self.port}"
        return f"{self.host}:{self.port}"


def connect_kwargs(conninfo: str) -> dict[str, Any]:
    """``connect_timeout`` for psycopg, unless the URL or the environment chose one."""
    try:
        chosen = "connect_timeout" in conninfo_to_dict(conninfo)
    except psycopg.Error:
        chosen = False
    if chosen or os.environ.get("PGCONNECT_TIMEOUT"):
        return {}
    return {"connect_timeout": CONNECT_TIMEOUT_S}


def connect_failure(conninfo: str, location: str, exc: psycopg.Error) -> KeelError:
    """The one-line error for a failed connection to ``conninfo`` (``location``: the
    URL with its password hidden, for the fallback message)."""
    text = str(exc)
    lowered = text.lower()
    to = Target.of(conninfo)
    if any(marker in lowered for marker in _UNKNOWN_HOST):
        return ConfigError(
            f"cannot connect to PostgreSQL: unknown host {to.host!r} (the name does not "
            f"resolve); check the host in the store URL {location}"
        )
    if any(marker in lowered for marker in _REFUSED):
        where = "with its socket there" if to.host.startswith("/") else f"on port {to.port}"
        return StoreError(
            f"cannot connect to PostgreSQL at {to.address}: connection refused; is the "
            f"server running and listening {where}?"
        )
    if _TIMEOUT in lowered:
        return StoreError(
            f"cannot connect to PostgreSQL at {to.address}: no answer within {to.waited} s; "
            "is the host reachable and the port right? (?connect_timeout=S in the store "
            "URL waits longer)"
        )
    if match := _MISSING_DATABASE.search(text):
        name = match["name"]
        return ConfigError(
            f'PostgreSQL at {to.address} has no database "{name}"; create it with '
            f"`createdb -h {to.host} -p {to.port} -U {to.user} {name}` "
            f'(or CREATE DATABASE "{name}"), or name an existing one in the store URL'
        )
    if match := _BAD_PASSWORD.search(text):
        return ConfigError(
            f'PostgreSQL at {to.address} refused user "{match["name"]}": authentication '
            "failed; check the user and password in the store URL (or PGPASSWORD, ~/.pgpass)"
        )
    if match := _MISSING_ROLE.search(text):
        return ConfigError(
            f'PostgreSQL at {to.address} has no user (role) "{match["name"]}"; use an '
            f"existing user in the store URL, or create it (`createuser -h {to.host} "
            f"-p {to.port} {match['name']}`)"
        )
    if _NO_HBA_ENTRY in lowered:
        return ConfigError(
            f'PostgreSQL at {to.address} does not accept user "{to.user}" for database '
            f'"{to.dbname}" from this host (no pg_hba.conf entry); ask its administrator'
        )
    if _NO_PASSWORD in lowered:
        return ConfigError(
            f'PostgreSQL at {to.address} wants a password for user "{to.user}"; put it in '
            "the store URL (postgresql://USER:PASSWORD@HOST/DB) or in PGPASSWORD"
        )
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(exc).__name__)
    return StoreError(f"cannot connect to PostgreSQL at {location}: {first}")


def _os_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "postgres"
