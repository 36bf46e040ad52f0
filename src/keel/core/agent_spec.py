"""Agent specs: one subagent's contract, parsed from the text of ``.keel/agents/NAME.md``.

A spec file is YAML front matter between two ``---`` lines, then the instructions::

    ---
    description: Read-only research with file references
    tools: [read_file, grep]
    mode: plan
    budget: {steps: 20, tokens: 200000}
    on_failure: {policy: retry, attempts: 2, agent: explorer, then: escalate}
    ---
    You are ...

Front-matter keys: ``description`` (required), ``model`` (a model spec string; absent =
the parent's), ``tools`` (an allowlist; absent = every tool the parent has), ``mode``
(absent = the parent's), ``workspace`` (``isolated`` | ``shared-readonly`` | ``shared``;
default ``isolated``), ``budget`` (any of ``steps``, ``tool_calls``, ``tokens``, ``cost``,
``wall_seconds``), ``verify`` (a list of commands), ``output`` (a JSON schema of the
structured result), ``on_failure`` (a policy word, or a mapping with ``policy``,
``attempts``, ``agent``, ``then``), ``outcome`` (what a completed run's result declares,
e.g. ``change_ready_for_approval``) and ``version`` (a whole number, default 1).

Every problem is a ``ConfigError`` reading ``FILE:LINE: message`` — the line of the
offending key or list item — so a person can go straight to it; problems of the whole
file (its name, size or encoding) read ``FILE: message``. YAML is read with the safe
loader only (no tags that build objects); aliases are refused, nesting is at most ``MAX_NESTING``
deep and files are at most ``MAX_SPEC_BYTES``, so a small file cannot expand into a huge
value or overflow the stack. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal, NoReturn, cast

import yaml
from jsonschema.exceptions import SchemaError
from jsonschema.validators import validator_for

from keel.core.budget import MAX_COUNT, MAX_SECONDS, Budget
from keel.core.errors import ConfigError
from keel.core.verifiers import OUTCOME_NAME

MAX_SPEC_BYTES = 64 * 1024
NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
NAME_RULE = "1 to 63 characters of a-z, 0-9, '_' and '-', beginning with a letter or digit"
# Permission modes from the least to the most permissive (keel.policy.modes; a test
# checks this order against the mode defaults there, since core cannot import policy).
MODES: tuple[str, ...] = ("plan", "ask", "edit", "auto")
WorkspaceKind = Literal["isolated", "shared-readonly", "shared"]
WORKSPACES: tuple[WorkspaceKind, ...] = ("isolated", "shared-readonly", "shared")
MAX_RETRY_ATTEMPTS = 5
MAX_NESTING = 64  # levels of lists and mappings in the front matter
KEYS: tuple[str, ...] = (
    "description",
    "model",
    "tools",
    "mode",
    "workspace",
    "budget",
    "verify",
    "output",
    "on_failure",
    "version",
    "outcome",
)
BUDGET_KEYS: tuple[str, ...] = ("steps", "tool_calls", "tokens", "cost", "wall_seconds")
ON_FAILURE_KEYS: tuple[str, ...] = ("policy", "attempts", "agent", "then")


class FailurePolicy(StrEnum):
    FAIL_FAST = "fail_fast"  # the parent's call fails at once with the child's error
    BEST_EFFORT = "best_effort"  # the parent gets whatever partial result the child left
    RETRY = "retry"  # up to N fresh children (maybe of another spec), then a fallback policy
    ESCALATE = "escalate"  # a person is asked what to do


@dataclass(frozen=True, slots=True, kw_only=True)
class OnFailure:
    """What the parent does when a child fails. ``attempts``, ``agent`` and ``then`` only
    mean something for RETRY: ``attempts`` fresh children (1..5), each of spec ``agent``
    (None = the same spec), and policy ``then`` (never RETRY) once they all failed."""

    policy: FailurePolicy = FailurePolicy.FAIL_FAST
    attempts: int = 1
    agent: str | None = None
    then: FailurePolicy = FailurePolicy.FAIL_FAST


@dataclass(frozen=True, kw_only=True)
class AgentSpec:
    """One parsed, valid agent spec. ``None`` for ``model``, ``tools``, ``mode`` and
    ``budget`` means "the parent's"; ``digest`` is the sha256 (hex) of the exact file
    bytes, recorded when a child is spawned; ``source`` is the file's path or
    ``builtin:NAME``. Unset budget dimensions are ``None`` (the spec sets no limit of its
    own there; the spawner still bounds the child by what the parent has left)."""

    name: str
    description: str
    instructions: str
    model: str | None = None
    tools: tuple[str, ...] | None = None
    mode: str | None = None
    workspace: WorkspaceKind = "isolated"
    budget: Budget | None = None
    verify: tuple[str, ...] = ()
    output: dict[str, Any] | None = None
    on_failure: OnFailure = OnFailure()
    version: int = 1
    outcome: str | None = None
    digest: str
    source: str


def spec_digest(data: bytes) -> str:
    """The sha256 (hex) of a spec file's exact bytes: one changed byte changes it."""
    return hashlib.sha256(data).hexdigest()


