"""User rules on top of the mode defaults, loaded from ``.keel/policy.toml`` or ``--policy``.

A policy file is a list of ``[[rule]]`` tables, and optionally lists of paths::

    protected = ["deploy/*"]     # never written by the model (as .keel/ is)
    secret = ["credentials/*"]   # reading needs approval; left out of listings and diffs

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
sensitively (``fnmatchcase``); ``*`` also matches ``/``.

Rules match what a call *does*, not only how it is spelled:

- ``argv`` is matched against the command as ``normalise_command`` reads it:
  every simple command it runs (through wrappers, ``sh -c`` strings, ``find
  -exec``...), each in several spellings (as written, program name without
  its directory, real program name after PATH lookup and symbolic links, git
  with its global options dropped and plumbing named as porcelain). A deny or
  ask rule matches when *any* spelling of *any* simple command matches; an
  allow rule only when the normal spelling of *every* simple command matches
  and nothing was left unread. When part of a command cannot be read (``$(...)``,
  ``python -c``, ``eval``, ``xargs``...) and a deny or ask ``argv`` rule could
  apply to the call, the call needs approval, naming the rule.
- ``path`` is matched against the path as written (relative to the workspace)
  and against the real path with symbolic links followed. A deny or ask rule
  matches either; an allow rule must match the real path.

These rules state intent; the OS sandbox is what confines commands.
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
from keel.policy.commands import CommandView, normalise_command
from keel.policy.modes import ACTIONS, Action, Decision, Mode, mode_default, strictness
from keel.policy.resolution import resolve

POLICY_FILE = Path(".keel") / "policy.toml"
RULE_KEYS = ("action", "tool", "argv", "path", "reason")
MATCHER_KEYS = ("tool", "argv", "path")
PATH_LISTS = ("protected", "secret")  # top-level keys of a policy file besides [[rule]]
# Tools whose ``path`` argument is optional, and what it means when omitted (SPEC tool table).
PATH_DEFAULTS = {"list_dir": ".", "grep": "."}
# Tools that only read; a deny rule on a path applying to them hides it from listings too.
READ_TOOLS = ("read_file", "list_dir", "glob", "grep")


@dataclass(frozen=True, slots=True, kw_only=True)
class Call:
    """One proposed call as the rules read it."""

    tool: str
    command: CommandView | None = None  # what ``argv`` runs (None: the call has no argv)
    path: str | None = None  # workspace-relative as written (None: no path, or outside)
    real_path: str | None = None  # workspace-relative with symlinks followed (None: outside)


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

    def matches(self, call: Call) -> bool:
        """True when every matcher matches; see the module docstring for argv and path."""
        if not self.applies_to(call):
            return False
        if self.argv is not None:
            if call.command is None:
                return False
            if self.action == "allow":
                view = call.command
                if view.opaque is not None or not view.forms:
                    return False
                return all(_argv_matches(self.argv, form.normal) for form in view.forms)
            return any(
                _argv_matches(self.argv, spelling)
                for form in call.command.forms
                for spelling in form.spellings
            )
        return True

    def applies_to(self, call: Call) -> bool:
        """The tool and path matchers (not ``argv``) match ``call``."""
        if self.tool is not None and not fnmatchcase(call.tool, self.tool):
            return False
        if self.path is None:
            return True
        if self.action == "allow":
            return call.real_path is not None and fnmatchcase(call.real_path, self.path)
        return any(p is not None and fnmatchcase(p, self.path) for p in (call.path, call.real_path))

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


def _argv_matches(pattern: str | tuple[str, ...], argv: tuple[str, ...]) -> bool:
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


def real_relative(path: str, workspace: Path) -> str | None:
    """``path`` relative to the workspace with every symbolic link followed, or None if outside.

    Resolution never fails: a path that does not exist yet resolves as far as it exists.
    """
    try:
        root, real = resolve(path, workspace)  # as the file tools spell it
        return workspace_relative(real, Path(root))
    except (OSError, ValueError):
        return None


@dataclass(frozen=True, slots=True)
class Policy:
    """The user's rules and path lists (possibly none) and where they came from."""

    rules: tuple[Rule, ...] = ()
    source: str | None = None
    protected: tuple[str, ...] = ()  # path globs never written (PathGuard.protected)
    secret: tuple[str, ...] = ()  # path globs whose reading needs approval (PathGuard.secret)

    def decide(
        self,
        tool: str,
        effect: str,
        arguments: Mapping[str, Any],
        *,
        mode: Mode,
        workspace: Path,
        env: Mapping[str, str] | None = None,
    ) -> Decision:
        """Allow, ask or deny one call: matching user rules first, then the mode default.

        ``env`` supplies the PATH in which ``run_command`` programs are looked up
        (default: this process's environment).
        """
        base = mode_default(tool, effect, mode)
        only_tighten = mode is Mode.PLAN  # plan mode: no rule lets a write through
        call = self.read_call(tool, arguments, workspace=workspace, env=env)
        path_arg = arguments.get("path", PATH_DEFAULTS.get(tool))
        if isinstance(path_arg, str) and call.path is None:
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
        decisions = [r.decision() for r in self.rules if r.matches(call)]
        unread = self._unread_command(call)
        if unread is not None:
            decisions.append(unread)
        if not decisions:
            return base
        strongest = max(decisions, key=lambda d: strictness(d.action))  # first of equals
        if only_tighten and strictness(strongest.action) <= strictness(base.action):
            return base
        return strongest

    def read_call(
        self,
        tool: str,
        arguments: Mapping[str, Any],
        *,
        workspace: Path,
        env: Mapping[str, str] | None = None,
    ) -> Call:
        """``arguments`` as the rules read them: the command's forms, the path's spellings.

        The file system is only consulted (PATH lookup, symbolic links) when some
        rule has an ``argv`` or ``path`` matcher to check.
        """
        command = None
        argv = arguments.get("argv")
        if (
            any(r.argv is not None for r in self.rules)
            and isinstance(argv, list)
            and all(isinstance(a, str) for a in argv)
        ):
            search = (os.environ if env is None else env).get("PATH", os.defpath)
            command = normalise_command(argv, cwd=workspace, path=search)
        path_arg = arguments.get("path", PATH_DEFAULTS.get(tool))
        path = real = None
        if isinstance(path_arg, str):
            path = workspace_relative(path_arg, workspace)
            if path is not None and any(r.path is not None for r in self.rules):
                real = real_relative(path, workspace)
        return Call(tool=tool, command=command, path=path, real_path=real)

    def _unread_command(self, call: Call) -> Decision | None:
        """Ask when part of the command cannot be read and a deny/ask argv rule could apply."""
        if call.command is None or call.command.opaque is None:
            return None
        for rule in self.rules:
            if rule.action != "allow" and rule.argv is not None and rule.applies_to(call):
                described = rule.describe()
                return Decision(
                    action="ask",
                    rule=described,
                    reason=f"this command cannot be checked against policy rule {described}: "
                    f"{call.command.opaque}; a person must approve it",
                )
        return None

    def read_denied_paths(self) -> tuple[str, ...]:
        """Path globs of deny rules that apply to reading tools (for ``PathGuard.hidden``).

        Directory-wide tools (``list_dir``, ``glob``, ``grep``) leave these out, so a
        denied file is not read by searching its folder instead.
        """
        globs = (
            rule.path
            for rule in self.rules
            if rule.action == "deny"
            and rule.path is not None
            and rule.argv is None
            and (rule.tool is None or any(fnmatchcase(t, rule.tool) for t in READ_TOOLS))
        )
        return tuple(dict.fromkeys(g for g in globs if g is not None))

    # --- storage (RunOptions.policy) ------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form kept in the run's options so any process enforces the same rules."""
        d: dict[str, Any] = {"source": self.source, "rules": [r.to_dict() for r in self.rules]}
        if self.protected:
            d["protected"] = list(self.protected)
        if self.secret:
            d["secret"] = list(self.secret)
        return d

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
        lists = {key: _path_list(d.get(key, []), f"stored policy: {key!r}") for key in PATH_LISTS}
        return cls(
            rules=tuple(rules),
            source=source if isinstance(source, str) else None,
            protected=lists["protected"],
            secret=lists["secret"],
        )

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
        if key != "rule" and key not in PATH_LISTS:
            raise ConfigError(
                f"{path}:{lines.top(key)}: unknown key {key!r}; a policy file holds only "
                "[[rule]] tables and the path lists protected = [...] and secret = [...]"
            )
    lists = {key: _path_list(data.get(key, []), f"{path}:{lines.top(key)}") for key in PATH_LISTS}
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
    return Policy(
        rules=tuple(rules),
        source=str(path),
        protected=lists["protected"],
        secret=lists["secret"],
    )


def _path_list(raw: Any, where: str) -> tuple[str, ...]:
    """A list of path globs, or a ConfigError saying where it is written."""
    if not isinstance(raw, list) or not all(isinstance(p, str) and p for p in raw):
        raise ConfigError(f"{where}: must be a list of path globs, not {raw!r}")
    return tuple(raw)


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


_RULE_HEADER = re.compile(r"""^\s*\[\[\s*(["']?)rule\1\s*\]\]""")  # [[rule]], [["rule"]]...
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


__all__ = [
    "PATH_DEFAULTS",
    "POLICY_FILE",
    "READ_TOOLS",
    "Call",
    "Policy",
    "Rule",
    "load_policy",
    "real_relative",
    "workspace_relative",
]
