"""Broken configuration stops `keel run` before anything is written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from keel.store.sqlite.store import SQLiteStore


def _keel(tmp_path: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "keel", *args, "--store", f"sqlite:///{tmp_path / 'keel.db'}"],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_missing_api_key_exits_2_naming_the_variable_and_creates_no_run(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "KEEL_MODEL")}
    done = _keel(tmp_path, "run", "fix it", "--model", "openai:gpt-4o", env=env)

    assert done.returncode == 2
    assert "OPENAI_API_KEY" in done.stderr
    assert "Traceback" not in done.stderr
    store = SQLiteStore(tmp_path / "keel.db")
    assert store.list_runs() == []
    store.close()


def test_unknown_model_provider_exits_2_listing_the_accepted_forms(tmp_path: Path) -> None:
    done = _keel(tmp_path, "run", "fix it", "--model", "llama:7b", env=dict(os.environ))

    assert done.returncode == 2
    assert "deepseek:" in done.stderr
    assert "openai:" in done.stderr
    assert "scripted:" in done.stderr


def test_plan_then_with_a_different_mode_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    script = tmp_path / "turns.json"
    script.write_text('[{"content": "done"}]')
    done = _keel(
        tmp_path,
        "run",
        "fix it",
        "--mode",
        "auto",
        "--plan-then",
        "edit",
        "--model",
        f"scripted:{script}",
        env=dict(os.environ),
    )

    assert done.returncode == 2
    assert "--plan-then" in done.stderr and "--mode auto" in done.stderr
    assert not (tmp_path / "keel.db").exists()
