"""An evaluation suite file (``keel eval SUITE``): cases to run N times, and configurations.

    name = "coding"                       # default: the file's name without .toml
    repetitions = 3                       # attempts per case (default 1)
    [defaults]                            # any case key, for every case
    mode = "auto"
    budget = { steps = 20, tool_calls = 40 }
    [[cases]]
    name = "fix-pin"
    goal = "..."
    workspace = "fixtures/inventory"      # a folder copied fresh for every attempt,
    # git = "URL@REF"                     # or a git source checked out for every attempt
    model = "scripted:scripts/fix-pin.json"
    verify = ["unit_tests=python3 -m unittest"]
    expect = { status = "completed", outcome = "change_ready_for_approval" }
    [configs.baseline]                    # what ``--compare A,B`` varies
    model = "scripted:scripts/{case}.json"
    [configs.candidate]
    instructions = "Be brief."

Case keys: ``name``, ``goal`` (required), ``workspace`` or ``git`` (one of them),
``model``, ``instructions`` (text put before the goal), ``agent`` (an agent spec's
name), ``verify`` (commands, ``NAME=COMMAND`` names one), ``verify_human`` (people's
sign-offs), ``verify_agent`` (reviewer agents, ``NAME=AGENT``), ``outcome`` (what a
completed run declares), ``mode``, ``budget`` (``steps``, ``tool_calls``, ``tokens``,
``cost``, ``wall_seconds``), ``tools`` (the allowlist), ``policy`` (a policy file),
``expect`` (``status``, default ``completed``; ``outcome``; ``reason``: the stop
reason) and ``repetitions``. A configuration holds ``model``,
``instructions``, ``agent`` and ``middleware`` (entry point names); what it sets wins
over the case. Paths — ``workspace``, ``policy``, a local ``git`` source and the file
of a ``scripted:`` or ``replay:`` model — are relative to the suite file; ``{case}`` in
a model spec is the case's name. Pure: parses text; every error is one ConfigError
``FILE: WHERE: what is wrong``.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from keel.core.budget import Budget, check_amount, check_count, check_seconds
from keel.core.errors import ConfigError
from keel.core.verifiers import (
    check_outcome,
    check_reviewers,
    check_signoffs,
    named_verifiers,
)

NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
CONFIG_NAME: Final = re.compile(r"[a-z][a-z0-9_-]{0,31}")
DEFAULT_CONFIG: Final = "default"  # the cases as written, when nothing is compared
MAX_REPETITIONS: Final = 1000
SUITE_KEYS: Final = frozenset({"name", "repetitions", "defaults", "cases", "configs"})
CASE_KEYS: Final = frozenset(
    {
        "name",
        "goal",
        "workspace",
        "git",
        "model",
        "instructions",
        "agent",
        "verify",
        "verify_human",
        "verify_agent",
        "outcome",
        "mode",
        "budget",
        "tools",
        "policy",
        "expect",
        "repetitions",
    }
)
CONFIG_KEYS: Final = frozenset({"model", "instructions", "agent", "middleware"})
BUDGET_KEYS: Final = {  # suite key -> Budget field
    "steps": "max_steps",
    "tool_calls": "max_tool_calls",
    "tokens": "max_tokens",
    "cost": "max_cost",
    "wall_seconds": "max_wall_seconds",
}
EXPECT_KEYS: Final = frozenset({"status", "outcome", "reason"})
EXPECTABLE: Final = ("completed", "failed", "blocked", "cancelled", "waiting", "paused")
FILE_MODELS: Final = ("scripted:", "replay:")


@dataclass(frozen=True, slots=True, kw_only=True)
class Expectation:
    """What an attempt must end as to pass: its status, and its outcome and stop reason
    when given."""

    status: str = "completed"
    outcome: str | None = None
    reason: str | None = None

    def shortfall(self, status: str, outcome: str | None, reason: str | None) -> str | None:
        """Why an attempt that ended so misses this expectation; None when it meets it."""
        if status != self.status:
            return f"ended {status} ({reason or 'no reason'}), expected {self.status}"
        if self.outcome is not None and outcome != self.outcome:
            return f"outcome {outcome or 'none'}, expected {self.outcome}"
        if self.reason is not None and reason != self.reason:
            return f"stop reason {reason or 'none'}, expected {self.reason}"
        return None

    def to_dict(self) -> dict[str, str]:
        d = {"status": self.status}
        if self.outcome is not None:
            d["outcome"] = self.outcome
        if self.reason is not None:
            d["reason"] = self.reason
        return d


@dataclass(frozen=True, slots=True, kw_only=True)
class EvalCase:
    """One case of the suite, its defaults applied; paths absolute."""

    name: str
    where: str  # "cases[2]": where it is in the file, for errors found later
    goal: str
    workspace: Path | None = None
    git: str | None = None
    model: str | None = None
    instructions: str | None = None
    agent: str | None = None
    verify: tuple[str, ...] = ()
    verify_human: tuple[str, ...] = ()
    verify_agent: tuple[str, ...] = ()
    outcome: str | None = None
    mode: str = "edit"
    budget: Budget = field(default_factory=Budget)
    tools: tuple[str, ...] | None = None
    policy: Path | None = None
    expect: Expectation = field(default_factory=Expectation)
    repetitions: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class EvalConfig:
    """A configuration to compare: what it sets replaces the case's."""

    name: str
    model: str | None = None
    instructions: str | None = None
    agent: str | None = None
    middleware: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "instructions": self.instructions,
            "agent": self.agent,
            "middleware": list(self.middleware),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class EvalSuite:
    name: str
    source: str  # the file, as named in errors
    repetitions: int
    cases: tuple[EvalCase, ...]
    configs: Mapping[str, EvalConfig]

    def chosen_configs(self, names: Sequence[str] | None) -> tuple[EvalConfig, ...]:
        """The configurations ``--compare`` names (two, distinct, each in the file), or
        the cases as written (``default``) when none is named."""
        if not names:
            return (EvalConfig(name=DEFAULT_CONFIG),)
        if len(names) != 2 or names[0] == names[1]:
            raise ConfigError(f"--compare takes two different configurations A,B, got {names}")
        for name in names:
            if name not in self.configs:
                known = ", ".join(f"[configs.{n}]" for n in self.configs) or "none"
                raise ConfigError(
                    f"{self.source}: --compare: no configuration {name!r}; the suite has {known}"
                )
        return tuple(self.configs[name] for name in names)


