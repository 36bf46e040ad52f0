"""With KEEL_TEST_POSTGRES_URL set, a skipped PostgreSQL test fails the run (so CI cannot
pass with that half skipped); without it, it skips. A real pytest in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = """
import pytest

@pytest.mark.postgres
def test_marked():
    pytest.skip("psycopg is not installed")

@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_backend(backend):
    if backend == "postgres":
        pytest.skip("no server")

def test_other():
    pytest.skip("not about PostgreSQL")
"""


def run_pytest(folder: Path, env_url: str | None) -> subprocess.CompletedProcess[str]:
    (folder / "test_gate_sample.py").write_text(TESTS)
    env = {k: v for k, v in os.environ.items() if k != "KEEL_TEST_POSTGRES_URL"}
    if env_url is not None:
        env["KEEL_TEST_POSTGRES_URL"] = env_url
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "keel.testing.postgres_gate",
            "-p",
            "no:cacheprovider",
            "-rA",
            str(folder),
        ],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("url", [None, "postgresql://postgres@127.0.0.1:5432/postgres"])
def test_a_skipped_postgres_test_fails_only_when_the_server_is_configured(
    tmp_path: Path, url: str | None
) -> None:
    done = run_pytest(tmp_path, url)
    if url is None:
        assert done.returncode == 0, done.stdout
        assert "1 passed, 3 skipped" in done.stdout
    else:
        assert done.returncode == 1, done.stdout
        assert "2 failed, 1 passed, 1 skipped" in done.stdout
        assert "a PostgreSQL test skipped although KEEL_TEST_POSTGRES_URL is set" in done.stdout
        assert "psycopg is not installed" in done.stdout
