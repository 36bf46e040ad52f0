"""The middleware a run gets: Python objects, entry points and ``.keel/hooks.toml``.

``RunMiddleware.for_run`` builds one run's ``MiddlewareChain`` from

- the objects (or entry point names) given to ``Harness(middleware=[...])``;
- the entry points ``[middleware] use`` names (group ``keel.middleware``: the object
  is a ``Middleware`` subclass, an instance, or a factory taking no arguments);
- the built-in write-size guard when ``[write_size] max_bytes`` is set;
- each ``[[hooks]]`` command (`CommandHook`).

A command hook is a program the *harness* runs, outside any sandbox, so the model must
not be able to choose what it runs: the file itself lives under the protected
``.keel/`` (no tool may write there), and every program or script the command names
inside the workspace must be there too — ``["python3", "scripts/check.py"]`` is
refused, because the model can rewrite ``scripts/check.py``. The hook runs in
``.keel/`` (so ``python3 -m x`` imports nothing the model wrote), with only PATH,
HOME, the locale and the variables its entry names; it learns the workspace from
``KEEL_WORKSPACE`` and the context.

A run whose workspace is a git checkout (``workspace_git``) reads no hooks from it:
the file would come from the repository, not from the person running Keel.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Final

from keel.core.errors import ConfigError, ToolError
from keel.core.hooks_config import HOOKS_FILE, HookEntry, HooksConfig, parse_hooks_config
from keel.core.middleware import CONTINUE, Decision, Deny, Point, decision_from_json
from keel.core.state import RunState
from keel.loop.middleware import (
    CompletionContext,
    Context,
    Middleware,
    MiddlewareChain,
    ModelContext,
    ToolCallContext,
    ToolResultContext,
    TurnContext,
    message_data,
)
from keel.runtime.write_size import WriteSizeGuard
from keel.tools.fsroot import WorkspaceRoot

ENTRY_POINT_GROUP: Final = "keel.middleware"
MAX_CONFIG_BYTES: Final = 64 * 1024
MAX_OUTPUT_BYTES: Final = 1024 * 1024  # of a hook's decision
STDERR_SHOWN: Final = 2_000  # characters of a failing hook's stderr in its error
PASSED_ENV: Final = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "USER")
DENY_EXIT: Final = 2  # a hook exiting 2 denies, its stderr the reason (as in other harnesses)

MiddlewareSource = Middleware | str


def load_hooks(config_dir: Path) -> HooksConfig:
    """The workspace's ``.keel/hooks.toml`` (empty without it); ConfigError naming the
    file for an invalid one, a hook whose program the model could write included."""
    rel = "/".join(HOOKS_FILE)
    source = str(config_dir / rel)
    with WorkspaceRoot(config_dir) as root:
        try:
            opened = root.open(rel, spelled=False)
        except ToolError as exc:
            raise ConfigError(f"{source}: {exc}") from None
        if opened is None:
            return HooksConfig()
        with opened:
            if not opened.is_file:
                raise ConfigError(f"{source}: not a regular file")
            data = opened.read(MAX_CONFIG_BYTES + 1)  # one more: refused below, not cut
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{source}: over {MAX_CONFIG_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{source}: not UTF-8 text") from None
    config = parse_hooks_config(text, source)
    for hook in config.hooks:
        check_hook_command(hook, config_dir, source)
    return config


def check_hook_command(hook: HookEntry, workspace: Path, source: str) -> None:
    """ConfigError when the hook's program, or a file it names, lies in the workspace
    outside ``.keel/`` (where the model could rewrite what the harness then runs)."""
    root = workspace.resolve()
    protected = root / HOOKS_FILE[0]
    program = hook.command[0]
    found = program if "/" in program else shutil.which(program)
    named = [found] if found else []
    named += [arg for arg in hook.command[1:] if not arg.startswith("-")]
    for item in named:
        path = Path(item) if Path(item).is_absolute() else root / item
        if not os.path.lexists(path):
            continue
        real = path.resolve()
        if real.is_relative_to(root) and not real.is_relative_to(protected):
            raise ConfigError(
                f"{source}: hook {hook.name}: {item!r} is in the workspace outside .keel/, "
                "where the model can change it; put the hook's program under .keel/hooks/"
            )


@dataclass(frozen=True, slots=True)
class HookFailed(Exception):
    """A command hook that exited badly, printed no decision, or passed its timeout."""

    message: str

    def __str__(self) -> str:
        return self.message


class CommandHook(Middleware):
    """A ``[[hooks]]`` entry: the context as JSON on stdin, the decision as JSON on stdout.

    Exit 0 with ``{}`` or nothing printed is ``continue``; exit 2 denies with stderr as
    the reason; any other exit, output that is not a decision, or passing
    ``timeout_seconds`` (the process group is killed) is the hook's error, which its
    ``on_error`` turns into a deny (closed) or ignores (open)."""

    def __init__(self, entry: HookEntry, workspace: Path, environ: dict[str, str]) -> None:
        self.entry = entry
        self.name = entry.name
        self.order = entry.order
        self.on_error = entry.on_error
        self.workspace = workspace
        self.cwd = workspace / HOOKS_FILE[0]
        self.command = [
            str(workspace / arg) if arg.startswith(".keel/") else arg for arg in entry.command
        ]
        env = {k: environ[k] for k in (*PASSED_ENV, *entry.env) if k in environ}
        self.env = {**env, "KEEL_WORKSPACE": str(workspace), "KEEL_HOOK": entry.name}

    def points(self) -> frozenset[Point]:
        return frozenset({self.entry.point})

    def _applies(self, tool: str) -> bool:
        return self.entry.tools is None or tool in self.entry.tools

    def before_model(self, ctx: ModelContext) -> Decision:
        return self.ask(ctx)

    def after_model(self, ctx: TurnContext) -> Decision:
        return self.ask(ctx)

    def before_tool(self, ctx: ToolCallContext) -> Decision:
        return self.ask(ctx) if self._applies(ctx.tool) else CONTINUE

    def after_tool(self, ctx: ToolResultContext) -> Decision:
        return self.ask(ctx) if self._applies(ctx.tool) else CONTINUE

    def before_complete(self, ctx: CompletionContext) -> Decision:
        return self.ask(ctx)

    def on_event(self, event: Any) -> None:
        self.run({"point": Point.ON_EVENT.value, "event": event.to_dict()})

    def ask(self, ctx: Context) -> Decision:
        out = self.run(context_json(self.entry.point, ctx))
        if isinstance(out, Deny):
            return out
        return decision_from_json(out)

    def run(self, context: dict[str, Any]) -> Any:
        """Run the command once with ``context``; its parsed stdout (or a Deny)."""
        payload = json.dumps(context, ensure_ascii=False, default=str).encode("utf-8")
        try:
            process = subprocess.Popen(
                self.command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=self.cwd if self.cwd.is_dir() else self.workspace,
                env={**self.env, "KEEL_HOOK_POINT": str(context.get("point"))},
                start_new_session=True,  # its whole group is killed at the timeout
            )
        except OSError as exc:
            raise HookFailed(
                f"hook {self.name} could not start {self.command[0]!r}: {exc}"
            ) from None
        with process:  # closes the pipes, whatever happens
            try:
                out, err = process.communicate(payload, timeout=self.entry.timeout_s)
            except subprocess.TimeoutExpired:
                _kill_group(process)
                process.communicate()
                raise HookFailed(
                    f"hook {self.name} passed its {self.entry.timeout_s:g} s timeout and was killed"
                ) from None
            finally:
                _kill_group(process)  # anything it left running in its group
        stderr = err.decode("utf-8", "replace").strip()[-STDERR_SHOWN:]
        if process.returncode == DENY_EXIT:
            return Deny(reason=stderr or f"hook {self.name} exited {DENY_EXIT}")
        if process.returncode != 0:
            shown = f": {stderr}" if stderr else ""
            raise HookFailed(f"hook {self.name} exited {process.returncode}{shown}")
        if len(out) > MAX_OUTPUT_BYTES:
            raise HookFailed(f"hook {self.name} printed over {MAX_OUTPUT_BYTES} bytes")
        text = out.decode("utf-8", "replace").strip()
        if not text:
            return None
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise HookFailed(f"hook {self.name} printed no JSON decision ({exc})") from None


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def context_json(point: Point, ctx: Context) -> dict[str, Any]:
    """What a command hook reads: the point, the run, and the point's fields."""
    state: RunState = ctx.state
    data: dict[str, Any] = {
        "point": point.value,
        "run_id": state.run_id,
        "goal": state.goal,
        "mode": state.mode,
        "step": state.usage.steps,
    }
    if isinstance(ctx, ModelContext):
        data.update(messages=[message_data(m) for m in ctx.messages], tools=list(ctx.tools))
    elif isinstance(ctx, TurnContext):
        data.update(content=ctx.content, tool_calls=list(ctx.tool_calls))
    elif isinstance(ctx, ToolCallContext):
        data.update(call_id=ctx.call_id, tool=ctx.tool, effect=ctx.effect, arguments=ctx.arguments)
    elif isinstance(ctx, ToolResultContext):
        data.update(
            call_id=ctx.call_id,
            tool=ctx.tool,
            arguments=ctx.arguments,
            output=ctx.output,
            changed_files=ctx.changed_files,
        )
    else:
        data.update(
            summary=ctx.summary,
            verifiers=[
                {"command": r.command, "passed": r.passed, "exit_code": r.exit_code}
                for r in ctx.records
            ],
        )
    return data


