"""Running one verifier: the user's own command line, in the workspace, bounded.

Verifiers come from the harness's configuration (``--verify``), never from the
model, so they run through the shell like any command the user would type. The
output kept is the tail (the end of a test run says what failed), capped.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

TIMEOUT_EXIT_CODE = 124  # what `timeout(1)` returns, so a reader recognises it
OUTPUT_CAP = 2_000_000  # bytes of output kept (the tail)


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifierRun:
    exit_code: int
    output: str
    duration_s: float


def run_verifier(
    command: str, *, workspace: Path, timeout_s: float, env: dict[str, str]
) -> VerifierRun:
    """Run ``command`` in ``workspace``; a timeout is exit code 124 with a note."""
    started = time.monotonic()
    try:
        proc = subprocess.run(
            command,
            shell=True,  # the user's own command line, never the model's
            cwd=workspace,
            capture_output=True,
            timeout=timeout_s,
            env=env,
            stdin=subprocess.DEVNULL,
            check=False,
        )
        code = proc.returncode
        output = proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        code = TIMEOUT_EXIT_CODE
        output = _bytes(exc.stdout) + _bytes(exc.stderr)
        output += f"\n[verifier timed out after {timeout_s:.0f} s]".encode()
    return VerifierRun(
        exit_code=code,
        output=output[-OUTPUT_CAP:].decode("utf-8", "replace"),
        duration_s=time.monotonic() - started,
    )


def _bytes(value: bytes | str | None) -> bytes:
    if value is None:
        return b""
    return value.encode() if isinstance(value, str) else value
