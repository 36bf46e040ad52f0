"""What both stores share for the service additions: the API token name rule, the
stored-hash check, and the opaque cursor of ``Store.page_runs``.

Pure: no SQL here (each dialect keeps its statements in its ``.sql`` files).

A cursor is the URL-safe base64 (unpadded) of ``"<created_at ISO-8601 UTC>|<run id>"``:
the sort key of the last run of a page. The next page holds the runs strictly after
that key in the order (created_at DESC, id DESC), so a run is never shown twice nor
skipped, whatever is created between two fetches (new runs sort first).
"""

from __future__ import annotations

import base64
import binascii
import re
from datetime import UTC, datetime
from typing import Final

from keel.core.errors import UsageError
from keel.core.status import RunStatus

TOKEN_NAME: Final = re.compile(r"[A-Za-z0-9_.@-]{1,64}")
TOKEN_HASH: Final = re.compile(r"[0-9a-f]{64}")
PAGE_MIN: Final = 1
PAGE_MAX: Final = 500
_CURSOR_ID: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
_CURSOR_MAX: Final = 200  # characters; a real cursor is well under 100


def check_token_name(name: str) -> str:
    """``name`` if it follows the rule, else ``UsageError`` stating the rule."""
    if not isinstance(name, str) or TOKEN_NAME.fullmatch(name) is None:
        raise UsageError(
            f"invalid token name {name!r}: use 1 to 64 characters from "
            "A-Z a-z 0-9 _ . @ - (e.g. ci-bot or alice@laptop)"
        )
    return name


def check_token_hash(token_hash: str) -> str:
    """``token_hash`` if it is a SHA-256 hex digest, else ``UsageError`` (the store keeps
    digests only: a token passed here by mistake is refused, not stored)."""
    if not isinstance(token_hash, str) or TOKEN_HASH.fullmatch(token_hash) is None:
        raise UsageError(
            "token_hash must be the token's SHA-256 as 64 lowercase hex characters "
            "(keel.runtime.api_tokens.hash_token), never the token itself"
        )
    return token_hash


def clamp_limit(limit: int) -> int:
    """``limit`` held to ``PAGE_MIN..PAGE_MAX``."""
    return max(PAGE_MIN, min(PAGE_MAX, int(limit)))


def page_filters(
    *,
    status: RunStatus | None,
    parent_id: str | None,
    creator: str | None,
    before: str | None,
    top_level: bool,
) -> list[str]:
    """The names of the filter fragments a ``page_runs`` query needs (each dialect's
    ``service.sql`` defines ``page_if_*``). ``parent_id`` with ``top_level`` is a
    contradiction, refused with ``UsageError`` rather than answered with nothing."""
    if parent_id is not None and top_level:
        raise UsageError(
            "page_runs: parent_id and top_level=True exclude each other "
            "(top-level runs have no parent); give one of them"
        )
    names: list[str] = []
    if status is not None:
        names.append("page_if_status")
    if parent_id is not None:
        names.append("page_if_parent")
    if creator is not None:
        names.append("page_if_creator")
    if top_level:
        names.append("page_if_top_level")
    if before is not None:
        names.append("page_if_before")
    return names


def encode_cursor(created_at: datetime, run_id: str) -> str:
    """The opaque cursor naming the run ``(created_at, run_id)`` as a page's last."""
    if created_at.tzinfo is None:
        created_at = created_at.replace(tzinfo=UTC)
    key = f"{created_at.astimezone(UTC).isoformat(timespec='microseconds')}|{run_id}"
    return base64.urlsafe_b64encode(key.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """``(created_at in UTC, run id)`` from a cursor ``encode_cursor`` made; anything
    else raises ``UsageError`` ("invalid cursor: ...")."""
    if not isinstance(cursor, str) or not cursor or len(cursor) > _CURSOR_MAX:
        raise UsageError(f"invalid cursor: {cursor!r} is not a cursor a page of runs returned")
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        text = base64.b64decode(padded.encode("ascii"), altchars=b"-_", validate=True).decode()
        at_text, run_id = text.split("|")
        created_at = datetime.fromisoformat(at_text)
    except (ValueError, UnicodeError, binascii.Error):
        raise UsageError(
            f"invalid cursor: {cursor!r} is not a cursor a page of runs returned"
        ) from None
    if created_at.tzinfo is None or _CURSOR_ID.fullmatch(run_id) is None:
        raise UsageError(f"invalid cursor: {cursor!r} is not a cursor a page of runs returned")
    return created_at.astimezone(UTC), run_id


def all_statuses(counts: dict[str, int]) -> dict[RunStatus, int]:
    """Per-status counts with every ``RunStatus`` present (zeros included)."""
    return {status: int(counts.get(status.value, 0)) for status in RunStatus}
