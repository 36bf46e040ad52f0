"""`keel run` checks its options before anything is stored: one line naming the option
and its accepted range, exit 2. The same holds for the workspace's configuration, the
prices and a scripted model's costs."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from keel.cli.app import app
from keel.core.status import RunStatus
from keel.store.url import open_store
from keel.testing.cli import DONE, KeelWorkspace, call, expect, flat, one_line_error, turn


@pytest.fixture
def ws(tmp_path: Path) -> KeelWorkspace:
    return KeelWorkspace(tmp_path)


def runs_stored(ws: KeelWorkspace) -> int:
    if not (ws.root / ".keel" / "keel.db").exists():
        return 0
    store = open_store(ws.url)
    try:
        return len(store.list_runs())
    finally:
        store.close()


SECONDS = "must be a number of seconds above 0 and at most 1000000000"
COUNT = "must be a whole number from 1 to 1000000000000"
USD = "must be a finite number above 0 (USD)"


@pytest.mark.parametrize(
    ("option", "value", "expected"),
    [
        ("--timeout", "-5", f"--timeout {SECONDS}, got -5.0"),
        ("--timeout", "0", f"--timeout {SECONDS}, got 0.0"),
        ("--timeout", "nan", f"--timeout {SECONDS}, got nan"),
        ("--timeout", "inf", f"--timeout {SECONDS}, got inf"),
        ("--approval-timeout", "0", f"--approval-timeout {SECONDS}, got 0.0"),
        ("--approval-timeout", "NaN", f"--approval-timeout {SECONDS}, got nan"),
        ("--approval-timeout", "1e308", f"--approval-timeout {SECONDS}, got 1e+308"),
        ("--max-steps", "0", f"--max-steps {COUNT}, got 0"),
        ("--max-tool-calls", "-1", f"--max-tool-calls {COUNT}, got -1"),
        ("--max-tokens", "0", f"--max-tokens {COUNT}, got 0"),
        ("--max-tokens", "10000000000000", f"--max-tokens {COUNT}, got 10000000000000"),
        ("--max-cost", "0", f"--max-cost {USD}, got 0.0"),
        ("--max-cost", "-1", f"--max-cost {USD}, got -1.0"),
        ("--max-cost", "nan", f"--max-cost {USD}, got nan"),
        ("--max-cost", "Infinity", f"--max-cost {USD}, got inf"),
    ],
)
def test_an_option_out_of_range_exits_2_with_one_line_and_stores_nothing(
    ws: KeelWorkspace, option: str, value: str, expected: str
) -> None:
    """The real app and parser, in this process (the subprocess case is below)."""
    result = CliRunner().invoke(
        app,
        ["run", "fix it", "--model", ws.script(DONE), option, value, "--cwd", str(ws.root)],
        env={"KEEL_STORE": ws.url},
    )

    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [f"error: {expected}"]
    assert not (ws.root / ".keel").exists()  # not even a store was opened


def test_a_negative_approval_timeout_is_refused_by_the_keel_command(ws: KeelWorkspace) -> None:
    """Once, it made a run that failed at its first approval and could never resume."""
    done = ws.keel("run", "fix it", "--model", ws.script(DONE), "--approval-timeout", "-5")

    assert one_line_error(done) == f"error: --approval-timeout {SECONDS}, got -5.0"
    assert not (ws.root / ".keel").exists()


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ("[approvals]\ngrant_ttl_seconds = -1\n", "[approvals] grant_ttl_seconds " + SECONDS),
        ("[approvals]\ntimeout_seconds = nan\n", "[approvals] timeout_seconds " + SECONDS),
        ("[approvals]\ngrant_ttl = 60\n", "unknown approvals setting(s) grant_ttl"),
    ],
)
def test_an_approvals_setting_out_of_range_exits_2_naming_the_file_and_key(
    ws: KeelWorkspace, config: str, expected: str
) -> None:
    (ws.root / ".keel").mkdir()
    (ws.root / ".keel" / "config.toml").write_text(config)

    done = ws.keel("run", "fix it", "--model", ws.script(DONE))

    line = flat(one_line_error(done))
    assert "config.toml" in line and expected in line
    assert runs_stored(ws) == 0


@pytest.mark.parametrize("price", ["nan", "inf", "-0.5"])
def test_a_price_that_is_not_a_finite_amount_exits_2_naming_the_entry(
    ws: KeelWorkspace, price: str
) -> None:
    (ws.root / ".keel").mkdir()
    (ws.root / ".keel" / "config.toml").write_text(
        f'[prices."openai:local"]\ninput_per_mtok = {price}\noutput_per_mtok = 1.0\n'
    )
    ws.env["OPENAI_API_KEY"] = "sk-unused"

    done = ws.keel("run", "fix it", "--model", "openai:local")

    line = flat(one_line_error(done))
    assert '[prices."openai:local"]: input_per_mtok must be a finite number' in line
    assert runs_stored(ws) == 0


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-1"])
def test_a_scripted_cost_that_is_not_finite_exits_2_and_stores_nothing(
    ws: KeelWorkspace, literal: str
) -> None:
    script = ws.root / "turns.json"
    script.write_text(f'[{{"content": "done", "cost": {literal}}}]')

    done = ws.keel("run", "fix it", "--model", f"scripted:{script}", "--max-cost", "1")

    line = flat(one_line_error(done))
    assert "turn 0: cost must be a finite number of USD, 0 or more" in line
    assert runs_stored(ws) == 0


def test_show_names_the_unused_approval_and_when_it_expires(ws: KeelWorkspace) -> None:
    (ws.root / ".keel").mkdir()
    (ws.root / ".keel" / "config.toml").write_text("[approvals]\ngrant_ttl_seconds = 3600\n")
    write = call("write_file", path="a.txt", content="x\n")
    run_id, first = ws.start("write", "--model", ws.script(turn(write), DONE), "--mode", "ask")
    expect(first, 3)
    expect(ws.keel("approve", run_id), 0)

    shown = flat(expect(ws.keel("show", run_id), 0))

    [grant] = ws.state(run_id).grants.values()
    assert grant.expires_at is not None
    assert f"unused approvals write_file (call call_0_0) expires {grant.expires_at}" in shown
    assert ws.state(run_id).status is RunStatus.RUNNING
