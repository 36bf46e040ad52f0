"""Prepare: the model's view, built from the authoritative run state each step (pure)."""

from __future__ import annotations

from itertools import islice

from keel.core.state import RunState
from keel.loop.transcript import Transcript
from keel.models.base import Message

SYSTEM_INTRO = """You are a software agent working inside a workspace through tools.
The harness around you records every action, enforces permissions and budgets, and decides
when the work is complete: call request_completion(summary) (or give a final answer) when
you believe the goal is met; the harness then runs its own verifiers, and only their passing
completes the run. Keep todos current with todo_write. Paths are relative to the workspace."""

CHANGED_SHOWN = 50  # changed files listed by name in the system prompt

MODE_TEXT = {
    "plan": "plan: read-only. Investigate, write the plan with plan_write, then call "
    "plan_exit(summary) to ask for approval. Writes and commands are refused until then.",
    "ask": "ask: every write, command or external call needs a person's approval first.",
    "edit": "edit: you may write files in the workspace; commands need approval.",
    "auto": "auto: you may write files and run commands inside the workspace.",
}


def system_prompt(state: RunState) -> str:
    """The run's facts as the model should see them now."""
    lines = [SYSTEM_INTRO, "", f"Goal: {state.goal}", f"Workspace: {state.workspace}"]
    lines.append(f"Mode: {MODE_TEXT.get(state.mode, state.mode)}")
    skills = state.options.skills
    if skills and (state.options.tools is None or "load_skill" in state.options.tools):
        lines += ["", "Skills (call load_skill(name) for one's instructions before using it):"]
        lines += [f"  {skill['name']}: {skill['description']}" for skill in skills]
    if state.plan:
        lines += ["", "Plan:", state.plan.strip()]
    if state.todos:
        lines += ["", "Todos:"]
        marks = {"completed": "[x]", "in_progress": "[>]", "pending": "[ ]"}
        lines += [f"  {marks.get(t.status, '[ ]')} {t.content}" for t in state.todos]
    if state.changed_files:
        lines += ["", f"Files changed so far (mutation revision {state.mutation_revision}):"]
        lines += changed_lines(state.changed_files)
    if state.options.verify:
        lines += ["", "Verifiers the harness runs before completion (you cannot skip them):"]
        lines += [f"  $ {cmd}" for cmd in state.options.verify]
        gaps = state.verification_gaps()
        if state.validations and gaps:
            lines += ["Open verification gaps:"] + [f"  - {g}" for g in gaps]
    shown = budget_left(state)
    if shown:
        lines += ["", f"Budget left: {shown}"]
    return "\n".join(lines)


def changed_lines(changed: dict[str, str]) -> list[str]:
    """The changed files, sorted; of more than ``CHANGED_SHOWN``, the ones most recently
    changed for the first time (a count says how many are left out). Bounded, so a long
    run's every request does not grow with every file it wrote."""
    if len(changed) <= CHANGED_SHOWN:
        return [f"  {path}" for path in sorted(changed)]
    latest = sorted(islice(reversed(changed), CHANGED_SHOWN))
    more = len(changed) - CHANGED_SHOWN
    return [
        f"  … {more} earlier ones (git status or list_dir shows them all), then the latest:",
        *(f"  {path}" for path in latest),
    ]


def budget_left(state: RunState) -> str:
    """What is left of each limited budget dimension ("steps 12, tokens 800"), or ""."""
    remaining = state.options.budget.remaining(state.usage)
    return ", ".join(
        f"{name.replace('_', ' ')} {_fmt(left)}"
        for name, left in remaining.items()
        if left is not None
    )


def build_messages(
    state: RunState, transcript: Transcript, *, system: str | None = None
) -> tuple[Message, ...]:
    """System facts, the goal, then the conversation: the latest compaction's
    continuation and every message since (``Transcript.view``). ``system`` is
    ``system_prompt(state)`` when the caller already made it."""
    return (
        Message(role="system", content=system if system is not None else system_prompt(state)),
        Message(role="user", content=state.goal),
        *transcript.view(),
    )


def _fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.2f}"
