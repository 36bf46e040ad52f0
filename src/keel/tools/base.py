"""What a tool is: effect, recovery policy, an argument model derived from its signature.

A tool is a plain function ``def name(ctx: ToolContext, arg: T, ...) -> ToolResult``
declared with :func:`tool`. Its docstring is the description the model reads; each
argument's description comes from ``Annotated[T, Field(description=...)]`` or from
an ``Args:`` section of the docstring. The pydantic model built from the signature
is the only gate the model's arguments pass through (extra arguments are refused).
"""

from __future__ import annotations

import copy
import functools
import inspect
import json
import re
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypedDict

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, create_model
from pydantic_core import ErrorDetails

from keel.core.errors import ToolArgumentError, ToolError, UsageError
from keel.core.guard import PathGuard
from keel.core.pathnames import spelled_path
from keel.tools.deadline import DEFAULT_TIME_LIMIT_S
from keel.tools.workspace import current_hash

if TYPE_CHECKING:
    from keel.core.events import NewEvent
    from keel.core.state import RunState
    from keel.sandbox.base import Sandbox
    from keel.store.base import Store


class Effect(StrEnum):
    """What running a tool does to the world; the policy and the ledger key off it."""

    READ = "read"  # looks, changes nothing
    WRITE = "write"  # changes files in the workspace
    EXECUTE = "execute"  # runs a program: anything may change
    EXTERNAL = "external"  # reaches outside the machine (network, services)
    STATE = "state"  # changes only the harness's own records (todos, plan, tasks)


class Recovery(StrEnum):
    """What resume does with a call that started but has no recorded outcome."""

    REPLAY_SAFE = "replay_safe"  # reads: just run it again
    IDEMPOTENT = "idempotent"  # re-running with the same key is harmless
    VERIFY_THEN_CONTINUE = "verify_then_continue"  # the tool checks whether it happened
    MANUAL = "manual"  # a person decides


