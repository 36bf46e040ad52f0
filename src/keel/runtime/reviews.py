"""Reviewer agents as verifiers: an independent child run reviews the change.

``--verify-agent review=reviewer`` makes the verification of a run end with a review by
a child run of the agent spec ``reviewer`` (the built-in one reads the workspace, never
changes it, and returns ``blocking_issues``, ``other_issues`` and ``evidence_gaps``).
The review runs once the command verifiers pass at the revision being verified (there
is no point reviewing a change whose tests fail), and is the verifier's evidence.

Guarantees:

- the reviewer is made through the same path as a model's ``agent_spawn`` (tools, mode,
  budget and workspace narrowed to the parent's; ``keel.runtime.child_runs``) under
  its own key, ``review:NAME@REVISION``, and its ``subagent_spawned`` names the
  verifier and is committed on the parent before the reviewer runs. A parent killed
  mid-review and resumed re-attaches to that reviewer (never makes a second one), and
  a revision already reviewed is not reviewed again. A model's call can neither make
  nor re-attach to a verifier's child: its id is matched only with ``verifier`` set.
- the review passes only when the reviewer completed and its validated result lists no
  blocking issue; its issues go back to the parent's model as the gap. A reviewer that
  could not review — it failed, was cancelled, ran out of budget, waited for a person,
  or could not be made — is a gap no edit of the workspace fixes
  (``ValidationRecord.unfixable``): the parent ends ``blocked`` saying why.
- the reviewer is shown the goal, the diff and each command verifier's result with the
  end of its log, all as stored (redacted); never the parent's transcript.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from keel.core.agent_spec import FailurePolicy, OnFailure
from keel.core.children import SpawnRefused, check_limits
from keel.core.errors import ConfigError, KeelError, StopRequested, ToolError
from keel.core.events import EventType, NewEvent
from keel.core.records import ValidationRecord
from keel.core.state import RunState
from keel.core.status import RunStatus
from keel.core.verifiers import BLOCKING_FIELD, blocking_issues, check_reviewers, review_command
from keel.faults import fault_point
from keel.runtime.agent_specs import load_agent_spec
from keel.runtime.cancel_tree import cancel_tree
from keel.runtime.child_runs import task_of
from keel.runtime.child_slots import execute_child
from keel.runtime.observations import recorded_finish

if TYPE_CHECKING:
    from keel.core.agent_spec import AgentSpec
    from keel.runtime.delegation import Delegation
    from keel.store.base import Store

DIFF_SHOWN = 40_000  # characters of the diff a reviewer is given inline (it can read files)
LOG_SHOWN = 2_000  # characters of the end of each verifier's log
ISSUES_NOTED = 10  # blocking issues quoted in the gap the parent's model reads
ISSUE_CHARS = 400
TASK = (
    "Review the change made in this workspace for the goal below, and the evidence its "
    "verifiers produced. Report blocking issues only for defects that must be fixed "
    "before the change is accepted."
)


def reviewer_verifiers(
    given: Sequence[str] | Mapping[str, str],
    *,
    taken: Sequence[str],
    workspace: Path,
    known_tools: Collection[str],
) -> tuple[tuple[str, str], ...]:
    """A new run's reviewers (``NAME=AGENT``), checked before anything is stored: names
    as ``check_reviewers`` wants them, and each agent a spec that exists (the
    workspace's ``.keel/agents``, else a built-in) and can review."""
    pairs = check_reviewers(given, taken)
    for _, agent in pairs:
        check_reviewer_spec(load_agent_spec(agent, workspace, known_tools=known_tools))
    return pairs


def check_reviewer_spec(spec: AgentSpec) -> None:
    """ConfigError unless the spec's result must list ``blocking_issues`` (an array)."""
    output = spec.output or {}
    field = (output.get("properties") or {}).get(BLOCKING_FIELD) or {}
    if BLOCKING_FIELD not in (output.get("required") or ()) or field.get("type") != "array":
        raise ConfigError(
            f"agent {spec.name!r} cannot review: its output schema must require "
            f"{BLOCKING_FIELD!r}, an array (as the built-in reviewer's does)"
        )


class Reviews:
    """Runs the reviewer verifiers of the runs one harness drives."""

    def __init__(self, delegation: Delegation) -> None:
        self.delegation = delegation

    @property
    def store(self) -> Store:
        return self.delegation.store

    def review(
        self,
        *,
        state: Callable[[], RunState],
        commit: Callable[[Sequence[NewEvent]], None],
        should_stop: Callable[[], bool] | None,
        name: str,
        agent: str,
        records: Sequence[ValidationRecord],
        diff_artifact: str | None,
    ) -> ValidationRecord:
        """The review of the parent's current revision by verifier ``name``.

        ``state`` reads the parent's state as committed so far and ``commit`` records
        on it (the driver's), so the spawn and the child's end are on the parent's log
        before this returns. StopRequested when the parent is asked to stop while its
        reviewer runs (a resume re-attaches to it).
        """
        started = time.monotonic()
        parent = state()
        revision = parent.mutation_revision
        call_id = f"review:{name}@{revision}"
        child_id = _made(parent, name, call_id)
        token = None
        task_id = None
        if child_id is None:
            try:
                spec = self.delegation.spec_of(agent, parent)
                check_reviewer_spec(spec)
                settings = self.delegation.settings_of(parent)
                check_limits(
                    parent, max_depth=settings.max_depth, max_live=settings.max_live_children
                )
                new = self.delegation.make(
                    None,
                    parent,
                    spec,
                    TASK,
                    self._inputs(parent, records, diff_artifact),
                    False,
                    OnFailure(policy=FailurePolicy.BEST_EFFORT),
                    attempt=1,
                    call_id=call_id,
                    turn=revision,
                    record=commit,
                    verifier=name,
                )
            except (SpawnRefused, ToolError, ConfigError) as exc:
                return self._record(
                    name,
                    revision,
                    parent,
                    started,
                    unfixable=f"the reviewer agent {agent} could not be made: {exc}",
                )
            child_id, task_id, token = new.state.run_id, new.task.id, new.token
        else:
            task_id = parent.children[child_id].task_id
        finished = self._finished(state(), child_id)
        if finished is None:
            child = execute_child(
                self.delegation.harness,
                child_id,
                task_id=task_id,
                token=token,
                should_stop=should_stop,
            )
            if child.status is RunStatus.WAITING:  # a review no person should have to unblock
                with contextlib.suppress(KeelError):
                    cancel_tree(self.store, child_id, "reviewer_needs_a_person")
                child = self.store.load_run(child_id)
            if not child.status.terminal:
                raise StopRequested(
                    f"reviewer {child_id} stopped before it ended ({child.status.value}); "
                    "resuming this run re-attaches to it"
                )
            current = state()
            finished = self.delegation.observe(current, child_id, child, policy="none")
            if current.children[child_id].live:
                commit([NewEvent(type=EventType.SUBAGENT_FINISHED, data=finished)])
        fault_point("after_review")
        return self._verdict(name, agent, revision, state(), started, finished)

    # --- what the reviewer is given, and what its review means -----------------------------

    def _inputs(
        self, parent: RunState, records: Sequence[ValidationRecord], diff_artifact: str | None
    ) -> dict[str, Any]:
        diff = self._text(diff_artifact)
        if diff is None:
            diff = "(no diff: the workspace is not a git work tree, or nothing changed)"
        elif len(diff) > DIFF_SHOWN:
            diff = diff[:DIFF_SHOWN] + "\n[diff truncated: read the changed files]"
        evidence = {}
        for record in records:
            log = self._text(record.artifact) or ""
            evidence[parent.options.verifier_name(record.command)] = {
                "passed": record.passed,
                "exit_code": record.exit_code,
                "log_end": log[-LOG_SHOWN:],
            }
        return {
            "goal": task_of(parent),
            "diff": diff,
            "changed_files": sorted(parent.changed_files),
            "evidence": evidence,
        }

    def _text(self, artifact_id: str | None) -> str | None:
        if artifact_id is None:
            return None
        try:
            _, content = self.store.get_artifact(artifact_id)
        except KeelError:
            return None
        return content.decode("utf-8", "replace")

    def _finished(self, parent: RunState, child_id: str) -> dict[str, Any] | None:
        """The child's recorded end (a parent that crashed after recording it)."""
        if parent.children[child_id].live:
            return None
        return recorded_finish(self.store, parent.run_id, child_id)

    def _verdict(
        self,
        name: str,
        agent: str,
        revision: int,
        parent: RunState,
        started: float,
        finished: dict[str, Any] | None,
    ) -> ValidationRecord:
        status = str((finished or {}).get("status") or "unknown")
        reason = (finished or {}).get("reason")
        issues = blocking_issues((finished or {}).get("output"))
        review = {
            "verifier": name,
            "agent": agent,
            "child_run_id": (finished or {}).get("child_run_id"),
            "status": status,
            "reason": reason,
            "output": (finished or {}).get("output"),
        }
        if status != RunStatus.COMPLETED.value or issues is None:
            why = f"ended {status}" + (f" ({reason})" if reason else "")
            if status == RunStatus.COMPLETED.value:
                why = f"completed without a {BLOCKING_FIELD} list"
            return self._record(
                name,
                revision,
                parent,
                started,
                review=review,
                unfixable=f"the reviewer agent {agent} gave no review: it {why}",
            )
        if not issues:
            return self._record(name, revision, parent, started, review=review)
        quoted = "; ".join(f"{i}. {_cut(text)}" for i, text in enumerate(issues[:ISSUES_NOTED], 1))
        more = f" (and {len(issues) - ISSUES_NOTED} more)" if len(issues) > ISSUES_NOTED else ""
        note = f"{len(issues)} blocking issue(s): {quoted}{more}"
        return self._record(name, revision, parent, started, review=review, note=note)

    def _record(
        self,
        name: str,
        revision: int,
        parent: RunState,
        started: float,
        *,
        review: dict[str, Any] | None = None,
        note: str | None = None,
        unfixable: str | None = None,
    ) -> ValidationRecord:
        passed = unfixable is None and note is None
        artifact = None
        if review is not None:
            body = json.dumps(review, ensure_ascii=False, indent=1, sort_keys=True)
            body = self.delegation.harness.redact_for(parent)(body)
            stored = self.store.put_artifact(
                parent.run_id, f"review-{name}.json", body.encode("utf-8")
            )
            artifact = stored.id
        return ValidationRecord(
            command=review_command(name),
            exit_code=0 if passed else 1,
            duration_s=round(time.monotonic() - started, 3),
            artifact=artifact,
            mutation_revision=revision,
            file_hashes=dict(parent.changed_files),
            passed=passed,
            note=note,
            unfixable=unfixable,
        )


def _made(parent: RunState, name: str, call_id: str) -> str | None:
    """The reviewer this verifier made for this revision, if it made one."""
    found = [
        child_id
        for child_id, record in parent.children.items()
        if record.verifier == name and record.call_id == call_id
    ]
    return max(found, key=lambda c: parent.children[c].attempt) if found else None


def _cut(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= ISSUE_CHARS else text[: ISSUE_CHARS - 1] + "…"


__all__ = ["Reviews", "check_reviewer_spec", "reviewer_verifiers"]
