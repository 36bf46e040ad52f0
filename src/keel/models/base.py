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
    `tool_call_id`. `reasoning` is the assistant's recorded reasoning (from
    ``model_responded``): whether it is sent back is the provider profile's decision
    (`keel.models.profiles`), never the caller's — DeepSeek's thinking mode requires it
    on turns that made tool calls, other providers never get it.
    """

    role: Role
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    reasoning: str | None = None


@dataclass(frozen=True, kw_only=True)
class ToolSpec:
    """A tool offered to the model: `parameters` is its arguments' JSON schema."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class TokenUsage:
    """Tokens the provider billed for one turn (0 when it did not report them).

    `input_tokens` counts every prompt token, cached ones included; `cached_input_tokens`
    is the part served from the provider's prompt cache (billed at the cache-hit price).
    `output_tokens` counts every completion token, reasoning included; `reasoning_tokens`
    is the part spent thinking.
    """

    input_tokens: int
    output_tokens: int
    cached_input_tokens: int = 0
    reasoning_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def to_dict(self) -> dict[str, int]:
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cached_input_tokens": self.cached_input_tokens,
            "reasoning_tokens": self.reasoning_tokens,
        }


FinishReason = Literal["stop", "tool_calls", "length", "content_filter", "refusal"]
"""Why a turn ended, normalised by the provider profile. ``length``: cut at the output
limit (not a final answer; its tool calls are incomplete). ``content_filter`` and
``refusal``: the provider declined (the run fails, never retried blindly). A reason
the profile does not know is recorded as sent (`ModelTurn.provider_finish_reason`) and
treated as ``stop``."""


@dataclass(frozen=True, kw_only=True)
class ModelTurn:
    """What the model answered in one turn, with its usage and cost in USD.

    `reasoning` is a reasoning model's thinking (DeepSeek's ``reasoning_content``): kept
    for the record; sent back only where the provider profile requires it.
    `finish_reason` is normalised (`FinishReason`); `provider_finish_reason` is the
    provider's own word when it differs (an unknown reason, ``function_call``, an OpenAI
    ``refusal`` message) and None otherwise. `refusal` is the provider's refusal text.
    """

    content: str | None
    tool_calls: tuple[ToolCall, ...]
    usage: TokenUsage
    cost: float
    model: str
    reasoning: str | None = None
    finish_reason: FinishReason = "stop"
    provider_finish_reason: str | None = None
    refusal: str | None = None

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


@dataclass(slots=True, kw_only=True)
class StreamDelta:
    """A piece of a turn as it streams in: for watching only, never stored.

    Not frozen, unlike the records above: one is made per streamed piece, thousands a
    turn, and a frozen dataclass costs twice as much to make (measured in
    ``bench/models.py``). Nothing keeps a delta, so nothing can change one under a reader.

    `kind` is ``content``, ``reasoning`` or ``tool_call`` (`text` is then a piece of the
    call's arguments, `name` its tool once known). `attempt` is the 1-based attempt it
    belongs to: a watcher that sees a higher attempt drops what it showed of the earlier
    one, because a stream cut mid-answer is retried whole.
    """

    kind: Literal["content", "reasoning", "tool_call"]
    text: str
    attempt: int = 1
    index: int = 0
    name: str | None = None


@dataclass(frozen=True, kw_only=True)
class ModelRequest:
    """One call to the model.

    `step` is how many model turns the run already had (0-based): a scripted model plays
    turn `step`, so a resumed run continues where it stopped. `on_retry` is called before
    each retry of a transient failure, so the loop can record it. `on_delta`, when set,
    receives a streaming model's pieces as they arrive (for a live view); it must be
    quick and must not raise. `purpose` is ``"turn"`` for the run's next turn and
    ``"summary"`` for a compaction's summary of dropped turns (``keel.loop.compaction``),
    asked at the same step: a cassette keeps the two apart and a scripted model answers a
    summary without spending a turn of its script.
    """

    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...]
    step: int
    on_retry: Callable[[RetryNotice], None] | None = None
    on_delta: Callable[[StreamDelta], None] | None = None
    purpose: str = "turn"


class Model(Protocol):
    """Anything that answers a `ModelRequest` with a `ModelTurn`.

    `complete` raises `keel.core.errors.ModelError` when the provider refused (at once,
    ``transient=False``) or kept failing (after retries, ``transient=True``); the error's
    message carries the provider's own words.
    """

    spec: str

    def complete(self, request: ModelRequest) -> ModelTurn: ...


def price_known(model: Model) -> bool:
    """Whether `model`'s turns carry a real cost, so a cost budget can bite.

    A model says so with a ``priced`` attribute (the HTTP adapter: its spec has a price);
    a model without one (scripted, test doubles) states its costs itself and counts as
    priced.
    """
    priced = getattr(model, "priced", True)
    return bool(priced)
