"""The hash chain's rules, without a store: what is hashed, and what ``ChainCheck`` names."""

from __future__ import annotations

import hashlib
import json
import time
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from keel.core.chain import (
    GENESIS_TAG,
    ChainCheck,
    chain_time,
    event_hash,
    genesis,
    plain,
    plain_event_hash,
)
from keel.core.errors import LogDamaged, StoreError

RUN = "run_0123456789ab"
AT = "2026-12-01T02:11:54.000123+00:00"


def row(seq: int, prev: str, data: str = '{"n":1}') -> tuple[int, str, str, str, str, str]:
    event_id = f"{seq:032x}"
    return (
        seq,
        event_id,
        "note_added",
        AT,
        data,
        event_hash(prev, RUN, seq, event_id, "note_added", AT, data),
    )


def log(n: int) -> list[tuple[int, str, str, str, str, str]]:
    rows, prev = [], genesis(RUN)
    for seq in range(1, n + 1):
        rows.append(row(seq, prev))
        prev = rows[-1][5]
    return rows


def test_the_hash_is_sha256_of_prev_header_and_data_as_documented() -> None:
    header = json.dumps([RUN, 7, "e" * 32, "tool_finished", AT], separators=(",", ":"))
    data = '{"result":"ok ✓"}'
    expected = hashlib.sha256(f"{'a' * 64}\n{header}\n{data}".encode()).hexdigest()
    assert event_hash("a" * 64, RUN, 7, "e" * 32, "tool_finished", AT, data) == expected
    assert genesis(RUN) == hashlib.sha256(f"keel event chain v1\n{RUN}".encode()).hexdigest()


@given(st.text(), st.text(), st.text())
def test_fields_that_need_escaping_hash_their_canonical_json(
    event_id: str, kind: str, at: str
) -> None:
    header = json.dumps([RUN, 3, event_id, kind, at], separators=(",", ":"), ensure_ascii=False)
    text = f"{'0' * 64}\n{header}\n{{}}"
    expected = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    assert event_hash("0" * 64, RUN, 3, event_id, kind, at, "{}") == expected


PLAIN = st.text(st.characters(blacklist_characters='"\\', min_codepoint=0x20, max_codepoint=0xFFFF))


@given(PLAIN, PLAIN, PLAIN, st.integers(min_value=1))
def test_a_writers_plain_fields_hash_as_the_checked_path_does(
    event_id: str, kind: str, at: str, seq: int
) -> None:
    assert plain(event_id + kind + at)
    assert plain_event_hash("1" * 64, RUN, seq, event_id, kind, at, "{}") == event_hash(
        "1" * 64, RUN, seq, event_id, kind, at, "{}"
    )
    assert not plain('a"b') and not plain("a\\b") and not plain("a\nb")


def test_moving_text_between_fields_changes_the_hash() -> None:
    one = event_hash("0" * 64, RUN, 3, 'a","b', "c", AT, "{}")
    two = event_hash("0" * 64, RUN, 3, "a", 'b","c', AT, "{}")
    assert one != two


def test_chain_time_is_fixed_width_utc_with_microseconds() -> None:
    moment = datetime(2026, 12, 1, 3, 11, 54, tzinfo=timezone(timedelta(hours=1)))
    assert chain_time(moment) == "2026-12-01T02:11:54.000000+00:00"
    assert (
        chain_time(datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC))
        == "2026-01-02T03:04:05.000006+00:00"
    )


def test_an_intact_log_checks_out_to_its_head() -> None:
    rows = log(5)
    check = ChainCheck(RUN, head_seq=5, expect=(3, rows[2][5]))
    for r in rows:
        check.row(*r)
    check.end(rows[-1][5])
    assert (check.seq, check.hash) == (5, rows[-1][5])


def damage(
    rows: list[tuple[int, str, str, str, str, str]],
    head_seq: int,
    head_hash: str | None,
    **kw: object,
) -> LogDamaged:
    check = ChainCheck(RUN, head_seq=head_seq, **kw)  # type: ignore[arg-type]
    with pytest.raises(LogDamaged) as err:
        for r in rows:
            check.row(*r)
        check.end(head_hash)
    assert isinstance(err.value, StoreError) and err.value.run_id == RUN
    assert str(err.value).startswith(f"event log of {RUN} damaged at seq {err.value.seq}: ")
    return err.value


def test_each_kind_of_damage_is_named_at_its_first_bad_event() -> None:
    rows = log(6)
    head = rows[-1][5]
    missing = damage([r for r in rows if r[0] != 3], 6, head)
    assert (missing.seq, missing.detail) == (3, "missing (the next stored event is seq 4)")
    last_missing = damage(rows[:-1], 6, head)
    assert (last_missing.seq, last_missing.detail) == (6, "missing (the run's last event is seq 6)")
    beyond = damage([*rows, row(7, head)], 6, head)
    assert beyond.seq == 7 and beyond.detail.startswith("not appended by Keel")
    changed = list(rows)
    changed[3] = (*rows[3][:4], '{"n":2}', rows[3][5])
    assert damage(changed, 6, head).seq == 4
    no_hash = list(rows)
    no_hash[1] = (*rows[1][:5], None)  # type: ignore[assignment]
    assert (damage(no_hash, 6, head).seq, damage(no_hash, 6, head).detail) == (2, "it has no hash")
    assert (
        damage(rows, 6, "f" * 64).detail
        == "the run's recorded chain head does not match this event"
    )
    snapshot = damage(rows, 6, head, expect=(4, "f" * 64))
    assert (snapshot.seq, snapshot.detail) == (4, "the run's snapshot does not match this event")


def test_a_check_can_start_after_a_trusted_event() -> None:
    rows = log(6)
    check = ChainCheck(RUN, head_seq=6, after=3, prev=rows[2][5])
    for r in rows[3:]:
        check.row(*r)
    check.end(rows[-1][5])
    with pytest.raises(LogDamaged) as err:
        ChainCheck(RUN, head_seq=6, after=3, prev="0" * 64).row(*rows[3])
    assert err.value.seq == 4


def test_a_gap_past_the_runs_head_is_named_at_the_stray_event() -> None:
    rows = log(6)
    stray = damage([*rows, row(8, rows[-1][5])], 6, rows[-1][5])
    assert (stray.seq, stray.detail) == (
        8,
        "not appended by Keel (the run's last event is seq 6)",
    )
    gap = damage([*rows[:5], row(7, rows[4][5])], 6, rows[-1][5])
    assert (gap.seq, gap.detail) == (6, "missing (the next stored event is seq 7)")


def test_changed_content_is_named_as_such() -> None:
    rows = log(3)
    changed = [rows[0], (*rows[1][:4], '{"n":9}', rows[1][5]), rows[2]]
    assert damage(changed, 3, rows[-1][5]).detail == (
        "its content does not match its hash (changed after it was written)"
    )


def test_a_run_id_with_a_lone_surrogate_still_has_a_genesis() -> None:
    run_id = "run_\ud800"
    assert (
        genesis(run_id)
        == hashlib.sha256((GENESIS_TAG + run_id).encode("utf-8", "surrogatepass")).hexdigest()
    )


def test_chain_time_is_utc_whatever_the_local_time_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        moment = datetime(2026, 12, 1, 11, 11, 54, 123, tzinfo=timezone(timedelta(hours=9)))
        assert chain_time(moment) == "2026-12-01T02:11:54.000123+00:00"
    finally:
        monkeypatch.undo()
        time.tzset()
