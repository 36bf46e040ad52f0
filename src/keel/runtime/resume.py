"""What a resume checks before the run goes on: the workspace and the policy file.

While no process drove a run, a person may have edited the files it changed, or
its policy file. A resume compares every file the run changed with the hash it
recorded (``RunState.changed_files``) and records those that differ as one
``workspace_changed`` event — the fold moves the mutation revision on, so
verifications that passed before no longer count — plus a note that tells the
model which files to read again. It reads the policy file again; a change is
recorded as ``policy_changed`` (the new rules and a short summary), which the fold
puts into the run's options, so this process and every later one enforce it. A
policy file that became invalid stops the resume (``ConfigError`` naming
``FILE:LINE``) before anything is written.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from keel.core.errors import ToolError
from keel.core.events import EventType, NewEvent
from keel.core.records import canonical_json
from keel.core.state import RunState, transition
from keel.core.status import RunStatus
from keel.loop.outcomes import note_event
from keel.policy.rules import POLICY_FILE, Policy, Rule, load_policy
from keel.runtime.takeover import TakeOver
from keel.store.base import LeaseHolder
from keel.tools.workspace import current_hash

NOTE_PATHS_SHOWN = 40  # paths named in the model's note; the event lists them all
NOTE_SUMMARY_LINES = 20


def read_policy_again(state: RunState) -> Policy:
    """The run's policy as its file says now; ConfigError (``FILE:LINE: …``) when invalid.

    A run whose rules came from the workspace's ``.keel/policy.toml`` (or from no file)
    reads that file if it exists now, and has no rules if it does not; a run started
    with ``--policy FILE`` needs that file still to be there.
    """
    workspace = Path(state.workspace)
    source = Policy.from_dict(state.options.policy).source
    if source is None or _same_file(Path(source), workspace / POLICY_FILE):
        return Policy.from_sources(workspace)
    return load_policy(Path(source))


def policy_summary(before: Policy, after: Policy) -> list[str]:
    """What changed between two policies, one line each ("+ deny run_command argv=…",
    "- protected 'deploy/*'", "policy file: A -> B"); empty when they decide alike."""
    lines = []
    if before.source != after.source:
        lines.append(f"policy file: {before.source or 'none'} -> {after.source or 'none'}")
    old = {_rule_key(r): r for r in before.rules}
    new = {_rule_key(r): r for r in after.rules}
    lines += [f"- {_rule_text(rule)}" for key, rule in old.items() if key not in new]
    lines += [f"+ {_rule_text(rule)}" for key, rule in new.items() if key not in old]
    for kind in ("protected", "secret"):
        was, now = getattr(before, kind), getattr(after, kind)
        lines += [f"- {kind} {glob!r}" for glob in was if glob not in now]
        lines += [f"+ {kind} {glob!r}" for glob in now if glob not in was]
    return lines


def workspace_drift(state: RunState) -> dict[str, str]:
    """Files the run changed whose content now differs from what it recorded: path ->
    sha256 now ("" when gone, or no longer a regular file inside the workspace).

    A file an interrupted call meant to write, holding exactly what it intended, is
    the run's own change (resume reconciles that call) and is not counted.
    """
    workspace = Path(state.workspace)
    if not workspace.is_dir():
        return {}  # not on this machine: the run will stop on its own, with a reason
    intended: dict[str, set[str]] = {}
    for call in state.open_calls.values():
        for path, digest in (call.get("intent") or {}).items():
            intended.setdefault(path, set()).add(digest)
    drift = {}
    for path, recorded in state.changed_files.items():
        now = _hash_now(workspace, path)
        if now != recorded and now not in intended.get(path, ()):
            drift[path] = now
    return drift


def resume_events(
    state: RunState,
    *,
    owner: str,
    holder: LeaseHolder,
    takeover: TakeOver | None,
    policy: Policy | None,
    resumed_by: str | None = None,
) -> list[NewEvent]:
    """The events a resume records before the run goes on (none for a fresh run).

    ``policy`` is ``read_policy_again``'s answer (None: not read). ``resumed_by`` is the
    person who asked to go on: a paused run moves back to ``running`` in the same step,
    its ``status_changed`` naming them (without it a paused run stays paused).
    """
    events = []
    if takeover is not None:
        events.append(
            NewEvent(
                type=EventType.LEASE_TAKEN_OVER, data={**takeover.to_event_data(), "by": owner}
            )
        )
    if state.last_seq <= 1:
        return events
    events.append(
        NewEvent(
            type=EventType.RUN_RESUMED,
            data={"owner": owner, "host": holder.host, "pid": holder.pid},
        )
    )
    if resumed_by is not None and state.status is RunStatus.PAUSED:
        events.append(transition(state, RunStatus.RUNNING, None, by=resumed_by))
    drift = workspace_drift(state)
    if drift:
        events.append(NewEvent(type=EventType.WORKSPACE_CHANGED, data={"changed_files": drift}))
        events.append(note_event(_drift_note(state, drift)))
    if policy is not None:
        events += policy_events(state, policy)
    return events


def policy_events(state: RunState, policy: Policy) -> list[NewEvent]:
    """``policy_changed`` and a note for the model, when ``policy`` decides otherwise
    than the run's stored rules; nothing when it does not."""
    summary = policy_summary(Policy.from_dict(state.options.policy), policy)
    if not summary:
        return []
    data: dict[str, Any] = {
        "policy": policy.to_dict(),
        "source": policy.source,
        "summary": summary,
    }
    shown = summary[:NOTE_SUMMARY_LINES]
    more = len(summary) - len(shown)
    text = (
        "The permission policy was changed while the run was stopped; from now on it is "
        "enforced as changed:\n" + "\n".join(shown) + (f"\n(and {more} more)" if more else "")
    )
    return [NewEvent(type=EventType.POLICY_CHANGED, data=data), note_event(text)]


def _drift_note(state: RunState, drift: dict[str, str]) -> str:
    described = [
        f"{path} ({_how(digest, state.changed_files[path])})"
        for path, digest in sorted(drift.items())
    ]
    shown = described[:NOTE_PATHS_SHOWN]
    more = len(described) - len(shown)
    return (
        "While the run was stopped, files it had changed were changed outside it: "
        + ", ".join(shown)
        + (f" and {more} more" if more else "")
        + ". Read them again before relying on what you saw earlier; verifications made "
        "before these changes no longer count."
    )


def _how(now: str, recorded: str) -> str:
    return "deleted" if not now else "created" if not recorded else "modified"


def _hash_now(workspace: Path, path: str) -> str:
    try:
        return current_hash(workspace, path)
    except (ToolError, OSError):
        return ""  # a directory now, or a path leading outside: not the run's file any more


def _rule_key(rule: Rule) -> str:
    """A rule as it decides, without where it is written (moving a line changes nothing)."""
    return canonical_json({k: v for k, v in rule.to_dict().items() if k != "origin"})


def _rule_text(rule: Rule) -> str:
    text = replace(rule, origin="").describe()
    return f"{text} ({rule.reason})" if rule.reason else text


def _same_file(a: Path, b: Path) -> bool:
    return a.resolve() == b.resolve()


__all__ = [
    "policy_events",
    "policy_summary",
    "read_policy_again",
    "resume_events",
    "workspace_drift",
]
