"""run_command: one program, no shell, in the workspace, confined, bounded in time and output.

Guarantees: argv is executed directly (``;``, ``$(...)``, globs reach the program
literally) through the run's sandbox (``ctx.sandbox``; an unconfined one when none
is given), confined to the workspace minus its protected paths; the child starts
its own process group, reported to ``ctx.on_spawn`` before Keel waits for it; when
the call ends — exit, timeout, Ctrl-C or a crash of the caller — every process it
started is killed, and the output says when some were left running; the child's
environment is the sandbox's allowlist, so a command cannot echo a key into the
event log; the output the model sees is at most OUTPUT_MAX_CHARS characters and
says how many were omitted; memory use is bounded whatever the command prints; the
timeout never runs past the call's deadline (``ToolContext.deadline``: the run's
remaining wall time), and the output says when the deadline shortened it.
"""

from __future__ import annotations

import codecs
import functools
import os
import shlex
import shutil
import stat
import subprocess
import time
from collections import deque
from pathlib import Path
from typing import Annotated

from pydantic import Field

from keel.core.errors import ToolError, ToolTimedOut
from keel.core.redact import without_secrets
from keel.sandbox.base import Confinement, Sandbox, SandboxSettings
from keel.sandbox.choose import open_sandbox
from keel.sandbox.collect import collect_output
from keel.tools.base import Effect, Recovery, ToolContext, ToolResult, tool

DEFAULT_TIMEOUT_S = 120.0
MAX_TIMEOUT_S = 600.0
OUTPUT_MAX_CHARS = 30_000
child_environment = without_secrets  # never in a command's environment (the sandbox allowlists)


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


def effective_timeout(
    timeout_seconds: float | None, deadline: float | None, *, now: float
) -> tuple[float, bool]:
    """(seconds a command may run, whether the call's deadline shortened it): its own
    timeout (default DEFAULT_TIMEOUT_S, at most MAX_TIMEOUT_S), never past ``deadline``."""
    limit = min(timeout_seconds or DEFAULT_TIMEOUT_S, MAX_TIMEOUT_S)
    if deadline is not None and deadline - now < limit:
        return max(deadline - now, 0.0), True
    return limit, False


@tool(effect=Effect.EXECUTE, recovery=Recovery.MANUAL, time_limit_s=MAX_TIMEOUT_S)
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
    _check_argv(argv)
    _check_program(argv[0], ctx.workspace)
    sandbox = ctx.sandbox if ctx.sandbox is not None else unconfined_sandbox()
    limit, shortened = effective_timeout(timeout_seconds, ctx.deadline, now=time.monotonic())
    if limit <= 0:
        raise ToolTimedOut(
            "run_command was not started: the call's deadline has passed (the run's "
            "wall-time budget is spent)"
        )
    shown = shlex.join(argv)
    confinement = Confinement(
        workspace=ctx.workspace, guard=ctx.guard, git_writable=ctx.git_writable
    )
    try:
        proc = sandbox.popen(argv, confinement, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
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
        if ctx.on_spawn is not None:
            ctx.on_spawn(proc.pid)  # its process group: a resume can find it if Keel dies
        collected = collect_output(
            proc, output.feed, deadline=started + limit, on_timeout=lambda: sandbox.finish(proc)
        )
        output.feed(b"", final=True)
        exit_code = proc.wait()
    finally:  # also on Ctrl-C or a crash of the caller: never leave the command running
        left_running = sandbox.finish(proc)
    duration = time.monotonic() - started
    text = output.text()
    lines = [f"$ {shown}"]
    if text:
        lines.append(text.rstrip("\n"))
    if collected.timed_out:
        lines.append(
            f"[timed out after {limit:g} s: the command and its child processes were killed]"
        )
    else:
        lines.append(f"[exit code {exit_code}]")
        if left_running or collected.output_held:
            count = f" ({left_running})" if left_running else ""
            lines.append(f"[the command exited; processes it left running were killed{count}]")
    if shortened:
        lines.append(f"[timeout shortened to {limit:.1f} s: the run's wall-time budget ends then]")
    elif timeout_seconds and timeout_seconds > MAX_TIMEOUT_S:
        lines.append(f"[timeout_seconds capped at {MAX_TIMEOUT_S:g}]")
    return ToolResult(
        output="\n".join(lines),
        data={
            "argv": list(argv),
            "exit_code": exit_code,
            "timed_out": collected.timed_out,
            "duration_s": round(duration, 3),
            "left_running_killed": left_running,
            "sandbox": sandbox.describe(),
        },
    )


@functools.cache
def unconfined_sandbox() -> Sandbox:
    """The sandbox of calls whose context has none (tools used outside a run): kind "none"."""
    return open_sandbox(SandboxSettings(mode="off"))


def _check_argv(argv: list[str]) -> None:
    """ToolError for an argument no program can receive: a NUL, or text that is not
    Unicode (a lone surrogate other than a byte of a non-UTF-8 name)."""
    for index, arg in enumerate(argv):
        if "\x00" in arg:
            raise ToolError(f"argv[{index}] {arg!r} contains a NUL character; arguments cannot")
        try:
            os.fsencode(arg)
        except UnicodeEncodeError as exc:
            raise ToolError(
                f"argv[{index}] {arg!r} is not valid text: {exc.reason} at character {exc.start}"
            ) from None


def _check_program(program: str, workspace: Path) -> None:
    """A clear error before starting, for a program that is missing or not executable.

    Inside a sandbox the lookup happens again (with the same PATH); this check gives
    the model the same message whichever sandbox runs the command.
    """
    if "/" in program:
        path = workspace / program
        try:
            st = path.stat()
        except (OSError, ValueError) as exc:
            why = "no such file" if isinstance(exc, FileNotFoundError) else str(exc)
            raise ToolError(
                f"command not found: {program!r} ({why}; argv[0] is run directly, without a "
                "shell; check the program name or give its path)"
            ) from None
        if stat.S_ISDIR(st.st_mode) or not os.access(path, os.X_OK):
            raise ToolError(f"{program!r} is not executable")
        return
    try:
        found = shutil.which(program, path=os.environ.get("PATH", os.defpath))
    except (OSError, ValueError):
        found = None
    if found is None:
        raise ToolError(
            f"command not found: {program!r} (argv[0] is run directly, without a shell; "
            "check the program name or give its path)"
        )
