"""What `keel … --json` prints is strict JSON (RFC 8259) whatever a stored value holds."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any

import pytest

from keel.cli.common import json_line


def strict_loads(text: str) -> Any:
    """json.loads that refuses NaN and Infinity, as every other JSON parser does."""

    def refuse(literal: str) -> Any:
        raise ValueError(f"not JSON: {literal}")

    return json.loads(text, parse_constant=refuse)


def test_nan_and_infinities_from_an_old_log_are_printed_as_null() -> None:
    value = {"cost": math.nan, "usage": [math.inf, -math.inf, 1.5], "ok": True}

    text = json_line(value)

    assert strict_loads(text) == {"cost": None, "usage": [None, None, 1.5], "ok": True}
    assert "\n" not in text


def test_a_lone_surrogate_is_escaped_rather_than_breaking_the_output() -> None:
    text = json_line({"name": "bad\udcffname"})

    text.encode("utf-8")  # printable on any UTF-8 terminal or pipe
    assert strict_loads(text) == {"name": "bad\udcffname"}


@pytest.mark.parametrize(
    "value", [{"a": "é"}, [1, 2.5, None], "text", {"when": datetime(2025, 1, 1, tzinfo=UTC)}]
)
def test_ordinary_values_print_as_before(value: Any) -> None:
    assert strict_loads(json_line(value)) == json.loads(json.dumps(value, default=str))
