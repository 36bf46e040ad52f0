"""The page cursor and the token rules both stores share (``keel.store.service``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from keel.core.errors import UsageError
from keel.store.service import (
    PAGE_MAX,
    check_token_hash,
    check_token_name,
    clamp_limit,
    decode_cursor,
    encode_cursor,
)


def test_a_cursor_round_trips_to_utc_microseconds() -> None:
    at = datetime(2026, 3, 4, 5, 6, 7, 890123, tzinfo=timezone(timedelta(hours=2)))
    cursor = encode_cursor(at, "run_0123456789ab")
    assert "=" not in cursor and "+" not in cursor and "/" not in cursor
    back, run_id = decode_cursor(cursor)
    assert back == at and back.tzinfo is UTC and run_id == "run_0123456789ab"


def test_a_naive_time_is_taken_as_utc() -> None:
    back, _ = decode_cursor(encode_cursor(datetime(2026, 1, 1), "run_1"))
    assert back == datetime(2026, 1, 1, tzinfo=UTC)


def test_a_tampered_cursor_is_refused() -> None:
    cursor = encode_cursor(datetime.now(UTC), "run_0123456789ab")
    with pytest.raises(UsageError, match=r"^invalid cursor: "):
        decode_cursor(cursor[:-3] + "!!!")


@pytest.mark.parametrize(("asked", "used"), [(-1, 1), (0, 1), (1, 1), (50, 50), (501, PAGE_MAX)])
def test_limits_are_clamped(asked: int, used: int) -> None:
    assert clamp_limit(asked) == used


def test_token_rules() -> None:
    assert check_token_name("a.b@c-d_e") == "a.b@c-d_e"
    with pytest.raises(UsageError, match="invalid token name 'a b'"):
        check_token_name("a b")
    with pytest.raises(UsageError, match="never the token itself"):
        check_token_hash("keel_" + "a" * 43)
    assert check_token_hash("ab" * 32) == "ab" * 32
