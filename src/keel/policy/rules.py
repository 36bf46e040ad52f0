"""User rules on top of the mode defaults, loaded from ``.keel/policy.toml`` or ``--policy``.

A policy file is a list of ``[[rule]]`` tables::

    [[rule]]
    action = "deny"              # allow | ask | deny
    tool = "run_command"         # fnmatch glob on the tool name
    argv = "git push*"           # glob on argv joined by spaces, or a list of
                                 # per-argument globs matching a prefix of argv
    path = "secrets/*"           # glob on the workspace-relative path argument
    reason = "never push from an agent"

All matchers given must match; a rule needs at least one. Among matching rules
deny beats ask beats allow, whatever their order. A rule may tighten or loosen
the mode default, except in plan mode and for paths outside the workspace,
where rules can only make the decision stricter. Globs are matched case-
sensitively (``fnmatchcase``) so a resumed run decides the same on any machine;
``*`` also matches ``/``.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, cast

from keel.core.errors import ConfigError
from keel.policy.modes import ACTIONS, Action, Decision, Mode, mode_default, strictness

POLICY_FILE = Path(".keel") / "policy.toml"
RULE_KEYS = ("action", "tool", "argv", "path", "reason")
MATCHER_KEYS = ("tool", "argv", "path")
# Tools whose ``path`` argument is optional, and what it means when omitted (SPEC tool table).
PATH_DEFAULTS = {"list_dir": ".", "grep": "."}


@dataclass(frozen=True, slots=True, kw_only=True)
class Rule:
    """One ``[[rule]]``; ``origin`` is ``FILE:LINE`` where it is written."""

    action: Action
    tool: str | None = None
    argv: str | tuple[str, ...] | None = None
    path: str | None = None
    reason: str | None = None
    origin: str = ""

    def describe(self) -> str:
        """E.g. ``policy.toml:12 deny run_command argv='git push*'``."""
        parts = [p for p in (self.origin, self.action, self.tool) if p]
        if self.argv is not None:
            argv = self.argv if isinstance(self.argv, str) else list(self.argv)
            parts.append(f"argv={argv!r}")
        if self.path is not None:
            parts.append(f"path={self.path!r}")
        return " ".join(parts)

    def matches(self, tool: str, arguments: Mapping[str, Any], rel_path: str | None) -> bool:
        if self.tool is not None and not fnmatchcase(tool, self.tool):
            return False
        if self.argv is not None and not _argv_matches(self.argv, arguments.get("argv")):
            return False
        return self.path is None or (rel_path is not None and fnmatchcase(rel_path, self.path))

    def decision(self) -> Decision:
        rule = self.describe()
        default = {
            "allow": f"allowed by policy rule {rule}",
            "ask": f"needs approval under policy rule {rule}",
            "deny": f"refused by policy rule {rule}",
        }[self.action]
        return Decision(
            action=self.action,
            rule=rule,
            reason=self.reason or default,
            permanent=self.action == "deny",
        )

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"action": self.action, "origin": self.origin}
        if self.tool is not None:
            d["tool"] = self.tool
        if self.argv is not None:
            d["argv"] = self.argv if isinstance(self.argv, str) else list(self.argv)
        if self.path is not None:
            d["path"] = self.path
        if self.reason is not None:
            d["reason"] = self.reason
        return d


def _argv_matches(pattern: str | tuple[str, ...], argv: Any) -> bool:
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        return False
    if isinstance(pattern, str):
        return fnmatchcase(" ".join(argv), pattern)
    return len(argv) >= len(pattern) and all(map(fnmatchcase, argv, pattern))


def workspace_relative(path: str, workspace: Path) -> str | None:
    """``path`` relative to ``workspace`` in ``/`` form (``.`` for the root), or None if outside.

    Purely lexical (``..`` is folded, symlinks are not followed): the file tools
    resolve symlinks and refuse escapes themselves.
    """
    root = os.path.normpath(str(workspace))
    full = os.path.normpath(os.path.join(root, path))
    if full == root:
        return "."
    prefix = root.rstrip(os.sep) + os.sep
    if not full.startswith(prefix):
        return None
    return full[len(prefix) :].replace(os.sep, "/")


@dataclass(frozen=True, slots=True)
class Policy:
    """The user's rules (possibly none) and where they came from; decides every call."""

    rules: tuple[Rule, ...] = ()
    source: str | None = None

    def decide(
        self,
        tool: str,
        effect: str,
        arguments: Mapping[str, Any],
        *,
        mode: Mode,
        workspace: Path,
    ) -> Decision:
        """Allow, ask or deny one call: matching user rules first, then the mode default."""
        base = mode_default(tool, effect, mode)
        only_tighten = mode is Mode.PLAN  # plan mode: no rule lets a write through
        rel_path = None
        path_arg = arguments.get("path", PATH_DEFAULTS.get(tool))
        if isinstance(path_arg, str):
            rel_path = workspace_relative(path_arg, workspace)
            if rel_path is None:
                # No mode (not even auto) and no allow rule lets a call reach outside the
                # workspace. The file tools refuse such paths too (and catch symlink escapes,
                # which this lexical check cannot); refusing here means no one is asked.
                base = Decision(
                    action="deny",
                    rule="workspace",
                    reason=f"path {path_arg!r} is outside the workspace {workspace}; "
                    "use a path inside it",
                )
                only_tighten = True
        matching = [r for r in self.rules if r.matches(tool, arguments, rel_path)]
        if not matching:
            return base
        strongest = max(matching, key=lambda r: strictness(r.action))  # first of equals
        if only_tighten and strictness(strongest.action) <= strictness(base.action):
            return base
        return strongest.decision()

    # --- storage (RunOptions.policy) ------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form kept in the run's options so any process enforces the same rules."""
        return {"source": self.source, "rules": [r.to_dict() for r in self.rules]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> Policy:
        """Inverse of ``to_dict``; None means no rules. Raises ConfigError if malformed."""
        if d is None:
            return cls()
        raw_rules = d.get("rules", [])
        if not isinstance(raw_rules, list):
            raise ConfigError("stored policy: 'rules' must be a list")
        rules = []
        for n, raw in enumerate(raw_rules, start=1):

            def where(_key: str | None, n: int = n) -> str:
                return f"stored policy rule {n}"

            origin = raw.get("origin", "") if isinstance(raw, dict) else ""
            allowed = (*RULE_KEYS, "origin")
            rules.append(_parse_rule(raw, allowed=allowed, origin=str(origin), where=where))
        source = d.get("source")
        return cls(rules=tuple(rules), source=source if isinstance(source, str) else None)

    @classmethod
    def from_sources(cls, cwd: Path, policy_file: Path | None = None) -> Policy:
        """``--policy FILE`` if given, else ``CWD/.keel/policy.toml`` if present, else no rules."""
        if policy_file is not None:
            return load_policy(policy_file)
        default = cwd / POLICY_FILE
        return load_policy(default) if default.is_file() else cls()


# --- loading ---------------------------------------------------------------------------


def load_policy(path: Path) -> Policy:
    """Read and check a policy file; ConfigError messages start with ``FILE:LINE:``."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: policy file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read policy file: {exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        found = re.search(r"at line (\d+)", str(exc))
        line = found.group(1) if found else "1"
        raise ConfigError(f"{path}:{line}: invalid TOML: {exc}") from None
    lines = _LineIndex(text)
    for key in data:
        if key != "rule":
            raise ConfigError(
                f"{path}:{lines.top(key)}: unknown key {key!r}; a policy file holds only "
                "[[rule]] tables"
            )
    raw_rules = data.get("rule", [])
    if not isinstance(raw_rules, list):
        raise ConfigError(f"{path}:{lines.top('rule')}: 'rule' must be written as [[rule]] tables")
    rules = []
    for n, raw in enumerate(raw_rules):
        header = lines.rule(n)

        def where(key: str | None, n: int = n, header: int = header) -> str:
            line = header if key is None else lines.key(n, key)
            return f"{path}:{line}: rule {n + 1}"

        rules.append(_parse_rule(raw, allowed=RULE_KEYS, origin=f"{path}:{header}", where=where))
    return Policy(rules=tuple(rules), source=str(path))


def _parse_rule(
    raw: Any, *, allowed: tuple[str, ...], origin: str, where: Callable[[str | None], str]
) -> Rule:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where(None)}: a rule must be a table")
    for key in raw:
        if key not in allowed:
            raise ConfigError(
                f"{where(key)}: unknown key {key!r}; allowed keys: {', '.join(RULE_KEYS)}"
            )
    action = raw.get("action")
    if action not in ACTIONS:
        raise ConfigError(
            f"{where('action' if 'action' in raw else None)}: action must be one of "
            f"{', '.join(ACTIONS)}, not {action!r}"
        )
    for key in ("tool", "path", "reason"):
        if key in raw and not isinstance(raw[key], str):
            raise ConfigError(f"{where(key)}: {key} must be a string, not {raw[key]!r}")
    argv = raw.get("argv")
    if argv is not None and not (
        isinstance(argv, str)
        or (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv))
    ):
        raise ConfigError(
            f"{where('argv')}: argv must be a glob string or a non-empty list of globs, "
            f"not {argv!r}"
        )
    if not any(key in raw for key in MATCHER_KEYS):
        raise ConfigError(
            f"{where(None)}: a rule needs at least one of tool, argv, path "
            '(use tool = "*" to match every call)'
        )
    return Rule(
        action=cast(Action, action),
        tool=raw.get("tool"),
        argv=tuple(argv) if isinstance(argv, list) else argv,
        path=raw.get("path"),
        reason=raw.get("reason"),
        origin=origin,
    )


_RULE_HEADER = re.compile(r"^\s*\[\[\s*rule\s*\]\]")
_TABLE_HEADER = re.compile(r"^\s*\[+\s*([A-Za-z0-9_.\"'-]+)")
_KEY_LINE = re.compile(r"^\s*[\"']?([A-Za-z0-9_-]+)[\"']?\s*=")


class _LineIndex:
    """Where each ``[[rule]]`` and key is written, for error messages (1-based lines).

    A line scanner, not a TOML parser: good enough to point at the right line in
    ordinary files; when it cannot tell, it points at the rule's header or line 1.
    """

    def __init__(self, text: str) -> None:
        self._rules: list[int] = []
        self._rule_keys: list[dict[str, int]] = []
        self._top: dict[str, int] = {}
        section = "top"  # or "rule" (keys go to the latest rule) or "other"
        for number, line in enumerate(text.splitlines(), start=1):
            if _RULE_HEADER.match(line):
                self._rules.append(number)
                self._rule_keys.append({})
                self._top.setdefault("rule", number)
                section = "rule"
            elif header := _TABLE_HEADER.match(line):
                self._top.setdefault(header.group(1).strip("\"'").split(".")[0], number)
                section = "other"
            elif key := _KEY_LINE.match(line):
                if section == "top":
                    self._top.setdefault(key.group(1), number)
                elif section == "rule":
                    self._rule_keys[-1].setdefault(key.group(1), number)

    def top(self, key: str) -> int:
        return self._top.get(key, 1)

    def rule(self, n: int) -> int:
        return self._rules[n] if n < len(self._rules) else self.top("rule")

    def key(self, n: int, key: str) -> int:
        if n < len(self._rule_keys):
            return self._rule_keys[n].get(key, self.rule(n))
        return self.rule(n)


__all__ = ["POLICY_FILE", "Policy", "Rule", "load_policy", "workspace_relative"]