def entry_point_middleware(name: str) -> Middleware:
    """The middleware the ``keel.middleware`` entry point ``name`` makes."""
    found = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
    if name not in found:
        known = ", ".join(sorted(found)) or "none are installed"
        raise ConfigError(f"no {ENTRY_POINT_GROUP} entry point named {name!r} ({known})")
    try:
        made = found[name].load()
    except Exception as exc:
        raise ConfigError(
            f"entry point {name!r} ({found[name].value}) failed to load: {exc}"
        ) from None
    if callable(made) and not isinstance(made, Middleware):
        try:
            made = made()  # a Middleware subclass, or a factory
        except Exception as exc:
            raise ConfigError(
                f"entry point {name!r} ({found[name].value}) failed to make its middleware: {exc}"
            ) from None
    if not isinstance(made, Middleware):
        raise ConfigError(
            f"entry point {name!r} ({found[name].value}) is not a keel Middleware, a "
            "subclass of one, or a factory returning one"
        )
    if not made.name:
        made.name = name
    return made


class RunMiddleware:
    """Builds each run's chain from the harness's middleware and the run's hooks."""

    def __init__(
        self,
        given: Sequence[MiddlewareSource] = (),
        *,
        environ: Callable[[], dict[str, str]] = lambda: dict(os.environ),
    ) -> None:
        self.given = [entry_point_middleware(m) if isinstance(m, str) else m for m in given]
        for mw in self.given:
            if not isinstance(mw, Middleware):
                raise ConfigError(
                    f"middleware must be keel Middleware objects or entry point names, "
                    f"not {type(mw).__name__}"
                )
        MiddlewareChain(self.given)  # names and on_error are checked now, not per run
        self._environ = environ

    def for_run(self, state: RunState) -> MiddlewareChain:
        """``state``'s chain; ConfigError for a broken ``hooks.toml`` or entry point."""
        found: list[Middleware] = list(self.given)
        config_dir = hooks_dir(state)
        if config_dir is not None:
            config = load_hooks(config_dir)
            found += [entry_point_middleware(name) for name in config.use]
            if config.write_max_bytes is not None:
                found.append(WriteSizeGuard(max_bytes=config.write_max_bytes))
            environ = self._environ() if config.hooks else {}
            found += [CommandHook(entry, config_dir, environ) for entry in config.hooks]
        return MiddlewareChain(found)


def hooks_dir(state: RunState) -> Path | None:
    """Where a run's ``hooks.toml`` is read: its workspace, or for an isolated child the
    workspace its copy was made from (the copy's ``.keel`` is not the user's); None for
    a git checkout."""
    options = state.options
    if options.workspace_git:
        return None
    parent = (options.isolated or {}).get("parent")
    return Path(parent) if parent else Path(state.workspace)


__all__ = [
    "ENTRY_POINT_GROUP",
    "CommandHook",
    "RunMiddleware",
    "context_json",
    "entry_point_middleware",
    "hooks_dir",
    "load_hooks",
]
