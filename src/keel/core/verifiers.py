"""Named verifiers and what a result's evidence is (pure).

A run's verifiers are commands (``--verify "pytest -q"``, or named:
``--verify unit_tests="pytest -q"``) and people's sign-offs (``--verify-human
security``). A command's name is what its evidence is filed under in the result; an
unnamed command is named by its command line. ``NAME=COMMAND`` names a verifier only
when NAME is lowercase (``[a-z][a-z0-9_-]*``), so ``FOO=1 pytest`` — an environment
assignment — stays a command.

A sign-off is recorded as a validation record whose command is ``human:NAME``, bound to
the mutation revision it approved like any verifier's: a later change makes it stale.

A reviewer agent (``--verify-agent review=reviewer``) is an independent child run of
an agent spec whose result lists ``blocking_issues``: it reviews the diff and the other
verifiers' evidence once those pass, and passes when it lists none. Its validation
record's command is ``agent:NAME``; its evidence is the review (the child's structured
result) as an artifact.

A gap is *fixable* when the agent can close it by working on: a failing or stale
verifier, a declined sign-off (the person said why), a review's blocking issues. A
command that cannot run at all (exit 126: not executable, 127: not found) is not: no
edit of the workspace makes the verifier exist, so the run ends ``blocked`` instead of
looping; nor is a reviewer that could not give a review (it failed, ran out of budget,
or could not be spawned) — its record says why (``ValidationRecord.unfixable``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from keel.core.errors import ConfigError

VERIFIER_NAME: Final = re.compile(r"[a-z][a-z0-9_-]{0,63}")
HUMAN_PREFIX: Final = "human:"
REVIEW_PREFIX: Final = "agent:"
BLOCKING_FIELD: Final = "blocking_issues"  # what a reviewer agent's result must list
CANNOT_RUN: Final = {126: "is not executable", 127: "was not found"}
DIFF_EVIDENCE: Final = "code_diff"  # the workspace's diff, filed with the evidence
DEFAULT_OUTCOME: Final = "task_completed"
OUTCOME_NAME: Final = re.compile(r"[a-z][a-z0-9_]{0,63}")
AGENT_NAME: Final = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")  # as agent specs are named


def split_verifier(text: str) -> tuple[str | None, str]:
    """``unit_tests=pytest -q`` -> ("unit_tests", "pytest -q"); a plain command -> (None, it)."""
    name, sep, command = text.partition("=")
    if sep and VERIFIER_NAME.fullmatch(name) and command.strip():
        return name, command.strip()
    return None, text


def named_verifiers(
    verify: Sequence[str] | Mapping[str, str],
) -> tuple[tuple[str, ...], tuple[str, ...] | None]:
    """The commands and, when any is named, every command's name (unnamed ones by their
    command line); ConfigError for an empty command, a bad name or one name twice."""
    pairs: list[tuple[str | None, str]]
    if isinstance(verify, Mapping):
        pairs = [(str(name), str(command)) for name, command in verify.items()]
        for name, _ in pairs:
            if not VERIFIER_NAME.fullmatch(name or ""):
                raise ConfigError(_bad_name(str(name)))
    else:
        pairs = [split_verifier(str(text)) for text in verify]
    commands = tuple(command for _, command in pairs)
    if any(not command.strip() for command in commands):
        raise ConfigError("a verifier's command is empty")
    names = tuple(name or command for name, command in pairs)
    _unique(names, "verifier")
    if len(set(commands)) != len(commands):
        twice = next(c for c in commands if commands.count(c) > 1)
        raise ConfigError(f"the verifier command {twice!r} is given twice")
    return commands, names if any(name for name, _ in pairs) else None


def check_signoffs(names: Iterable[str], verifier_names: Sequence[str]) -> tuple[str, ...]:
    """Sign-off names, checked: lowercase names, each once, none a command verifier's."""
    found = tuple(names)
    for name in found:
        if not VERIFIER_NAME.fullmatch(name):
            raise ConfigError(_bad_name(name))
    _unique(found, "sign-off")
    clash = sorted(set(found) & set(verifier_names))
    if clash:
        raise ConfigError(f"{clash[0]!r} names both a command verifier and a sign-off")
    return found


