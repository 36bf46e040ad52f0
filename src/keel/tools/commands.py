"""run_command: one program, no shell, in the workspace, bounded in time and output.

Guarantees: argv is executed directly (``;``, ``$(...)``, globs reach the program
literally); the child starts its own process group, and on timeout the whole group
is killed; the child's environment carries no variable whose name looks secret, so
a command cannot echo a key into the event log; the output the model sees is at
most OUTPUT_MAX_CHARS characters and says how many were omitted; memory use is
bounded whatever the command prints.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import selectors
import shlex
import signal
import subprocess
import time
from collections import deque
from typing import Annotated

from pydantic import Field

from keel.core.errors import ToolError
from keel.core.redact import without_secrets
from keel.tools.base import Effect, Recovery, ToolContext, ToolResult, tool

DEFAULT_TIMEOUT_S = 120.0
MAX_TIMEOUT_S = 600.0
OUTPUT_MAX_CHARS = 30_000
EXIT_DRAIN_S = 1.0  # after the program exits, how long to wait for helpers holding its output
child_environment = without_secrets  # what a command sees: no secret-looking variables


class BoundedText:
    """Collects decoded output keeping only the first and last ``limit / 2`` characters."""

    def __init__(self, limit: int) -> None:
        self.head_limit = limit // 2
        self.tail_limit = limit - self.head_limit
        self.head: list[str] = []
        self.head_len = 0
        self.tail: deque[str] = deque()
        self.tail_len = 0
        self.total = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, chunk: bytes, *, final: bool = False) -> None:
        text = self._decoder.decode(chunk, final=final)
        self.total += len(text)
        room = self.head_limit - self.head_len
        if room > 0:
            self.head.append(text[:room])
            self.head_len += len(text[:room])
            text = text[room:]
        if text:
            self.tail.append(text)
            self.tail_len += len(text)
            while self.tail_len - len(self.tail[0]) >= self.tail_limit:
                self.tail_len -= len(self.tail.popleft())

    def text(self) -> str:
        head = "".join(self.head)
        tail = "".join(self.tail)
        kept_tail = tail[-self.tail_limit :] if self.tail_limit else ""
        omitted = self.total - len(head) - len(kept_tail)
        if omitted <= 0:
            return head + tail
        return f"{head}\n[output truncated: {omitted} characters omitted]\n{kept_tail}"


@tool(effect=Effect.EXECUTE, recovery=Recovery.MANUAL)
def run_command(
    ctx: ToolContext,
    argv: Annotated[
        list[str],
        Field(
            min_length=1,
            description='Program and its arguments, e.g. ["pytest", "-q"]. No shell: '
            'pipes, \';\' and \'$(...)\' are passed literally; use ["sh", "-c", "..."] '
            "when a shell is really needed.",
        ),
    ],
    timeout_seconds: Annotated[
        float | None,
        Field(
            gt=0,
            description=f"Kill the command after this many seconds (default "
            f"{DEFAULT_TIMEOUT_S:g}, at most {MAX_TIMEOUT_S:g}).",
        ),
    ] = None,
) -> ToolResult:
    """Run a program in the workspace and report its exit code and combined output."""
    if not ctx.workspace.is_dir():
        raise ToolError(f"the workspace {ctx.workspace} does not exist or is not a directory")
    limit = min(timeout_seconds or DEFAULT_TIMEOUT_S, MAX_TIMEOUT_S)
    shown = shlex.join(argv)
    try:
        proc = subprocess.Popen(
            argv,
            cwd=ctx.workspace,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=child_environment(os.environ),
            start_new_session=True,
        )
    except FileNotFoundError:
        raise ToolError(
            f"command not found: {argv[0]!r} (argv[0] is run directly, without a shell; "
            "check the program name or give its path)"
        ) from None
    except PermissionError:
        raise ToolError(f"{argv[0]!r} is not executable") from None
    except OSError as exc:
        raise ToolError(f"cannot start {argv[0]!r}: {exc.strerror or exc}") from None
    started = time.monotonic()
    output = BoundedText(OUTPUT_MAX_CHARS)
    try:
        timed_out, left_running = _collect(proc, output, started + limit)
    except BaseException:  # Ctrl-C or a crash of the caller: never leave the command running
        _kill_group(proc)
        proc.wait()
        raise
    exit_code = proc.wait()
    duration = time.monotonic() - started
    text = output.text()
    lines = [f"$ {shown}"]
    if text:
        lines.append(text.rstrip("\n"))
    if timed_out:
        lines.append(
            f"[timed out after {limit:g} s: the command and its child processes were killed]"
        )
    else:
        lines.append(f"[exit code {exit_code}]")
    if left_running:
        lines.append("[the command exited; processes it left running still hold its output]")
    if timeout_seconds and timeout_seconds > MAX_TIMEOUT_S:
        lines.append(f"[timeout_seconds capped at {MAX_TIMEOUT_S:g}]")
    return ToolResult(
        output="\n".join(lines),
        data={
            "argv": list(argv),
            "exit_code": exit_code,
            "timed_out": timed_out,
            "duration_s": round(duration, 3),
        },
    )


def _collect(
    proc: subprocess.Popen[bytes], output: BoundedText, deadline: float
) -> tuple[bool, bool]:
    """Read the child's output until EOF, the deadline (kill the group) or exit + drain.

    Returns (timed_out, left_running): left_running means the program exited while
    processes it started still held the output pipe open.
    """
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    timed_out = left_running = False
    exited_at: float | None = None
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            now = time.monotonic()
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at >= EXIT_DRAIN_S:
                left_running = True
                break
            if exited_at is None and now >= deadline:
                timed_out = True
                _kill_group(proc)
                _drain(fd, output, selector)
                break
            if exited_at is None:
                wait = min(deadline - now, 0.25)
            else:
                wait = EXIT_DRAIN_S - (now - exited_at)
            if selector.select(timeout=max(wait, 0.0)):
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                output.feed(chunk)
    output.feed(b"", final=True)
    proc.stdout.close()
    return timed_out, left_running


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    # The leader is not reaped yet, so its pid still names this process group.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def _drain(fd: int, output: BoundedText, selector: selectors.BaseSelector) -> None:
    """Read what the killed group already wrote, for at most a moment."""
    until = time.monotonic() + 0.5
    while (left := until - time.monotonic()) > 0 and selector.select(timeout=left):
        chunk = os.read(fd, 65536)
        if not chunk:
            return
        output.feed(chunk)
