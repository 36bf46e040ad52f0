"""What people do to runs through a ``Harness``: approve, sign off, answer, pause, resume,
message, cancel — each one call into ``keel.runtime.decisions`` or ``steering``, made in
the name of ``by`` (default: the harness's person)."""

from __future__ import annotations

from keel.core.state import RunState
from keel.runtime import decisions, steering
from keel.runtime.cancel_tree import CancelReport, cancel_tree
from keel.store.base import Store


class PeopleDecisions:
    """The people-facing methods of ``Harness`` (which provides ``store`` and ``owner``)."""

    store: Store
    owner: str

    @property
    def person(self) -> str:
        """Who decides through this harness when a call names no one: the owner's name
        without this process's incarnation (``KEEL_AGENT_ID``, else ``user@host``)."""
        return self.owner.split("/")[0]

    def approve(
        self, run_id: str, *, deny: bool = False, reason: str | None = None, by: str | None = None
    ) -> RunState:
        return decisions.decide_approval(
            self.store, run_id, deny=deny, reason=reason, by=by or self.person
        )

    def sign_off(
        self,
        run_id: str,
        verifier: str,
        *,
        deny: bool = False,
        reason: str | None = None,
        by: str | None = None,
    ) -> RunState:
        """Sign off (or decline) as ``verifier`` for a run waiting for it
        (``decisions.sign_off``); ``resume`` then drives it to completion."""
        return decisions.sign_off(
            self.store, run_id, verifier, deny=deny, reason=reason, by=by or self.person
        )

    def answer(self, run_id: str, text: str, *, by: str | None = None) -> RunState:
        return decisions.answer_question(self.store, run_id, text, by=by or self.person)

    def pause(self, run_id: str, *, reason: str | None = None, by: str | None = None) -> RunState:
        """Ask the run to pause after its current step (``steering.request_pause``)."""
        return steering.request_pause(self.store, run_id, by=by or self.person, reason=reason)

    def resume_paused(self, run_id: str, *, by: str | None = None) -> RunState:
        """Move a paused run back to ``running`` for a worker to pick up
        (``steering.resume_run``); ``resume`` drives it here instead."""
        return steering.resume_run(self.store, run_id, by=by or self.person)

    def message(
        self, run_id: str, text: str, *, by: str | None = None, queue: bool = False
    ) -> steering.MessageResult:
        """A person's message to the run, or a follow-up of an ended run
        (``steering.send_message``)."""
        return steering.send_message(self.store, run_id, text, by=by or self.person, queue=queue)

    def cancel(self, run_id: str, reason: str, *, by: str | None = None) -> RunState:
        """Cancel the run and every live descendant; the run's new state."""
        return decisions.cancel_run(self.store, run_id, reason, by=by or self.person)

    def cancel_tree(self, run_id: str, reason: str, *, by: str | None = None) -> CancelReport:
        """Cancel the run and every live descendant (reason ``parent_cancelled``); the
        report lists them and the side effects already done in the tree."""
        return cancel_tree(self.store, run_id, reason, by=by or self.person)


__all__ = ["PeopleDecisions"]