def check_agent_name(name: str, source: str) -> None:
    """ConfigError naming ``source`` unless ``name`` is a valid agent name."""
    if not NAME_PATTERN.fullmatch(name):
        raise ConfigError(f"{source}: agent name {name!r} is not allowed: a name is {NAME_RULE}")


def mode_rank(mode: str) -> int:
    """0 for the least permissive mode (plan) up to 3 (auto); ConfigError for a non-mode."""
    try:
        return MODES.index(mode)
    except ValueError:
        raise ConfigError(f"unknown mode {mode!r}; choose one of {'|'.join(MODES)}") from None


def narrowed(
    spec: AgentSpec, *, parent_tools: Sequence[str], parent_mode: str
) -> tuple[tuple[str, ...], str]:
    """The tools and mode a child of ``spec`` gets under a parent: never more than the parent.

    Tools are the spec's allowlist intersected with the parent's, in the parent's order
    (all of the parent's when the spec has no allowlist); the mode is the less permissive
    of the spec's and the parent's (the parent's when the spec names none).
    """
    parent_rank = mode_rank(parent_mode)
    seen: set[str] = set()
    allowed = None if spec.tools is None else set(spec.tools)
    tools: list[str] = []
    for tool in parent_tools:
        if tool not in seen and (allowed is None or tool in allowed):
            seen.add(tool)
            tools.append(tool)
    mode = parent_mode
    if spec.mode is not None and mode_rank(spec.mode) < parent_rank:
        mode = spec.mode
    return tuple(tools), mode


