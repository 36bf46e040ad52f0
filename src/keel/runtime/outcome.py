"""Where a run stands after the harness stopped driving it (``RunOutcome``), and the exit
code each status maps to (``keel run`` / ``keel resume``)."""

from __future__ import annotations

from dataclasses import dataclass

from keel.core.state import RunState
from keel.core.status import RunStatus
from keel.core.verifiers import evidence_map

EXIT_CODES = {
    RunStatus.COMPLETED: 0,
    RunStatus.FAILED: 1,
    RunStatus.WAITING: 3,
    RunStatus.PAUSED: 3,  # resumable, needs a person: `keel resume`
    RunStatus.BLOCKED: 4,
    RunStatus.CANCELLED: 5,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOutcome:
    """Where a run stands after the harness stopped driving it."""

    state: RunState

    @property
    def id(self) -> str:
        return self.state.run_id

    @property
    def status(self) -> RunStatus:
        return self.state.status

    @property
    def stop_reason(self) -> str | None:
        return self.state.reason

    @property
    def evidence(self) -> list[str]:
        """The result's evidence: ``artifact:ID`` references (``keel artifact ID`` opens
        each), in the order of ``evidence_by_name``."""
        return list(evidence_map(self.state.result).values())

    @property
    def evidence_by_name(self) -> dict[str, str]:
        """The result's evidence by verifier name (``code_diff``: the workspace's diff)."""
        return evidence_map(self.state.result)

    @property
    def exit_code(self) -> int:
        """0 completed, 1 failed, 3 waiting or paused, 4 blocked, 5 cancelled, 130
        interrupted."""
        return EXIT_CODES.get(self.state.status, 130)


__all__ = ["EXIT_CODES", "RunOutcome"]
