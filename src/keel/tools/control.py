"""Control tools: the loop itself performs these; here they are only specs and argument models.

request_completion moves the run to verifying, ask_user makes it wait for an answer and
plan_exit leaves plan mode. The registry refuses to ``execute`` them, so a loop that
forgets to intercept one fails loudly. (plan_write is an ordinary write: ``tools.plan``.)
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from keel.tools.base import Effect, Recovery, tool

NonEmpty = Annotated[str, Field(min_length=1)]


@tool(effect=Effect.STATE, recovery=Recovery.IDEMPOTENT, control=True)
def request_completion(
    summary: Annotated[NonEmpty, Field(description="What was done and how it was checked.")],
    output: Annotated[
        dict[str, Any] | None,
        Field(
            description="Your structured result, when your instructions give a schema for "
            "it (a subagent's result); checked against that schema."
        ),
    ] = None,
    remaining_actions: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=2000)]] | None,
        Field(
            description="What is left for people to do (each one line), e.g. a release "
            "the task said not to make; empty when nothing is.",
            max_length=50,
        ),
    ] = None,
) -> None:
    """Ask to finish the task. The harness then runs its verifiers; the run completes only
    if they pass, otherwise you get the gaps back and continue."""


@tool(effect=Effect.STATE, recovery=Recovery.IDEMPOTENT, control=True)
def ask_user(
    question: Annotated[NonEmpty, Field(description="One clear question for the user.")],
) -> None:
    """Ask the user a question and wait for the answer; use only when you cannot proceed."""


@tool(effect=Effect.STATE, recovery=Recovery.IDEMPOTENT, control=True)
def plan_exit(
    summary: Annotated[NonEmpty, Field(description="The plan in brief, for approval.")],
) -> None:
    """Leave plan mode and start carrying out the plan."""