DEFAULT_RECOVERY = {
    Effect.READ: Recovery.REPLAY_SAFE,
    Effect.WRITE: Recovery.MANUAL,
    Effect.EXECUTE: Recovery.MANUAL,
    Effect.EXTERNAL: Recovery.MANUAL,
    Effect.STATE: Recovery.IDEMPOTENT,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolContext:
    """Where and for whom a call runs; ``owner`` is the run's identity, never the model's."""

    workspace: Path  # already resolved
    run_id: str
    call_id: str
    owner: str
    store: Store | None = None
    state: RunState | None = None
    guard: PathGuard = field(default_factory=PathGuard)  # protected, secret, hidden paths
    sandbox: Sandbox | None = None  # None: commands run unconfined (tests of the tools)
    git_writable: bool = False  # an approved call may write below .git (not config, hooks)
    on_spawn: Callable[[int], None] | None = None  # told a command's process group id
    deadline: float | None = None  # time.monotonic() by which the call must stop (None: never)
    # Delegation (keel.tools.delegation): the harness's children machinery, and a way to
    # commit the run's events mid-call (a spawn is on record before the child runs).
    delegation: Any = None  # a keel.tools.delegation.Delegation; None: no children here
    record: Callable[[Sequence[NewEvent]], None] | None = None
    should_stop: Callable[[], bool] | None = None  # the process is stopping (graceful)
    fsync: bool = True  # file writes reach the disk (as the run's store commits: fsyncs_commits)


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolResult:
    """What a call produced: text for the model, changed files, structured data for the loop."""

    output: str
    changed_files: dict[str, str] = field(default_factory=dict)  # posix path -> sha256 ("" gone)
    data: dict[str, Any] = field(default_factory=dict)


class ToolSchema(TypedDict):
    """A tool as the model sees it: the shape of ``keel.models`` tool specs."""

    name: str
    description: str
    parameters: dict[str, Any]


ToolFunction = Callable[..., ToolResult]
IntentFunction = Callable[..., dict[str, str]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Tool:
    """A declared tool. ``control`` tools have no function: the loop performs them."""

    name: str
    description: str
    effect: Effect
    recovery: Recovery
    args_model: type[BaseModel]
    control: bool = False
    function: ToolFunction | None = None
    intent_function: IntentFunction | None = None
    time_limit_s: float = DEFAULT_TIME_LIMIT_S  # a call's own limit (the run's may be shorter)

    def spec(self) -> ToolSchema:
        return {
            "name": self.name,
            "description": self.description,
            "parameters": json_schema_of(self.args_model),
        }

    def parse_arguments(self, raw: str | Mapping[str, Any] | BaseModel | None) -> BaseModel:
        """Validate the model's arguments; ToolArgumentError says exactly what to fix.

        Whatever the input (deeply nested JSON, a number too long to convert, a value a
        validator chokes on), the only exception is ToolArgumentError.
        """
        try:
            return self._parse_arguments(raw)
        except ToolArgumentError:
            raise
        except RecursionError:
            raise ToolArgumentError(
                self.name, f"arguments for {self.name} are nested too deeply; send a flat object"
            ) from None
        except Exception as exc:
            raise ToolArgumentError(
                self.name,
                f"arguments for {self.name} could not be read: {type(exc).__name__}: "
                f"{_shorten(str(exc))}",
            ) from None

    def _parse_arguments(self, raw: str | Mapping[str, Any] | BaseModel | None) -> BaseModel:
        if isinstance(raw, self.args_model):
            return raw
        if isinstance(raw, BaseModel):
            raw = raw.model_dump()
        if raw is None:
            raw = {}
        if isinstance(raw, str):
            raw = _decode_json_arguments(self.name, raw)
        if not isinstance(raw, Mapping):
            raise ToolArgumentError(
                self.name,
                f"arguments for {self.name} must be a JSON object, got {_json_kind(raw)}",
            )
        try:
            return self.args_model.model_validate(dict(raw))
        except ValidationError as exc:
            accepted = list(self.args_model.model_fields)
            problems = tuple(_describe_error(err, accepted) for err in exc.errors())
            raise ToolArgumentError(
                self.name,
                f"invalid arguments for {self.name}: " + "; ".join(problems),
                problems,
            ) from None

    def run(self, ctx: ToolContext, args: str | Mapping[str, Any] | BaseModel) -> ToolResult:
        """Run the tool on already parsed arguments (raw ones are parsed first)."""
        if self.function is None:
            raise UsageError(f"{self.name} is a control tool: the loop performs it, not execute()")
        return self.function(ctx, **_fields_of(self.parse_arguments(args)))

    def intent(self, ctx: ToolContext, args: str | Mapping[str, Any] | BaseModel) -> dict[str, str]:
        """Before running: each path this call will write -> the sha256 it will then have.

        Empty for tools whose recovery is not VERIFY_THEN_CONTINUE.
        """
        if self.intent_function is None:
            return {}
        return self.intent_function(ctx, **_fields_of(self.parse_arguments(args)))

    def effect_happened(self, ctx: ToolContext, intent: Mapping[str, str]) -> bool:
        """True when every path in ``intent`` now has the intended hash ("" = absent)."""
        if self.recovery is not Recovery.VERIFY_THEN_CONTINUE:
            raise UsageError(
                f"{self.name} has recovery {self.recovery}; only verify_then_continue tools "
                "can tell whether their effect happened"
            )
        return all(current_hash(ctx.workspace, path) == want for path, want in intent.items())


def tool(
    *,
    effect: Effect,
    recovery: Recovery | None = None,
    name: str | None = None,
    intent: IntentFunction | None = None,
    control: bool = False,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
) -> Callable[[Callable[..., Any]], Tool]:
    """Declare a tool from a plain function (see the module docstring).

    ``intent`` takes the same arguments as the tool and returns path -> sha256 after
    the effect; it is required for ``Recovery.VERIFY_THEN_CONTINUE``. With
    ``control=True`` the function is only a signature: the loop performs the tool.
    ``time_limit_s`` bounds one call (``ToolContext.deadline``; the run's remaining
    wall time may bound it sooner).
    """

    def declare(fn: Callable[..., Any]) -> Tool:
        tool_name = name or fn.__name__
        chosen = recovery or DEFAULT_RECOVERY[effect]
        if chosen is Recovery.VERIFY_THEN_CONTINUE and intent is None:
            raise UsageError(f"tool {tool_name}: verify_then_continue needs an intent function")
        description, arg_docs = _parse_docstring(fn.__doc__ or "")
        return Tool(
            name=tool_name,
            description=description or tool_name,
            effect=effect,
            recovery=chosen,
            args_model=arguments_model(fn, tool_name, arg_docs),
            control=control,
            function=None if control else fn,
            intent_function=intent,
            time_limit_s=time_limit_s,
        )

    return declare


def arguments_model(
    fn: Callable[..., Any], tool_name: str, arg_docs: Mapping[str, str] | None = None
) -> type[BaseModel]:
    """A pydantic model of ``fn``'s arguments after the context; extras are forbidden, and
    so are numbers that are not finite."""
    hints = typing.get_type_hints(fn, include_extras=True)
    params = list(inspect.signature(fn).parameters.values())
    if params and (params[0].name == "ctx" or hints.get(params[0].name) is ToolContext):
        params = params[1:]
    fields: dict[str, Any] = {}
    for param in params:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise UsageError(f"tool {tool_name}: *{param.name} cannot be described to a model")
        if param.name not in hints:
            raise UsageError(f"tool {tool_name}: argument {param.name!r} needs a type annotation")
        default = ... if param.default is inspect.Parameter.empty else param.default
        doc = (arg_docs or {}).get(param.name)
        fields[param.name] = (
            hints[param.name],
            Field(default, description=doc) if doc else default,
        )
    model_name = "".join(part.title() for part in tool_name.split("_")) + "Arguments"
    # Numbers must be finite: NaN and Infinity are not JSON, so no event could record them.
    config = ConfigDict(extra="forbid", allow_inf_nan=False)
    return create_model(model_name, __config__=config, **fields)


def json_schema_of(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema with ``$defs`` inlined and titles dropped (compact, portable).

    A fresh copy each call, built from a per-class cache: pydantic's schema generation
    costs about a millisecond a tool, and every run (every worker slot) offers the same
    tools, so it is done once per class and process.
    """
    return copy.deepcopy(_json_schema_of(model))


@functools.cache
def _json_schema_of(model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})
    result: dict[str, Any] = _inline(schema, defs, depth=0)
    required = set(result.get("required", ()))
    for prop, sub in result.get("properties", {}).items():
        if prop not in required:
            result["properties"][prop] = _without_null(sub)
    return result


def _without_null(schema: dict[str, Any]) -> dict[str, Any]:
    """An optional ``T | None = None`` argument shown simply as T (null is still accepted)."""
    options = schema.get("anyOf")
    if schema.get("default", ...) is not None or not isinstance(options, list):
        return schema
    kept = [option for option in options if option != {"type": "null"}]
    if len(kept) != 1:
        return schema
    simple = {k: v for k, v in schema.items() if k not in ("anyOf", "default")}
    return {**kept[0], **simple}


def _valid_path(value: str) -> str:
    try:
        spelled_path(value)
    except ToolError as exc:
        raise ValueError(str(exc)) from None
    return value


def _valid_pattern(value: str) -> str:
    try:
        spelled_path(value, what="pattern", check_lengths=False)
    except ToolError as exc:
        raise ValueError(str(exc)) from None
    return value


# A path argument as the model spells it (``keel.core.pathnames``): checked while the
# arguments are validated, so a path no file can have never reaches the policy.
PathArgument = Annotated[str, AfterValidator(_valid_path)]
PatternArgument = Annotated[str, AfterValidator(_valid_pattern)]


# --- internals -----------------------------------------------------------------------


def _shorten(text: str, most: int = 200) -> str:
    return text if len(text) <= most else text[: most - 1] + "…"


def _fields_of(args: BaseModel) -> dict[str, Any]:
    return {key: getattr(args, key) for key in type(args).model_fields}


def _decode_json_arguments(tool_name: str, raw: str) -> Any:
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ToolArgumentError(
            tool_name,
            f"arguments for {tool_name} are not valid JSON: {exc.msg} at line {exc.lineno} "
            f"column {exc.colno} (char {exc.pos}); send one JSON object",
        ) from None


def _json_kind(value: Any) -> str:
    kinds = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return kinds.get(type(value), "a number" if isinstance(value, int | float) else "a value")


def _describe_error(err: ErrorDetails, accepted: list[str]) -> str:
    where = ".".join(str(part) for part in err["loc"]) or "(arguments)"
    kind = err["type"]
    if kind == "missing":
        return f"{where}: missing required argument"
    if kind == "extra_forbidden":
        return f"{where}: unexpected argument (accepted: {', '.join(accepted)})"
    if kind == "value_error" and "error" in err.get("ctx", {}):
        return f"{where}: {err['ctx']['error']}"  # our validators name the value themselves
    shown = json.dumps(err.get("input"), default=str)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return f"{where}: {err['msg']} (got {_json_kind(err.get('input'))} {shown})"


_SECTION = re.compile(r"^(Args|Arguments|Parameters|Returns|Raises):\s*$")
_ARG_LINE = re.compile(r"^(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Split a docstring into its description and a Google-style ``Args:`` mapping."""
    lines = inspect.cleandoc(doc).splitlines()
    description: list[str] = []
    args: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    for line in lines:
        header = _SECTION.match(line)
        if header:
            section, current = header.group(1), None
            continue
        if section is None:
            description.append(line)
        elif section in ("Args", "Arguments", "Parameters") and line.strip():
            match = _ARG_LINE.match(line.strip())
            if match and not line.startswith((" " * 8, "\t\t")):
                current = match.group(1)
                args[current] = match.group(2).strip()
            elif current:
                args[current] = f"{args[current]} {line.strip()}".strip()
    return "\n".join(description).strip(), args


def _inline(node: Any, defs: dict[str, Any], depth: int) -> Any:
    if depth > 20:
        raise UsageError("tool argument schema is too deeply nested (recursive model?)")
    if isinstance(node, list):
        return [_inline(item, defs, depth + 1) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        target = dict(defs[ref.removeprefix("#/$defs/")])
        target.update({k: v for k, v in node.items() if k != "$ref"})
        return _inline(target, defs, depth + 1)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "title" and isinstance(value, str):
            continue
        if key == "properties" and isinstance(value, dict):
            out[key] = {prop: _inline(sub, defs, depth + 1) for prop, sub in value.items()}
        else:
            out[key] = _inline(value, defs, depth + 1)
    return out


__all__ = [
    "DEFAULT_RECOVERY",
    "DEFAULT_TIME_LIMIT_S",
    "Effect",
    "PathArgument",
    "PatternArgument",
    "Recovery",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolResult",
    "ToolSchema",
    "arguments_model",
    "json_schema_of",
    "tool",
]
