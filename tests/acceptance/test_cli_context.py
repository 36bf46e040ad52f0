"""`keel run --context-tokens N --context-summary`: stored with the run, so every process
that drives it builds the same context; a size out of range is refused before anything
is stored, in one line naming the option."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from keel.cli.app import app
from keel.core.events import EventType
from keel.testing.cli import DONE, KeelWorkspace, call, expect, flat, one_line_error, turn

RANGE = "--context-tokens must be a whole number of tokens from 1000 to 100000000"


@pytest.fixture
def ws(tmp_path: Path) -> KeelWorkspace:
    return KeelWorkspace(tmp_path)


@pytest.mark.parametrize("value", ["0", "-5", "999", str(10**12)])
def test_a_context_size_out_of_range_exits_2_with_one_line_and_stores_nothing(
    ws: KeelWorkspace, value: str
) -> None:
    result = CliRunner().invoke(
        app,
        ["run", "fix it", "--model", ws.script(DONE), "--context-tokens", value],
        env={"KEEL_STORE": ws.url},
    )

    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [f"error: {RANGE}, got {value}"]
    assert not (ws.root / ".keel").exists()  # not even a store was opened


def test_a_context_size_that_is_not_a_number_is_refused_by_the_keel_command(
    ws: KeelWorkspace,
) -> None:
    done = ws.keel("run", "fix it", "--model", ws.script(DONE), "--context-tokens", "abc")

    assert done.returncode == 2 and "Traceback" not in done.stderr
    said = flat(done.stderr.replace("│", ""))
    assert "Invalid value for '--context-tokens': Input should be a valid integer" in said
    assert not (ws.root / ".keel").exists()
    huge = ws.keel("run", "fix it", "--model", ws.script(DONE), "--context-tokens", "10" * 8)
    assert one_line_error(huge) == f"error: {RANGE}, got {'10' * 8}"


def test_the_context_options_are_stored_with_the_run_and_used_by_it(ws: KeelWorkspace) -> None:
    (ws.root / "a.txt").write_text("hello\n" * 200, encoding="utf-8")
    reads = [turn(call("read_file", path="a.txt", offset=i * 10 + 1, limit=10)) for i in range(30)]
    model = ws.script(*reads, DONE)

    out = expect(
        ws.keel(
            "run", "read a.txt", "--model", model, "--max-steps", "40",
            "--context-tokens", "3000", "--context-summary", "--json",
        ),
        0,
    )  # fmt: skip

    run_id = json.loads(out.splitlines()[0])["run_id"]
    state = ws.state(run_id)
    assert state.options.context_tokens == 3000 and state.options.context_summary
    compacted = [e for e in ws.events(run_id) if e.type is EventType.CONTEXT_COMPACTED]
    assert compacted and all("summary" in e.data for e in compacted)