def check_reviewers(
    given: Sequence[str] | Mapping[str, str], taken: Iterable[str]
) -> tuple[tuple[str, str], ...]:
    """``["review=reviewer"]`` (or ``{"review": "reviewer"}``) -> ``(("review",
    "reviewer"),)``: each a verifier name and an agent spec's name; ConfigError for a
    bad or repeated name, one that a command verifier or a sign-off has, or no agent."""
    pairs: list[tuple[str, str]] = []
    items = given.items() if isinstance(given, Mapping) else (_reviewer(t) for t in given)
    for given_name, given_agent in items:
        name, agent = str(given_name), str(given_agent).strip()
        if not VERIFIER_NAME.fullmatch(name):
            raise ConfigError(_bad_name(name))
        if not AGENT_NAME.fullmatch(agent):
            raise ConfigError(
                f"the reviewer {name!r} names no agent spec: give NAME=AGENT, e.g. "
                f"review=reviewer (got {agent!r})"
            )
        pairs.append((name, agent))
    names = [name for name, _ in pairs]
    _unique(names, "reviewer")
    clash = sorted(set(names) & set(taken))
    if clash:
        raise ConfigError(f"{clash[0]!r} names both a reviewer and another verifier")
    return tuple(pairs)


def _reviewer(text: str) -> tuple[str, str]:
    name, sep, agent = str(text).partition("=")
    if not sep:
        raise ConfigError(
            f"a reviewer is NAME=AGENT (a verifier name and an agent spec), e.g. "
            f"review=reviewer; got {text!r}"
        )
    return name.strip(), agent


def review_command(name: str) -> str:
    """The validation record's command of a reviewer agent's review."""
    return f"{REVIEW_PREFIX}{name}"


def blocking_issues(output: Any) -> list[str] | None:
    """A review's blocking issues, each as one line (``file:line: description``); None
    when ``output`` is not a review (no ``blocking_issues`` list)."""
    if not isinstance(output, Mapping) or not isinstance(output.get(BLOCKING_FIELD), list):
        return None
    lines = []
    for issue in output[BLOCKING_FIELD]:
        if isinstance(issue, Mapping):
            where = str(issue.get("file") or "")
            if where and issue.get("line") is not None:
                where += f":{issue['line']}"
            text = str(issue.get("description") or "").strip() or "(no description)"
            lines.append(f"{where}: {text}" if where else text)
        else:
            lines.append(str(issue))
    return lines


def check_outcome(outcome: str | None) -> None:
    if outcome is not None and not OUTCOME_NAME.fullmatch(outcome):
        raise ConfigError(
            f"an outcome is a lowercase name such as change_ready_for_approval, got {outcome!r}"
        )


def signoff_command(name: str) -> str:
    """The validation record's command of a person's sign-off."""
    return f"{HUMAN_PREFIX}{name}"


def cannot_run(exit_code: int) -> str | None:
    """Why a verifier that exited ``exit_code`` never ran (None when it ran)."""
    return CANNOT_RUN.get(exit_code)


def evidence_map(result: Mapping[str, Any] | None) -> dict[str, str]:
    """A result's evidence by name; a result stored before evidence had names (a list of
    references) is read as ``evidence_1``, ``evidence_2``, … in order."""
    evidence = (result or {}).get("evidence") or {}
    if isinstance(evidence, Mapping):
        return {str(k): str(v) for k, v in evidence.items()}
    return {f"evidence_{i}": str(ref) for i, ref in enumerate(evidence, start=1)}


def _unique(names: Sequence[str], what: str) -> None:
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice is not None:
        raise ConfigError(f"two {what}s are named {twice!r}; give each its own name")


def _bad_name(name: str) -> str:
    return (
        f"a verifier's name is lowercase letters, digits, '_' or '-' (at most 64), "
        f"starting with a letter; got {name!r}"
    )


__all__ = [
    "DEFAULT_OUTCOME",
    "DIFF_EVIDENCE",
    "HUMAN_PREFIX",
    "REVIEW_PREFIX",
    "blocking_issues",
    "cannot_run",
    "check_outcome",
    "check_reviewers",
    "check_signoffs",
    "evidence_map",
    "named_verifiers",
    "review_command",
    "signoff_command",
    "split_verifier",
]
