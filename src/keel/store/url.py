"""Open a store from its URL: ``sqlite:///PATH`` (default) or ``postgresql://…``.

``sqlite:///rel/path`` is relative to the working directory and
``sqlite:////abs/path`` is absolute; ``?synchronous=full`` selects fsync at every
commit (see ``keel.store.sqlite.connection``). PostgreSQL needs the extra:
``pip install 'keel[postgres]'``.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import cast
from urllib.parse import parse_qs, urlsplit

from keel.core.errors import ConfigError, StoreError
from keel.store.base import Store
from keel.store.sqlite.store import SQLiteStore

DEFAULT_URL = "sqlite:///.keel/keel.db"
SQLITE_PREFIX = "sqlite:///"


def sqlite_location(url: str) -> tuple[Path, str] | None:
    """``(path, synchronous)`` for a ``sqlite:///`` URL, None for any other scheme."""
    if not url.startswith(SQLITE_PREFIX):
        return None
    rest = url[len(SQLITE_PREFIX) :]
    path_text, _, query = rest.partition("?")
    if not path_text:
        raise ConfigError(f"store URL {url!r} names no file; use sqlite:///PATH")
    options = parse_qs(query, keep_blank_values=True)
    unknown = sorted(set(options) - {"synchronous"})
    if unknown:
        raise ConfigError(f"store URL {url!r}: unknown option {', '.join(unknown)}")
    synchronous = options.get("synchronous", ["normal"])[-1].lower()
    if synchronous not in ("normal", "full"):
        raise ConfigError(f"store URL {url!r}: synchronous must be normal or full")
    return Path(path_text).expanduser().absolute(), synchronous


def open_store(url: str | None, *, must_exist: bool = False) -> Store:
    """The store named by ``url`` (None means the default under the working directory).

    With ``must_exist`` a SQLite file that does not exist yet is an error rather than
    a new empty database (for commands that only read).
    """
    url = url or DEFAULT_URL
    location = sqlite_location(url)
    if location is not None:
        path, synchronous = location
        if must_exist and not path.exists():
            raise StoreError(f"no Keel store exists at {path}; `keel run` creates one")
        return SQLiteStore(path, synchronous=synchronous)
    scheme = urlsplit(url).scheme
    if scheme in ("postgresql", "postgres"):
        try:
            module = importlib.import_module("keel.store.postgres.store")
        except ImportError as exc:
            raise ConfigError(
                f"store URL {_redacted(url)} needs PostgreSQL support: "
                f"pip install 'keel[postgres]' ({exc})"
            ) from exc
        return cast(Store, module.PostgresStore(url))
    raise ConfigError(f"unknown store URL {_redacted(url)!r}; use sqlite:///PATH or postgresql://…")


def _redacted(url: str) -> str:
    """The URL without its password, for messages."""
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(":" + parts.password + "@", ":***@")
        return parts._replace(netloc=netloc).geturl()
    return url
