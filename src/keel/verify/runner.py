"""Running one verifier: the user's own command line, in the workspace, sandboxed, bounded.

Verifiers come from the harness's configuration (``--verify``), never from the
model, so they run through ``/bin/sh -c`` like any command the user would type —
but on the workspace's contents, which the model wrote, so inside the run's
sandbox: the same confinement, scrubbed environment and limits as ``run_command``
(``.git`` read-only, protected paths read-only, secret files masked). The whole
process tree is killed when the verifier ends or times out. The output kept is the
tail (the end of a test run says what failed), capped.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from keel.core.guard import PathGuard
from keel.sandbox.base import Confinement, Sandbox, SandboxSettings
from keel.sandbox.choose import open_sandbox
from keel.sandbox.collect import collect_output

TIMEOUT_EXIT_CODE = 124  # what `timeout(1)` returns, so a reader recognises it
OUTPUT_CAP = 2_000_000  # bytes of output kept (the tail)
SHELL = "/bin/sh"


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifierRun:
    exit_code: int
    output: str
    duration_s: float
    sandbox: dict[str, Any] = field(default_factory=dict)  # describe() of what confined it


def run_verifier(
    command: str,
    *,
    workspace: Path,
    timeout_s: float,
    sandbox: Sandbox | None = None,
    guard: PathGuard | None = None,
    env: Mapping[str, str] | None = None,
) -> VerifierRun:
    """Run ``command`` in ``workspace`` inside ``sandbox``; a timeout is exit code 124.

    ``sandbox`` None means unconfined (kind "none"; still a scrubbed environment,
    limits and a killed tree). ``env`` is set on top of the sandbox's allowlisted
    environment exactly as given: pass only what the verifier needs, never
    ``os.environ``.
    """
    box = sandbox if sandbox is not None else open_sandbox(SandboxSettings(mode="off"))
    confinement = Confinement(workspace=workspace, guard=guard or PathGuard())
    started = time.monotonic()
    tail = _Tail(OUTPUT_CAP)
    try:
        proc = box.popen(
            [SHELL, "-c", command],
            confinement,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
        )
    except OSError as exc:
        return VerifierRun(
            exit_code=127,
            output=f"cannot start the verifier: {exc.strerror or exc}",
            duration_s=time.monotonic() - started,
            sandbox=box.describe(),
        )
    try:
        collected = collect_output(
            proc, tail.feed, deadline=started + timeout_s, on_timeout=lambda: box.finish(proc)
        )
        code = proc.wait()
    finally:
        box.finish(proc)
    if collected.timed_out:
        code = TIMEOUT_EXIT_CODE
        tail.feed(f"\n[verifier timed out after {timeout_s:.0f} s]".encode())
    return VerifierRun(
        exit_code=code,
        output=tail.text(),
        duration_s=time.monotonic() - started,
        sandbox=box.describe(),
    )


class _Tail:
    """The last ``cap`` bytes fed, in amortised constant memory."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.buffer = bytearray()

    def feed(self, chunk: bytes) -> None:
        self.buffer += chunk
        if len(self.buffer) > 2 * self.cap:
            del self.buffer[: -self.cap]

    def text(self) -> str:
        return bytes(self.buffer[-self.cap :]).decode("utf-8", "replace")


__all__ = ["OUTPUT_CAP", "TIMEOUT_EXIT_CODE", "VerifierRun", "run_verifier"]
