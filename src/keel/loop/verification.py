"""Performing a verification: the user's verifiers and the diff, stored as evidence.

Each verifier runs in the run's sandbox; its log (command line included) and the
workspace's diff are redacted before they become artifacts, and each record is
bound to the mutation revision and file hashes it checked.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from keel.core.guard import PathGuard
from keel.core.records import ValidationRecord
from keel.core.redact import Redactor
from keel.core.state import RunState
from keel.core.verifiers import review_command
from keel.faults import fault_point
from keel.sandbox.base import Sandbox
from keel.store.base import Store
from keel.verify.diff import workspace_diff
from keel.verify.runner import run_verifier


def check_workspace(
    commands: Sequence[str],
    *,
    state: RunState,
    store: Store,
    redactor: Redactor,
    sandbox: Sandbox | None,
    guard: PathGuard,
    timeout_s: float,
) -> tuple[list[ValidationRecord], str | None]:
    """Run every verifier, then store the diff; the records and the diff's artifact id."""
    workspace = Path(state.workspace).resolve()
    records = []
    for index, command in enumerate(commands):
        check = run_verifier(
            command, workspace=workspace, timeout_s=timeout_s, sandbox=sandbox, guard=guard
        )
        header = f"$ {command}\n[exit code {check.exit_code}]\n"
        log = redactor.scrub_text(header + check.output).encode("utf-8", "replace")
        artifact = store.put_artifact(state.run_id, f"verify-{index + 1}.log", log)
        records.append(
            ValidationRecord(
                command=command,
                exit_code=check.exit_code,
                duration_s=round(check.duration_s, 3),
                artifact=artifact.id,
                mutation_revision=state.mutation_revision,
                file_hashes=dict(state.changed_files),
                passed=check.exit_code == 0,
            )
        )
        fault_point("during_verification")
    diff = workspace_diff(workspace, guard=guard, sandbox=sandbox)
    if not diff:
        return records, None
    patch = redactor.scrub_text(diff).encode("utf-8", "replace")
    return records, store.put_artifact(state.run_id, "diff.patch", patch).id


def no_reviewer(state: RunState, name: str, agent: str) -> ValidationRecord:
    """The record of a review that cannot happen: a driver with no way to make children."""
    return ValidationRecord(
        command=review_command(name),
        exit_code=1,
        duration_s=0.0,
        artifact=None,
        mutation_revision=state.mutation_revision,
        file_hashes=dict(state.changed_files),
        passed=False,
        unfixable=f"the reviewer agent {agent} cannot run here: this driver makes no children",
    )


__all__ = ["check_workspace", "no_reviewer"]