def parse_suite(text: str, source: str, base: Path) -> EvalSuite:
    """The suite in ``text`` (``source`` names it in errors; relative paths are joined to
    ``base``, the file's folder). ConfigError ``SOURCE: WHERE: what is wrong``."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    unknown = sorted(set(data) - SUITE_KEYS)
    if unknown:
        raise ConfigError(
            f"{source}: unknown key {unknown[0]!r}; a suite has {', '.join(sorted(SUITE_KEYS))}"
        )
    name = data.get("name", Path(source).stem)
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ConfigError(f"{source}: name: {_NAME_RULE}, got {name!r}")
    repetitions = _repetitions(data.get("repetitions", 1), f"{source}: repetitions")
    defaults = data.get("defaults", {})
    if not isinstance(defaults, dict):
        raise ConfigError(f"{source}: defaults: a table of case keys")
    _check_case_keys(defaults, f"{source}: defaults")
    if "name" in defaults or "goal" in defaults:
        raise ConfigError(f"{source}: defaults: name and goal belong to each case")
    checked_defaults = _case_values(defaults, f"{source}: defaults", base)
    entries = data.get("cases")
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{source}: cases: give at least one [[cases]] table")
    if not all(isinstance(entry, dict) for entry in entries):
        raise ConfigError(f"{source}: cases: each case is a [[cases]] table")
    cases = tuple(
        _case(entry, checked_defaults, f"cases[{i}]", source, base)
        for i, entry in enumerate(entries)
    )
    names = [case.name for case in cases]
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice is not None:
        raise ConfigError(f"{source}: cases: two cases are named {twice!r}")
    return EvalSuite(
        name=name,
        source=source,
        repetitions=repetitions,
        cases=cases,
        configs=_configs(data.get("configs", {}), source, base),
    )


_NAME_RULE = "letters, digits, '_', '.' or '-' (at most 64), starting with a letter or digit"


def _check_case_keys(table: Mapping[str, Any], where: str) -> None:
    unknown = sorted(set(table) - CASE_KEYS)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key {unknown[0]!r}; a case has {', '.join(sorted(CASE_KEYS))}"
        )


def _case(
    entry: dict[str, Any], defaults: Mapping[str, Any], where: str, source: str, base: Path
) -> EvalCase:
    _check_case_keys(entry, f"{source}: {where}")
    name = entry.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ConfigError(f"{source}: {where}.name: {_NAME_RULE}, got {name!r}")
    goal = entry.get("goal")
    if goal is None:
        raise ConfigError(f"{source}: {where}.goal: missing: say what the run should achieve")
    if not isinstance(goal, str) or not goal.strip():
        raise ConfigError(f"{source}: {where}.goal: a non-empty text")
    values = {**defaults}
    own = _case_values(entry, f"{source}: {where}", base)
    for key in ("budget", "expect"):  # tables: the case's keys over the defaults'
        if key in own:
            values[key] = {**defaults.get(key, {}), **own.pop(key)}
    for mine, other in (("workspace", "git"), ("git", "workspace")):
        if mine in own and other not in own:
            values.pop(other, None)  # the case's own source replaces the default one
    values.update(own)
    if ("workspace" in values) == ("git" in values):
        raise ConfigError(
            f"{source}: {where}.workspace: give workspace = DIR (copied for every attempt) "
            "or git = URL@REF, one of them"
        )
    verify = values.get("verify", ())
    verify_human = values.get("verify_human", ())
    commands, verifier_names = named_verifiers(verify)
    try:
        check_signoffs(verify_human, verifier_names or commands)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {where}.verify_human: {exc}") from None
    verify_agent = values.get("verify_agent", ())
    try:
        check_reviewers(verify_agent, (*(verifier_names or commands), *verify_human))
    except ConfigError as exc:
        raise ConfigError(f"{source}: {where}.verify_agent: {exc}") from None
    return EvalCase(
        name=name,
        where=where,
        goal=goal,
        workspace=values.get("workspace"),
        git=values.get("git"),
        model=values.get("model"),
        instructions=values.get("instructions"),
        agent=values.get("agent"),
        verify=tuple(verify),
        verify_human=tuple(verify_human),
        verify_agent=tuple(verify_agent),
        outcome=values.get("outcome"),
        mode=values.get("mode", "edit"),
        budget=Budget(**{BUDGET_KEYS[k]: v for k, v in values.get("budget", {}).items()}),
        tools=values.get("tools"),
        policy=values.get("policy"),
        expect=Expectation(**values.get("expect", {})),
        repetitions=values.get("repetitions"),
    )


def _case_values(table: Mapping[str, Any], where: str, base: Path) -> dict[str, Any]:
    """The keys of a case (or of ``[defaults]``) that are given, each checked; paths
    joined to ``base``."""
    values: dict[str, Any] = {}
    for key in ("goal", "instructions", "agent", "outcome", "mode", "git", "model"):
        if key in table and (not isinstance(table[key], str) or not table[key].strip()):
            raise ConfigError(f"{where}.{key}: a non-empty text")
    for key in ("instructions", "agent", "mode"):
        if key in table:
            values[key] = table[key]
    if "outcome" in table:
        _with_where(f"{where}.outcome", check_outcome, table["outcome"])
        values["outcome"] = table["outcome"]
    if "model" in table:
        values["model"] = model_relative_to(table["model"], base)
    if "git" in table:
        values["git"] = git_relative_to(table["git"], base)
    for key in ("workspace", "policy"):
        if key in table:
            if not isinstance(table[key], str) or not table[key].strip():
                raise ConfigError(f"{where}.{key}: a path (relative to the suite file)")
            values[key] = base / table[key]
    for key in ("verify", "verify_human", "verify_agent", "tools"):
        if key in table:
            values[key] = _texts(table[key], f"{where}.{key}")
    if "verify" in values:
        _with_where(f"{where}.verify", named_verifiers, values["verify"])
    if "budget" in table:
        values["budget"] = _budget(table["budget"], f"{where}.budget")
    if "expect" in table:
        values["expect"] = _expect(table["expect"], f"{where}.expect")
    if "repetitions" in table:
        values["repetitions"] = _repetitions(table["repetitions"], f"{where}.repetitions")
    return values


def _budget(table: Any, where: str) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: a table such as {{ steps = 20, tool_calls = 40 }}")
    unknown = sorted(set(table) - set(BUDGET_KEYS))
    if unknown:
        raise ConfigError(
            f"{where}: unknown key {unknown[0]!r}; a budget has {', '.join(BUDGET_KEYS)}"
        )
    for key, value in table.items():
        label = f"{where}.{key}"
        if key == "cost":
            check_amount(label, value, unit="USD")
        elif key == "wall_seconds":
            check_seconds(label, value)
        else:
            check_count(label, value)
    return dict(table)


def _expect(table: Any, where: str) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise ConfigError(f'{where}: a table such as {{ status = "completed" }}')
    unknown = sorted(set(table) - EXPECT_KEYS)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key {unknown[0]!r}; expect has {', '.join(sorted(EXPECT_KEYS))}"
        )
    status = table.get("status", "completed")
    if status not in EXPECTABLE:
        raise ConfigError(f"{where}.status: one of {', '.join(EXPECTABLE)}, got {status!r}")
    for key in ("outcome", "reason"):
        if key in table and (not isinstance(table[key], str) or not table[key]):
            raise ConfigError(f"{where}.{key}: a non-empty text")
    if "outcome" in table:
        _with_where(f"{where}.outcome", check_outcome, table["outcome"])
    return dict(table)


def _configs(table: Any, source: str, base: Path) -> dict[str, EvalConfig]:
    if not isinstance(table, dict) or not all(isinstance(v, dict) for v in table.values()):
        raise ConfigError(f"{source}: configs: tables [configs.NAME]")
    configs: dict[str, EvalConfig] = {}
    for name, entry in table.items():
        where = f"{source}: configs.{name}"
        if not CONFIG_NAME.fullmatch(name) or name == DEFAULT_CONFIG:
            raise ConfigError(
                f"{where}: a configuration's name is lowercase letters, digits, '_' or '-' "
                f"(at most 32), not {DEFAULT_CONFIG!r}"
            )
        unknown = sorted(set(entry) - CONFIG_KEYS)
        if unknown:
            raise ConfigError(
                f"{where}: unknown key {unknown[0]!r}; a configuration has "
                f"{', '.join(sorted(CONFIG_KEYS))}"
            )
        for key in ("model", "instructions", "agent"):
            if key in entry and (not isinstance(entry[key], str) or not entry[key].strip()):
                raise ConfigError(f"{where}.{key}: a non-empty text")
        model = entry.get("model")
        configs[name] = EvalConfig(
            name=name,
            model=model_relative_to(model, base) if model is not None else None,
            instructions=entry.get("instructions"),
            agent=entry.get("agent"),
            middleware=_texts(entry.get("middleware", []), f"{where}.middleware"),
        )
    return configs


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptSettings:
    """What one configuration makes of one case: the run's model, goal and agent."""

    model: str
    goal: str
    agent: str | None


