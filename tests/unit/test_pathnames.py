"""File names shown and spelled back: one valid spelling per name, and it round-trips."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from keel.core.errors import ToolError
from keel.core.pathnames import (
    NAME_MAX,
    PATH_MAX,
    check_length,
    os_name,
    shown_path,
    spelled_path,
)
from keel.core.text import valid_data, valid_text

name_bytes = st.binary(min_size=1, max_size=40).filter(lambda b: b"/" not in b and b"\0" not in b)


@given(st.lists(name_bytes, min_size=1, max_size=4))
def test_every_name_is_shown_as_valid_text_and_spelled_back_to_itself(parts: list[bytes]) -> None:
    raw = os.fsdecode(b"/".join(parts))
    shown = shown_path(raw)
    shown.encode("utf-8")  # valid text: no lone surrogate
    assert not any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in shown)
    assert spelled_path(shown) == raw


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        (os.fsdecode(b"bad\xffname"), "bad\\xffname"),
        ("new\nline", "new\\x0aline"),
        ("a\\xffb", "a\\x5cxffb"),  # a real backslash that would read as an escape
        ("a\\b", "a\\b"),
        ("données", "données"),
    ],
)
def test_how_names_are_shown(raw: str, shown: str) -> None:
    assert shown_path(raw) == shown


@pytest.mark.parametrize(
    ("spelled", "message"),
    [
        ("a\x00b", "contains a NUL character"),
        ("a\\x00b", "contains a NUL character"),
        ("a\ud800", "lone surrogate (U+D800) at character 1"),
        ("a\tb", "control character U+0009; write it as \\x09"),
        ("donn\\xc3\\xa9es", "write 'données'"),  # one spelling per name: rules stay whole
        ("a\\x5cb", "write 'a\\\\b'"),
        ("x" * (NAME_MAX + 1), f"'{'x' * 59}…' of {NAME_MAX + 1} bytes; a file name has at most"),
        ("d/" + "é" * 128, "has a component"),
        ("a/" * 2048, "a path has at most 4095 bytes"),
    ],
)
def test_spellings_no_file_can_have_are_refused_with_what_to_write(
    spelled: str, message: str
) -> None:
    with pytest.raises(ToolError) as caught:
        spelled_path(spelled)
    assert message in str(caught.value)


def test_upper_case_escapes_and_literal_lookalikes_are_accepted() -> None:
    assert spelled_path("bad\\xFFname") == os.fsdecode(b"bad\xffname")
    assert spelled_path("x\\x41") == "x\\x41"  # not a byte escape: the four characters


def test_text_is_made_valid_and_pairs_are_joined() -> None:
    assert valid_text("a\ud800b") == ("a\ufffdb", 1)
    assert valid_text("\ud83d\ude00") == ("\U0001f600", 0)
    data = {"k\udcff": ["ok", ("x\ud800",)], "n": 1}
    assert valid_data(data) == {"k\ufffd": ["ok", ("x\ufffd",)], "n": 1}
    clean = {"a": [1, "b"]}
    assert valid_data(clean) is clean


# --- the words of each refusal and the edges of the limits ---------------------------------


def test_delete_is_shown_escaped_like_the_other_control_characters() -> None:
    assert shown_path("a\x7fb\x80c") == "a\\x7fb\x80c"


def test_a_refusal_names_what_was_spelled() -> None:
    with pytest.raises(
        ToolError, match=r"^path 'a\\x00b' contains a NUL character; file names cannot$"
    ):
        spelled_path("a\x00b")
    with pytest.raises(ToolError) as err:
        spelled_path("bad\udcffname")
    assert str(err.value) == (
        "path 'bad\\udcffname' contains a lone surrogate (U+DCFF) at character 3, which is not "
        "text; a byte of a name that is not UTF-8 is written \\xHH, as list_dir shows it"
    )


def test_a_long_component_is_refused_naming_what_it_is_part_of() -> None:
    with pytest.raises(ToolError) as err:
        spelled_path("a" * 256, what="file")
    assert str(err.value) == (
        f"file {'a' * 59 + '…'!r} of 256 bytes; a file name has at most {NAME_MAX} bytes"
    )
    with pytest.raises(ToolError) as err:
        check_length("d/" + "a" * 256, shown="s" * 60)
    assert str(err.value) == (
        f"path {'s' * 60!r} has a component {'a' * 59 + '…'!r} of 256 bytes; a file name has "
        f"at most {NAME_MAX} bytes"
    )


def test_a_name_and_a_path_exactly_at_their_limits_are_accepted() -> None:
    check_length("a" * NAME_MAX, shown="x")
    at_most = "/".join(["a" * 200] * 21)[:PATH_MAX]
    assert len(at_most) == PATH_MAX
    check_length(at_most, shown="x")
    with pytest.raises(ToolError, match=rf"^path 'x' is {PATH_MAX + 1} bytes long; a path has "):
        check_length("/".join(["a" * 200] * 21)[: PATH_MAX + 1], shown="x")


def test_a_path_too_long_to_open_still_names_its_file_for_resolving() -> None:
    assert os_name("\\xff" + "a" * 300) == "\udcff" + "a" * 300


def test_an_escape_of_a_plain_letter_is_kept_as_written_in_any_case() -> None:
    assert spelled_path("a\\x4Ab") == "a\\x4Ab"
