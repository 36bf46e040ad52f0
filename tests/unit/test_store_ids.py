"""The ids a store makes (keel.store.step): time-ordered UUIDv7 event ids, short random
run ids, content-addressed artifact ids."""

from __future__ import annotations

import hashlib
import re
import time
import uuid

from keel.store.step import artifact_id, new_event_id, new_run_id


def test_an_event_id_is_a_uuid7_carrying_the_millisecond_it_was_made() -> None:
    before = time.time_ns() // 1_000_000
    ids = [new_event_id() for _ in range(64)]
    after = time.time_ns() // 1_000_000
    for text in ids:
        assert re.fullmatch(r"[0-9a-f]{32}", text)
        value = uuid.UUID(hex=text)
        assert (value.version, value.variant) == (7, uuid.RFC_4122)
        assert before <= value.int >> 80 <= after
    assert len(set(ids)) == len(ids)


def test_the_random_bits_of_event_ids_vary_in_every_position() -> None:
    """Over 64 ids each of the 74 random bits (12 after the time, 62 after the variant)
    is seen both set and clear: none is fixed by the layout."""
    values = [int(new_event_id(), 16) for _ in range(64)]
    random_bits = [*range(64, 76), *range(62)]
    for bit in random_bits:
        seen = {(v >> bit) & 1 for v in values}
        assert seen == {0, 1}, f"bit {bit} is always {seen}"


def test_event_ids_made_in_later_milliseconds_sort_later() -> None:
    first = new_event_id()
    time.sleep(0.002)
    second = new_event_id()
    assert first < second


def test_a_run_id_is_run_and_twelve_random_hex_digits() -> None:
    ids = {new_run_id() for _ in range(32)}
    assert len(ids) == 32
    assert all(re.fullmatch(r"run_[0-9a-f]{12}", i) for i in ids)


def test_an_artifact_id_is_the_first_32_hex_digits_of_its_sha256() -> None:
    content = b"pytest -q: 3 passed"
    assert artifact_id(content) == "art_" + hashlib.sha256(content).hexdigest()[:32]
    assert artifact_id(content) == artifact_id(bytes(content))
    assert artifact_id(content) != artifact_id(content + b"\n")
