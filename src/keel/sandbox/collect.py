"""Reading a started program's output until it exits, its deadline, or its helpers linger.

Used by ``run_command`` and the verifiers: the program's stdout (stderr merged in)
is fed to a caller's sink chunk by chunk, so memory stays bounded whatever it
prints. At the deadline ``on_timeout`` is called (it kills the tree) and what was
already written is read for a moment. When the program exits while processes it
started still hold the pipe, reading stops ``drain_s`` later instead of waiting
for them (the caller then ends the call, which kills them).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

EXIT_DRAIN_S = 1.0  # after the program exits, how long to wait for helpers holding its output
KILL_DRAIN_S = 0.5  # after a timeout kill, how long to read what was already written
POLL_S = 0.25


@dataclass(frozen=True, slots=True)
class Collected:
    timed_out: bool  # the deadline passed: ``on_timeout`` ran
    output_held: bool  # the program exited while other processes still held its output


def collect_output(
    proc: subprocess.Popen[bytes],
    feed: Callable[[bytes], None],
    *,
    deadline: float,
    on_timeout: Callable[[], object],
    drain_s: float = EXIT_DRAIN_S,
) -> Collected:
    """Feed ``proc.stdout`` to ``feed`` until the program exits (and its output ends or
    ``drain_s`` passes) or the deadline (monotonic) passes. Closes ``proc.stdout``.

    A program that closes its output and keeps running is still bound by the deadline.
    """
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    timed_out = held = eof = False
    exited_at: float | None = None
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            now = time.monotonic()
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and (eof or now - exited_at >= drain_s):
                held = not eof
                break
            if exited_at is None and now >= deadline:
                timed_out = True
                on_timeout()
                if not eof:
                    _drain(fd, feed, selector)
                break
            wait = min(deadline - now, POLL_S) if exited_at is None else drain_s - (now - exited_at)
            if eof:  # output closed: only the exit or the deadline is left to wait for
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=max(deadline - now, 0.0))
            elif selector.select(timeout=max(wait, 0.0)):
                chunk = os.read(fd, 65536)
                if chunk:
                    feed(chunk)
                else:
                    eof = True
    proc.stdout.close()
    return Collected(timed_out=timed_out, output_held=held)


def _drain(fd: int, feed: Callable[[bytes], None], selector: selectors.BaseSelector) -> None:
    until = time.monotonic() + KILL_DRAIN_S
    while (left := until - time.monotonic()) > 0 and selector.select(timeout=left):
        chunk = os.read(fd, 65536)
        if not chunk:
            return
        feed(chunk)


__all__ = ["EXIT_DRAIN_S", "Collected", "collect_output"]
