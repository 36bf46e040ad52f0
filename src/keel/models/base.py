"""The records a model exchanges with the loop, and the `Model` protocol.

Everything here is a frozen, keyword-only value: the loop stores what it sent and got
back in events, so none of it may change after it was made. `ToolCall.arguments` is the
model's raw text on purpose — validating it is the loop's job, and a malformed payload
must reach the loop intact so the model can be told what was wrong with it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from math import inf
from typing import Any, Literal, Protocol

from keel.core.errors import ModelError

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True, kw_only=True)
class ToolCall:
    """One tool call the model proposed; `arguments` is the JSON text exactly as produced."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True, kw_only=True)
class Message:
    """One conversation entry sent to the model.

    An assistant message carries `tool_calls`; a tool message answers one of them by
    `tool_call_id`. There is deliberately no reasoning field: a model's reasoning is
    recorded in `ModelTurn.reasoning` and never sent back.
    """

    role: Role
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class ToolSpec:
    """A tool offered to the model: `parameters` is its arguments' JSON schema."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class TokenUsage:
    """Tokens the provider billed for one turn (0 when it did not report them)."""

    input_tokens: int
    output_tokens: int


@dataclass(frozen=True, kw_only=True)
class ModelTurn:
    """What the model answered in one turn, with its usage and cost in USD.

    `reasoning` is a reasoning model's thinking (DeepSeek's ``reasoning_content``): kept
    for the record, never part of what is sent back to the provider.
    """

    content: str | None
    tool_calls: tuple[ToolCall, ...]
    usage: TokenUsage
    cost: float
    model: str
    reasoning: str | None = None

    def __post_init__(self) -> None:
        # The cost is added to the run's cost budget and stored: NaN would disable the
        # budget and infinity end it at once, and neither is JSON. Refused where it enters.
        cost: object = self.cost
        if not _finite_cost(cost):
            raise ModelError(
                f"{self.model}: a turn's cost must be a finite number of USD, 0 or more, "
                f"got {cost!r}"
            )


def _finite_cost(cost: object) -> bool:
    if isinstance(cost, bool) or not isinstance(cost, int | float):
        return False
    try:
        return 0 <= float(cost) < inf
    except OverflowError:  # an integer too large for a float
        return False


@dataclass(frozen=True, kw_only=True)
class RetryNotice:
    """Sent before a retry: attempt `attempt` (1-based) failed with `error`; the next
    attempt starts after `wait_seconds`."""

    attempt: int
    wait_seconds: float
    error: str
    status_code: int | None


@dataclass(frozen=True, kw_only=True)
class ModelRequest:
    """One call to the model.

    `step` is how many model turns the run already had (0-based): a scripted model plays
    turn `step`, so a resumed run continues where it stopped. `on_retry` is called before
    each retry of a transient failure, so the loop can record it.
    """

    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...]
    step: int
    on_retry: Callable[[RetryNotice], None] | None = None


class Model(Protocol):
    """Anything that answers a `ModelRequest` with a `ModelTurn`.

    `complete` raises `keel.core.errors.ModelError` when the provider refused (at once,
    ``transient=False``) or kept failing (after retries, ``transient=True``); the error's
    message carries the provider's own words.
    """

    spec: str

    def complete(self, request: ModelRequest) -> ModelTurn: ...
