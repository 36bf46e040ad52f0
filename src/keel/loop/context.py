"""Context continuation: keep each request inside the model's context (pure).

Each step the driver measures the next request (``keel.loop.token_estimate``: the
system prompt, the goal, the transcript's running total and the offered tools). When
it would pass ``ContextBudget.threshold`` — 80 % of the context less an output
reserve — or the provider answered context overflow, the older turns are replaced by
a *continuation*: one user message after the goal, written from the run's
authoritative state (goal, mode, plan, todos, files changed, failed attempts,
artifacts, open waits, verification gaps, the last unresolved error, budget left),
optionally with a model-written summary of the dropped turns. The most recent turns
are kept, up to ``ContextBudget.keep`` tokens (at least the latest turn), and the cut
never separates an assistant turn from its tool results.

The ``context_compacted`` event stores the continuation's text itself (and its sha256),
so the transcript fold and every resume show byte-identical context without
re-deriving it. Before it is stored, `check_fidelity` refuses a continuation that
lost the goal, an open todo, a verification gap or the last unresolved error
(`ContextUnfaithful`): such a context is never sent.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from keel.core.errors import ContextUnfaithful
from keel.core.events import EventType, NewEvent
from keel.core.records import RunOptions, canonical_json
from keel.core.state import RunState
from keel.loop.prepare import MODE_TEXT, budget_left
from keel.loop.token_estimate import MESSAGE_OVERHEAD, message_tokens, text_tokens
from keel.loop.transcript import Entry, Transcript
from keel.models.base import Message
from keel.models.context_sizes import context_tokens_of

THRESHOLD_SHARE = 0.8  # compact once a request would pass this share of (context - reserve)
KEEP_SHARE = 0.3  # of the context: how much recent conversation a compaction keeps
OVERFLOW_KEEP_SHARE = 0.15  # the same after the provider said the context overflowed
MAX_OUTPUT_RESERVE = 8_192  # tokens left for the answer, at most; else 1/8 of the context
FAILED_KEPT = 10  # failed attempts a continuation lists (the latest)
ARTIFACTS_KEPT = 20  # artifact ids a continuation lists (the latest)
FILES_SHOWN = 50  # changed files a continuation names
ITEM_CHARS = 300  # of one failed attempt's arguments or error
ERROR_CHARS = 1_000  # of the last unresolved error (the fidelity check asks for these)
SUMMARY_INPUT_SHARE = 0.5  # of the context: how much dropped conversation a summary reads

CONTINUATION_HEAD = "[harness] The conversation before this point was compacted"
SUMMARY_INSTRUCTION = (
    "You summarise an agent's earlier conversation for its own later use. Say what was "
    "tried, what was learned (facts, file contents that matter, decisions) and what "
    "remained open, in at most 300 words. Do not invent anything."
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextBudget:
    """The token budget of one run's requests, from its options (fixed at creation)."""

    window: int

    @classmethod
    def of(cls, options: RunOptions) -> ContextBudget:
        """``options.context_tokens`` when set, else the known size of the run's model."""
        return cls(window=options.context_tokens or context_tokens_of(options.model or ""))

    @property
    def reserve(self) -> int:
        return min(MAX_OUTPUT_RESERVE, self.window // 8)

    @property
    def threshold(self) -> int:
        return int((self.window - self.reserve) * THRESHOLD_SHARE)

    def keep(self, reason: str) -> int:
        share = OVERFLOW_KEEP_SHARE if reason == "overflow" else KEEP_SHARE
        return int(self.window * share)


@dataclass(frozen=True, slots=True, kw_only=True)
class CompactionPlan:
    """What a compaction drops: ``transcript.entries[:cut]``, events from_seq..through_seq."""

    reason: str  # "threshold" | "overflow"
    cut: int
    from_seq: int
    through_seq: int
    dropped: tuple[Entry, ...]
    kept_tokens: int
    tokens_before: int


def fixed_tokens(system: str, goal: str, specs_tokens: int) -> int:
    """Tokens of what every request carries besides the conversation."""
    return 2 * MESSAGE_OVERHEAD + text_tokens(system) + text_tokens(goal) + specs_tokens


def request_tokens(system: str, goal: str, transcript: Transcript, specs_tokens: int) -> int:
    """The estimated size of the next request: fixed parts plus the running total."""
    return fixed_tokens(system, goal, specs_tokens) + transcript.tokens


def plan_compaction(
    state: RunState,
    transcript: Transcript,
    *,
    system: str,
    specs_tokens: int,
    budget: ContextBudget,
    overflow: bool = False,
) -> CompactionPlan | None:
    """The compaction the next request needs, or None: under the threshold (unless
    ``overflow``), or nothing can be dropped (the latest turn is always kept, and a
    person's message still waiting for a turn's results is never cut around)."""
    before = request_tokens(system, state.goal, transcript, specs_tokens)
    if not overflow and before <= budget.threshold:
        return None
    if transcript.holding:
        return None
    reason = "overflow" if overflow else "threshold"
    cut = choose_cut(
        transcript.entries, _keep(budget, reason, system, state.goal, transcript, specs_tokens)
    )
    if cut is None:
        return None
    entries = list(transcript.entries)
    dropped = tuple(entries[:cut])
    previous = transcript.compaction
    return CompactionPlan(
        reason=reason,
        cut=cut,
        from_seq=int(previous["through_seq"]) + 1 if previous else 1,
        through_seq=max(entry.seq for entry in dropped),
        dropped=dropped,
        kept_tokens=sum(entry.tokens for entry in entries[cut:]),
        tokens_before=before,
    )


def _keep(
    budget: ContextBudget,
    reason: str,
    system: str,
    goal: str,
    transcript: Transcript,
    specs_tokens: int,
) -> int:
    """How much recent conversation to keep: the budget's share, but at most half of
    the room the fixed parts and the continuation (as large as the previous one) leave
    under the threshold — else, in a small context, the kept turns alone would bring
    the next request back over it and every step would compact again."""
    previous = message_tokens(transcript.continuation) if transcript.continuation else 0
    room = budget.threshold - fixed_tokens(system, goal, specs_tokens) - previous
    return min(budget.keep(reason), max(0, room // 2))


def choose_cut(entries: Sequence[Entry], keep: int) -> int | None:
    """The index the kept part starts at: the earliest turn boundary whose suffix fits
    ``keep`` tokens, else the latest boundary (the latest turn alone); None when no
    boundary drops anything.

    A boundary is a message that is not a tool result and whose event comes after
    every earlier message's (a person's message held behind a turn's results has an
    earlier event, so no cut falls between it and them).
    """
    items = list(entries)
    boundaries: list[int] = []
    highest = 0
    for index, entry in enumerate(items):
        if index and entry.message.role != "tool" and entry.seq > highest:
            boundaries.append(index)
        highest = max(highest, entry.seq)
    if not boundaries:
        return None
    suffix = 0
    fits: int | None = None
    position = len(items)
    for boundary in reversed(boundaries):
        suffix += sum(entry.tokens for entry in items[boundary:position])
        position = boundary
        if suffix > keep:
            break
        fits = boundary
    return fits if fits is not None else boundaries[-1]


# --- the continuation ------------------------------------------------------------------


def compaction_event(
    state: RunState,
    transcript: Transcript,
    plan: CompactionPlan,
    *,
    system: str,
    specs_tokens: int,
    step: int,
    summary: dict[str, Any] | None = None,
    scrub: Callable[[str], str] = str,
) -> NewEvent:
    """The ``context_compacted`` event for ``plan``; `ContextUnfaithful` when its
    continuation (after ``scrub``, the redaction the log applies) would lose a
    fidelity item. ``summary`` is a model-written summary: text, usage, cost, model."""
    previous = transcript.compaction or {}
    failed = _failed_attempts(previous, plan.dropped)
    artifacts = _artifacts(previous, plan.dropped, state)
    text = scrub(
        continuation_text(
            state,
            plan,
            step=step,
            failed=failed,
            artifacts=artifacts,
            summary=(summary or {}).get("text"),
        )
    )
    check_fidelity(state, f"{system}\n{text}")
    after = (
        fixed_tokens(system, state.goal, specs_tokens)
        + plan.kept_tokens
        + message_tokens(Message(role="user", content=text))
    )
    data: dict[str, Any] = {
        "from_seq": plan.from_seq,
        "through_seq": plan.through_seq,
        "reason": plan.reason,
        "step": step,
        "messages_dropped": len(plan.dropped),
        "tokens_before": plan.tokens_before,
        "tokens_after": after,
        "text": text,
        "digest": hashlib.sha256(text.encode("utf-8")).hexdigest(),
        "failed_attempts": failed,
        "artifacts": artifacts,
    }
    if summary is not None:
        data["summary"] = summary
    return NewEvent(type=EventType.CONTEXT_COMPACTED, data=data)


def continuation_text(
    state: RunState,
    plan: CompactionPlan,
    *,
    step: int,
    failed: Sequence[dict[str, Any]],
    artifacts: Sequence[str],
    summary: str | None = None,
) -> str:
    """The continuation: what the dropped turns established, from the run's state."""
    lines = [
        # No event numbers: a resumed run's log has more events than a never-stopped
        # one's, and the model sees the same text in both.
        f"{CONTINUATION_HEAD} ({len(plan.dropped)} messages, "
        f"about {sum(e.tokens for e in plan.dropped)} tokens, before step {step + 1}; "
        f"reason: {plan.reason}). What the run had established, from its record:",
        f"Goal: {state.goal}",
        f"Mode: {MODE_TEXT.get(state.mode, state.mode)}",
    ]
    if state.plan:
        lines += ["Plan:", state.plan.strip()]
    if state.todos:
        marks = {"completed": "[x]", "in_progress": "[>]", "pending": "[ ]"}
        lines += ["Todos:"] + [f"  {marks.get(t.status, '[ ]')} {t.content}" for t in state.todos]
    if state.changed_files:
        paths = sorted(state.changed_files)
        more = len(paths) - FILES_SHOWN
        lines.append(f"Files changed (mutation revision {state.mutation_revision}):")
        lines += [f"  {path}" for path in paths[:FILES_SHOWN]]
        lines += [f"  … and {more} more"] if more > 0 else []
    if failed:
        lines.append("Failed attempts (latest last; do not repeat them unchanged):")
        lines += [
            f"  - {f['tool']} {_clip(canonical_json(f.get('arguments')), ITEM_CHARS)}"
            f" -> {_clip(str(f['error']), ITEM_CHARS)}"
            for f in failed
        ]
    if artifacts:
        lines.append("Artifacts: " + ", ".join(f"artifact:{a}" for a in artifacts))
    waits = _open_waits(state)
    if waits:
        lines += ["Open waits:"] + [f"  - {wait}" for wait in waits]
    gaps = state.verification_gaps()
    if gaps:
        lines += ["Verification gaps:"] + [f"  - {gap}" for gap in gaps]
    error = unresolved_error(state)
    if error:
        lines.append(f"Last unresolved error: {error}")
    left = budget_left(state)
    if left:
        lines.append(f"Budget left: {left}")
    if summary and summary.strip():
        lines += ["Summary of the dropped turns (written by the model):", summary.strip()]
    lines.append("The messages after this one continue the conversation.")
    return "\n".join(lines)


def unresolved_error(state: RunState) -> str:
    """The last tool call's error when that call failed (its first ERROR_CHARS), or ""."""
    last = state.recent_errors[-1] if state.recent_errors else ""
    return last[:ERROR_CHARS]


def check_fidelity(state: RunState, text: str) -> None:
    """Refuse (`ContextUnfaithful`) a request text that lacks the goal, an open todo,
    one of the latest verification gaps or the last unresolved error."""
    if state.goal and state.goal not in text:
        raise ContextUnfaithful("goal", state.goal)
    for todo in state.todos:
        if todo.status != "completed" and todo.content not in text:
            raise ContextUnfaithful("open todo", todo.content)
    for gap in state.verification_gaps():
        if gap not in text:
            raise ContextUnfaithful("verification gap", gap)
    error = unresolved_error(state)
    if error and error not in text:
        raise ContextUnfaithful("unresolved error", error)


def _failed_attempts(previous: dict[str, Any], dropped: Sequence[Entry]) -> list[dict[str, Any]]:
    carried = [f for f in previous.get("failed_attempts", ()) if isinstance(f, dict)]
    new = [
        {
            "tool": e.failure["tool"],
            "arguments": _bounded(e.failure.get("arguments")),
            "error": _clip(str(e.failure["error"]), ITEM_CHARS),
            "seq": e.failure["seq"],
        }
        for e in dropped
        if e.failure is not None
    ]
    return (carried + new)[-FAILED_KEPT:]


def _artifacts(previous: dict[str, Any], dropped: Sequence[Entry], state: RunState) -> list[str]:
    named = [str(a) for a in previous.get("artifacts", ())]
    named += [a for e in dropped for a in e.artifacts]
    named += [r.artifact for r in state.validations if r.artifact]
    latest = list(dict.fromkeys(reversed(named)))[:ARTIFACTS_KEPT]  # each once, latest first
    return latest[::-1]


def _open_waits(state: RunState) -> list[str]:
    waits = [
        f"child run {run_id} ({child.agent}, call {child.call_id}) still running"
        for run_id, child in sorted(state.children.items())
        if child.live
    ]
    pending = state.pending
    if pending is not None:
        what = pending.question or pending.tool or ""
        waits.append(f"{pending.kind} pending for call {pending.call_id}: {what}".rstrip(": "))
    return waits


def _bounded(arguments: Any) -> Any:
    """Arguments small enough to carry forward: as they are, else their clipped text."""
    text = canonical_json(arguments)
    return arguments if len(text) <= ITEM_CHARS else _clip(text, ITEM_CHARS)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


# --- a model-written summary -----------------------------------------------------------


def summary_messages(plan: CompactionPlan, budget: ContextBudget) -> tuple[Message, ...]:
    """The request asking the model to summarise the dropped turns: an instruction and
    the turns as text (a plain transcript, so no tool call is left unanswered), the
    latest part when they exceed half the context."""
    limit = int(budget.window * SUMMARY_INPUT_SHARE) * 4
    parts: list[str] = []
    size = 0
    for entry in reversed(plan.dropped):
        part = _as_line(entry.message)
        size += len(part) + 1
        if size > limit:
            break
        parts.append(part)
    return (
        Message(role="system", content=SUMMARY_INSTRUCTION),
        Message(role="user", content="\n".join(reversed(parts)) or "(no messages)"),
    )


def _as_line(message: Message) -> str:
    calls = "".join(f" [calls {c.name} {c.arguments}]" for c in message.tool_calls)
    return f"{message.role}: {message.content or ''}{calls}"


__all__ = [
    "CONTINUATION_HEAD",
    "CompactionPlan",
    "ContextBudget",
    "check_fidelity",
    "choose_cut",
    "compaction_event",
    "continuation_text",
    "plan_compaction",
    "request_tokens",
    "summary_messages",
    "unresolved_error",
]