def parse_agent_spec(
    data: bytes,
    *,
    name: str,
    source: str,
    known_tools: Collection[str],
    known_agents: Collection[str] | None = None,
) -> AgentSpec:
    """The spec in ``data`` (a file's exact bytes), or a ConfigError ``SOURCE:LINE: ...``.

    ``known_tools`` are the tool names an allowlist may use; ``known_agents``, when
    given, the names ``on_failure.agent`` may use (None: any well-formed name).
    """
    check_agent_name(name, source)
    if len(data) > MAX_SPEC_BYTES:
        raise ConfigError(
            f"{source}: {len(data)} bytes, over the limit of {MAX_SPEC_BYTES} bytes "
            "for an agent spec"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(f"{source}:{line}: not UTF-8 text (at byte offset {exc.start})") from None
    parser = _Parser(source, known_tools, known_agents)
    return parser.parse(text.removeprefix("\ufeff"), name=name, digest=spec_digest(data))


# --- the parser -----------------------------------------------------------------------------

_FRONT_LINE = 2  # the front matter's first line (after the opening ---) in the file
_TYPE_NAMES = {
    "str": "a string",
    "int": "a whole number",
    "float": "a number",
    "bool": "true/false",
    "list": "a list",
    "dict": "a mapping",
    "NoneType": "nothing (null)",
}


def _kind(value: object) -> str:
    """What ``value`` is, for a message: a string is shown as it is, anything else by type."""
    if isinstance(value, str):
        return repr(value) if len(value) <= 40 else repr(value[:39]) + "…"
    return _TYPE_NAMES.get(type(value).__name__, type(value).__name__)


class _Parser:
    """One file's parse: keeps the source name and turns YAML marks into file lines."""

    def __init__(
        self, source: str, known_tools: Collection[str], known_agents: Collection[str] | None
    ) -> None:
        self.source = source
        self.known_tools = known_tools
        self.known_agents = known_agents

    def fail(self, line: int, message: str) -> NoReturn:
        raise ConfigError(f"{self.source}:{line}: {message}")

    def line_of(self, node: yaml.Node) -> int:
        return int(node.start_mark.line) + _FRONT_LINE

    def parse(self, text: str, *, name: str, digest: str) -> AgentSpec:
        front, body, body_line = self.split(text)
        root = self.compose(front)
        if root is None:
            self.fail(1, _missing_description())
        if not isinstance(root, yaml.MappingNode):
            self.fail(
                self.line_of(root),
                f"the front matter must be a mapping of keys ({', '.join(KEYS)}), "
                f"got {_node_kind(root)}",
            )
        entries = self.mapping(root, KEYS, "the front matter")
        if "description" not in entries:
            self.fail(1, _missing_description())
        instructions = body.strip()
        if not instructions:
            self.fail(
                body_line,
                "the body is empty: write the agent's instructions after the closing '---'",
            )
        key_line = {key: self.line_of(k) for key, (k, _) in entries.items()}
        values = {key: self.value(v) for key, (_, v) in entries.items()}

        def text_value(key: str) -> str | None:
            if key not in values:
                return None
            value = values[key]
            if not isinstance(value, str) or not value.strip():
                self.fail(key_line[key], f"{key} must be a non-empty string, got {_kind(value)}")
            return value.strip()

        description = cast(str, text_value("description"))
        model = text_value("model")
        if model is not None:
            provider, sep, rest = model.partition(":")
            if not sep or not provider.strip() or not rest.strip():
                self.fail(
                    key_line["model"],
                    f"model {model!r} is not a model spec: expected PROVIDER:MODEL "
                    "(e.g. deepseek:deepseek-chat) or scripted:PATH",
                )
        mode = text_value("mode")
        if mode is not None and mode not in MODES:
            self.fail(key_line["mode"], f"mode {mode!r} is not a mode; one of {'|'.join(MODES)}")
        workspace = text_value("workspace") or "isolated"
        if workspace not in WORKSPACES:
            self.fail(
                key_line["workspace"],
                f"workspace {workspace!r} is not one of {'|'.join(WORKSPACES)}",
            )
        outcome = text_value("outcome")
        if outcome is not None and not OUTCOME_NAME.fullmatch(outcome):
            self.fail(
                key_line["outcome"],
                f"outcome must be a lowercase name such as change_ready_for_approval, "
                f"got {outcome!r}",
            )
        version = 1
        if "version" in values:
            version = values["version"]
            if isinstance(version, bool) or not isinstance(version, int) or version < 1:
                self.fail(
                    key_line["version"],
                    f"version must be a whole number of at least 1, got {version!r}",
                )
        return AgentSpec(
            name=name,
            description=description,
            instructions=instructions,
            model=model,
            tools=self.tools(*entries["tools"]) if "tools" in entries else None,
            mode=mode,
            workspace=workspace,
            budget=self.budget(*entries["budget"]) if "budget" in entries else None,
            verify=self.verify(*entries["verify"]) if "verify" in entries else (),
            output=self.output(*entries["output"]) if "output" in entries else None,
            on_failure=(
                self.on_failure(*entries["on_failure"]) if "on_failure" in entries else OnFailure()
            ),
            version=version,
            outcome=outcome,
            digest=digest,
            source=self.source,
        )

    # --- the file's shape -------------------------------------------------------------------

    def split(self, text: str) -> tuple[str, str, int]:
        """(front matter, body, the body's first line number)."""
        lines = text.split("\n")
        if lines[0].rstrip("\r") != "---":
            self.fail(
                1,
                "no front matter: an agent spec begins with a line '---', then YAML keys "
                "(description: ...), then a line '---', then the instructions",
            )
        for index in range(1, len(lines)):
            if lines[index].rstrip("\r") == "---":
                front = "\n".join(line.rstrip("\r") for line in lines[1:index])
                return front, "\n".join(lines[index + 1 :]), index + 2
        self.fail(1, "the front matter opened on line 1 is never closed by a line '---'")

    def compose(self, front: str) -> yaml.Node | None:
        """The front matter's node tree (safe loader), refusing aliases and nesting deeper
        than ``MAX_NESTING`` (building the tree is recursive: a deep one would overflow)."""
        try:
            depth = 0
            for event in yaml.parse(front, Loader=yaml.SafeLoader):
                if isinstance(event, yaml.CollectionStartEvent):
                    depth += 1
                    if depth > MAX_NESTING:
                        mark = event.start_mark
                        self.fail(
                            int(mark.line) + _FRONT_LINE if mark is not None else 1,
                            f"nested deeper than {MAX_NESTING} levels",
                        )
                elif isinstance(event, yaml.CollectionEndEvent):
                    depth -= 1
                elif isinstance(event, yaml.AliasEvent):
                    mark = event.start_mark
                    self.fail(
                        int(mark.line) + _FRONT_LINE if mark is not None else 1,
                        "YAML aliases (*name) are not allowed in an agent spec",
                    )
            return yaml.compose(front, Loader=yaml.SafeLoader)
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            line = int(mark.line) + _FRONT_LINE if mark is not None else 1
            problem = exc.problem or exc.context or "malformed"
            self.fail(line, f"invalid YAML: {problem}")
        except yaml.reader.ReaderError as exc:  # a character YAML refuses: it has no mark
            line = front[: exc.position].count("\n") + _FRONT_LINE
            self.fail(
                line, f"invalid YAML: unacceptable character #x{exc.character:04x}: {exc.reason}"
            )

    def value(self, node: yaml.Node) -> Any:
        """The Python value of ``node`` as the safe loader builds it."""
        try:
            loader = yaml.SafeLoader("")
            try:
                return loader.construct_document(node)
            finally:
                loader.dispose()
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or node.start_mark
            self.fail(int(mark.line) + _FRONT_LINE, f"invalid YAML: {exc.problem}")

    def mapping(
        self, node: yaml.MappingNode, allowed: Sequence[str], what: str
    ) -> dict[str, tuple[yaml.Node, yaml.Node]]:
        """``node``'s entries by key; unknown or repeated keys are errors at their line."""
        entries: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            if not isinstance(key, str) or key not in allowed:
                shown = repr(key) if isinstance(key, str) else f"({_node_kind(key_node)})"
                self.fail(
                    self.line_of(key_node),
                    f"unknown key {shown} in {what}; allowed: {', '.join(allowed)}",
                )
            if key in entries:
                self.fail(
                    self.line_of(key_node),
                    f"key {key!r} appears twice in {what} "
                    f"(first on line {self.line_of(entries[key][0])})",
                )
            entries[key] = (key_node, value_node)
        return entries

    # --- the structured keys ------------------------------------------------------------------

    def tools(self, key: yaml.Node, node: yaml.Node) -> tuple[str, ...]:
        if not isinstance(node, yaml.SequenceNode):
            self.fail(
                self.line_of(key), f"tools must be a list of tool names, got {_node_kind(node)}"
            )
        names: list[str] = []
        for item in node.value:
            value = self.value(item)
            if not isinstance(value, str):
                self.fail(self.line_of(item), f"a tool name must be a string, got {_kind(value)}")
            if value not in self.known_tools:
                self.fail(
                    self.line_of(item),
                    f"unknown tool {value!r}; known tools: {', '.join(sorted(self.known_tools))}",
                )
            if value in names:
                self.fail(self.line_of(item), f"tool {value!r} is listed twice")
            names.append(value)
        return tuple(names)

    def verify(self, key: yaml.Node, node: yaml.Node) -> tuple[str, ...]:
        if not isinstance(node, yaml.SequenceNode):
            self.fail(
                self.line_of(key), f"verify must be a list of commands, got {_node_kind(node)}"
            )
        commands: list[str] = []
        for item in node.value:
            value = self.value(item)
            if not isinstance(value, str) or not value.strip():
                self.fail(
                    self.line_of(item),
                    f"a verify command must be a non-empty string, got {_kind(value)}",
                )
            commands.append(value.strip())
        return tuple(commands)

    def budget(self, key: yaml.Node, node: yaml.Node) -> Budget:
        if not isinstance(node, yaml.MappingNode):
            self.fail(
                self.line_of(key),
                f"budget must be a mapping with any of {', '.join(BUDGET_KEYS)}, "
                f"got {_node_kind(node)}",
            )
        entries = self.mapping(node, BUDGET_KEYS, "budget")
        if not entries:
            self.fail(self.line_of(key), f"budget is empty; give any of {', '.join(BUDGET_KEYS)}")
        counts: dict[str, int] = {}  # front-matter key -> limit
        amounts: dict[str, float] = {}
        for name, (key_node, value_node) in entries.items():
            value = self.value(value_node)
            line = self.line_of(key_node)
            if name in ("cost", "wall_seconds"):
                number = value if isinstance(value, int | float) else None
                if isinstance(value, bool) or number is None:
                    self.fail(line, f"budget.{name} must be a number, got {_kind(value)}")
                high = MAX_SECONDS if name == "wall_seconds" else math.inf
                if not (math.isfinite(number) and 0 < number <= high):
                    bound = f" and at most {MAX_SECONDS}" if name == "wall_seconds" else ""
                    self.fail(
                        line, f"budget.{name} must be a finite number above 0{bound}, got {value!r}"
                    )
                amounts[name] = float(number)
            else:
                if isinstance(value, bool) or not isinstance(value, int):
                    self.fail(line, f"budget.{name} must be a whole number, got {_kind(value)}")
                if not 1 <= value <= MAX_COUNT:
                    self.fail(line, f"budget.{name} must be from 1 to {MAX_COUNT}, got {value!r}")
                counts[name] = value
        return Budget(
            max_steps=counts.get("steps"),
            max_tool_calls=counts.get("tool_calls"),
            max_tokens=counts.get("tokens"),
            max_cost=amounts.get("cost"),
            max_wall_seconds=amounts.get("wall_seconds"),
        )

    def output(self, key: yaml.Node, node: yaml.Node) -> dict[str, Any]:
        value = self.value(node)
        if not isinstance(value, dict):
            self.fail(
                self.line_of(key), f"output must be a JSON schema (a mapping), got {_kind(value)}"
            )
        try:
            validator_for(value).check_schema(value)
        except SchemaError as exc:
            where = "/".join(str(part) for part in exc.path)
            at = f" at {where}" if where else ""
            self.fail(
                self.line_of(_node_at(node, list(exc.path)) or key),
                f"output is not a valid JSON schema{at}: {exc.message}",
            )
        return cast(dict[str, Any], value)

    def on_failure(self, key: yaml.Node, node: yaml.Node) -> OnFailure:
        if isinstance(node, yaml.ScalarNode):
            policy = self.policy(key, self.value(node), "on_failure")
            return OnFailure(policy=policy)
        if not isinstance(node, yaml.MappingNode):
            self.fail(
                self.line_of(key),
                "on_failure must be a policy word or a mapping "
                f"({', '.join(ON_FAILURE_KEYS)}), got {_node_kind(node)}",
            )
        entries = self.mapping(node, ON_FAILURE_KEYS, "on_failure")
        if "policy" not in entries:
            self.fail(self.line_of(key), "on_failure has no 'policy'")
        policy = self.policy(entries["policy"][0], self.value(entries["policy"][1]), "policy")
        if policy is not FailurePolicy.RETRY:
            for extra in ("attempts", "agent", "then"):
                if extra in entries:
                    self.fail(
                        self.line_of(entries[extra][0]),
                        f"on_failure.{extra} only applies to policy retry, not {policy.value}",
                    )
            return OnFailure(policy=policy)
        attempts = 1
        if "attempts" in entries:
            attempts = self.value(entries["attempts"][1])
            if (
                isinstance(attempts, bool)
                or not isinstance(attempts, int)
                or not 1 <= attempts <= MAX_RETRY_ATTEMPTS
            ):
                self.fail(
                    self.line_of(entries["attempts"][0]),
                    f"on_failure.attempts must be a whole number from 1 to "
                    f"{MAX_RETRY_ATTEMPTS}, got {attempts!r}",
                )
        agent = None
        if "agent" in entries:
            agent = self.value(entries["agent"][1])
            line = self.line_of(entries["agent"][0])
            if not isinstance(agent, str) or not NAME_PATTERN.fullmatch(agent):
                self.fail(
                    line, f"on_failure.agent must be an agent name ({NAME_RULE}), got {agent!r}"
                )
            if self.known_agents is not None and agent not in self.known_agents:
                self.fail(
                    line,
                    f"on_failure.agent names unknown agent {agent!r}; available: "
                    f"{', '.join(sorted(self.known_agents))}",
                )
        then = FailurePolicy.FAIL_FAST
        if "then" in entries:
            then = self.policy(entries["then"][0], self.value(entries["then"][1]), "then")
            if then is FailurePolicy.RETRY:
                self.fail(
                    self.line_of(entries["then"][0]),
                    "on_failure.then cannot be retry: give fail_fast, best_effort or escalate",
                )
        return OnFailure(policy=policy, attempts=attempts, agent=agent, then=then)

    def policy(self, key: yaml.Node, value: object, label: str) -> FailurePolicy:
        choices = "|".join(p.value for p in FailurePolicy)
        if isinstance(value, str):
            try:
                return FailurePolicy(value.strip().lower())
            except ValueError:
                pass
        self.fail(self.line_of(key), f"{label} {value!r} is not a failure policy; one of {choices}")


def _missing_description() -> str:
    return "the front matter has no 'description' (one line saying what this agent is for)"


def _node_kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return "a single value"


def _node_at(node: yaml.Node, path: list[Any]) -> yaml.Node | None:
    """The node at ``path`` (mapping keys and list indexes) below ``node``, or the deepest
    one found (its key's node for a mapping entry, so the line is the key's)."""
    found: yaml.Node | None = None
    for part in path:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if isinstance(key_node, yaml.ScalarNode) and key_node.value == str(part):
                    found, node = key_node, value_node
                    break
            else:
                return found
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if not 0 <= part < len(node.value):
                return found
            node = node.value[part]
            found = node
        else:
            return found
    return found