def attempt_settings(case: EvalCase, config: EvalConfig, source: str) -> AttemptSettings:
    """The configuration's model, instructions and agent over the case's; ``{case}`` in
    the model spec is the case's name. ConfigError when no model is given anywhere."""
    model = config.model or case.model
    if model is None:
        raise ConfigError(
            f"{source}: {case.where}.model: missing: give model = SPEC in the case, in "
            "[defaults] or in the configuration"
        )
    instructions = config.instructions or case.instructions
    return AttemptSettings(
        model=model.replace("{case}", case.name),
        goal=f"{instructions.strip()}\n\n{case.goal}" if instructions else case.goal,
        agent=config.agent or case.agent,
    )


def model_relative_to(spec: str, base: Path) -> str:
    """``scripted:PATH`` / ``replay:PATH`` with a relative PATH joined to ``base``; any
    other spec as it is."""
    for prefix in FILE_MODELS:
        if spec.startswith(prefix):
            path = Path(spec.removeprefix(prefix))
            return prefix + str(path if path.is_absolute() else base / path)
    return spec


def git_relative_to(source: str, base: Path) -> str:
    """``URL[@REF]`` with a relative local path joined to ``base``; a URL (``scheme://``
    or git's ``user@host:path``) as it is. The REF is what follows the last ``@`` when it
    holds no ``:`` or leading ``/`` (as ``keel.runtime.git_source.parse_source`` reads)."""
    source = source.strip()
    url, ref = source, ""
    head, at, tail = source.rpartition("@")
    if at and head and ":" not in tail and not tail.startswith("/"):
        url, ref = head, f"@{tail}"
    before, colon, _ = url.partition(":")
    remote = "://" in url or (bool(colon) and "/" not in before and len(before) > 1)
    if remote or Path(url).is_absolute():
        return source
    return f"{base / url}{ref}"


def _texts(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ConfigError(f"{where}: a list of non-empty texts")
    return tuple(value)


def _repetitions(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_REPETITIONS:
        raise ConfigError(f"{where}: a whole number from 1 to {MAX_REPETITIONS}, got {value!r}")
    return value


def _with_where(where: str, check: Callable[[Any], object], value: Any) -> None:
    try:
        check(value)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


__all__ = [
    "DEFAULT_CONFIG",
    "AttemptSettings",
    "EvalCase",
    "EvalConfig",
    "EvalSuite",
    "Expectation",
    "attempt_settings",
    "git_relative_to",
    "model_relative_to",
    "parse_suite",
]
