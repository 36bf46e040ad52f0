"""A model that plays a fixed list of assistant turns: for tests and demos.

Script format (SPEC.md, "Models")::

    [{"tool_calls": [{"name": "read_file", "arguments": {"path": "package.json"}}]},
     {"content": "done"}]

A turn may have ``content``, ``tool_calls``, ``reasoning``, ``usage``, ``cost`` (USD: a
finite number, 0 or more; ``NaN`` and ``Infinity``, which JSON scripts can spell, are
refused) and what a provider says of how the turn ended:

- ``usage``: ``{"input_tokens": N, "output_tokens": M, "cached_input_tokens": C,
  "reasoning_tokens": R}``, each a whole number (0 when left out); the cached input is
  part of the input (C <= N) and the reasoning part of the output (R <= M);
- ``finish_reason``: ``stop`` (default), ``tool_calls``, ``length`` (cut at the output
  limit: not final, its calls are not run), ``content_filter`` or ``refusal``;
- ``provider_finish_reason``: the provider's own word (e.g. an unknown reason the
  adapter treated as ``stop``), and ``refusal``: the provider's refusal text.

A tool call's ``arguments`` is a JSON value (serialised to text) or a string passed
verbatim, so a test can feed malformed JSON; its ``id`` defaults to
``call_<step>_<index>``.

The model plays turn ``request.step`` and keeps no position of its own: a resumed run,
which starts at the step it stopped at, continues the script where it left off.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast, get_args

from keel.core.budget import MAX_COUNT
from keel.core.errors import ConfigError, ModelError
from keel.models.base import FinishReason, ModelRequest, ModelTurn, TokenUsage, ToolCall

_TURN_KEYS = frozenset(
    {
        "content",
        "tool_calls",
        "reasoning",
        "usage",
        "cost",
        "finish_reason",
        "provider_finish_reason",
        "refusal",
    }
)
# What a scripted model answers when a compaction asks it to summarise (its script holds
# only the run's turns): a fixed text, free, so a scripted run with --context-summary
# plays the same turns as one without.
SCRIPTED_SUMMARY = ModelTurn(
    content="(a scripted model's summary: the turns above were compacted)",
    tool_calls=(),
    usage=TokenUsage(input_tokens=0, output_tokens=0),
    cost=0.0,
    model="scripted",
)

_USAGE_KEYS = ("input_tokens", "output_tokens", "cached_input_tokens", "reasoning_tokens")
_FINISH_REASONS: tuple[str, ...] = get_args(FinishReason)
_CALL_KEYS = frozenset({"name", "arguments", "id"})


class ScriptedModel:
    """Plays turn `request.step` of its script and records every request in `requests`.

    The script is checked when the model is made (a broken script raises `ConfigError`
    naming the turn), so a test fails at its setup rather than mid-run.
    """

    def __init__(self, turns: Sequence[Mapping[str, Any]], spec: str = "scripted:inline") -> None:
        if isinstance(turns, str | bytes) or not isinstance(turns, Sequence):
            raise ConfigError(f"{spec}: a script is a JSON list of turns")
        self.spec = spec
        self.requests: list[ModelRequest] = []
        self._turns = tuple(_parse_turn(spec, index, turn) for index, turn in enumerate(turns))

    @classmethod
    def from_file(cls, path: Path, *, spec: str | None = None) -> ScriptedModel:
        """Load a script file; a missing file or bad JSON raises `ConfigError` naming the
        file and, for bad JSON, the line and column."""
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError(f"scripted model file {path} does not exist") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read scripted model file {path}: {exc}") from exc
        try:
            turns = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"{path} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
            ) from exc
        if not isinstance(turns, list):
            raise ConfigError(f"{path}: a script is a JSON list of turns, got {_kind(turns)}")
        return cls(turns, spec=spec or f"scripted:{path}")

    def __len__(self) -> int:
        return len(self._turns)

    def complete(self, request: ModelRequest) -> ModelTurn:
        self.requests.append(request)
        if request.purpose == "summary":  # a compaction's summary is not a turn of the script
            return SCRIPTED_SUMMARY
        if not 0 <= request.step < len(self._turns):
            raise ModelError(
                f"scripted model has no turn {request.step} (script has {len(self._turns)})",
                transient=False,
            )
        return self._turns[request.step]

    def assert_consumed(self) -> None:
        """Fail (AssertionError) if turns after the last one played were never reached."""
        reached = max((r.step for r in self.requests), default=-1)
        left = len(self._turns) - (reached + 1)
        if left > 0:
            unplayed = ", ".join(str(i) for i in range(reached + 1, len(self._turns)))
            raise AssertionError(
                f"scripted model has {left} unplayed turn(s) of {len(self._turns)}: {unplayed}"
            )


def _parse_turn(spec: str, index: int, raw: Any) -> ModelTurn:
    where = f"{spec}: turn {index}"
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where} must be an object, got {_kind(raw)}")
    unknown = sorted(set(raw) - _TURN_KEYS)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(unknown)}; "
            f"expected some of {', '.join(sorted(_TURN_KEYS))}"
        )
    content = raw.get("content")
    reasoning = raw.get("reasoning")
    provider_finish = raw.get("provider_finish_reason")
    refusal = raw.get("refusal")
    for key, value in (
        ("content", content),
        ("reasoning", reasoning),
        ("provider_finish_reason", provider_finish),
        ("refusal", refusal),
    ):
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"{where}: {key} must be a string, got {_kind(value)}")
    finish = raw.get("finish_reason", "stop")
    if finish not in _FINISH_REASONS:
        raise ConfigError(
            f"{where}: finish_reason must be one of {', '.join(_FINISH_REASONS)}, "
            f"got {_shown(finish)}"
        )
    raw_calls = raw.get("tool_calls", [])
    if not isinstance(raw_calls, list):
        raise ConfigError(f"{where}: tool_calls must be a list, got {_kind(raw_calls)}")
    calls = tuple(_parse_call(where, index, i, call) for i, call in enumerate(raw_calls))
    cost = raw.get("cost", 0.0)
    if not _finite_non_negative(cost):
        raise ConfigError(
            f"{where}: cost must be a finite number of USD, 0 or more, got {_shown(cost)}"
        )
    return ModelTurn(
        content=content,
        tool_calls=calls,
        usage=_parse_usage(where, raw.get("usage")),
        cost=float(cost),
        model=spec,
        reasoning=reasoning,
        finish_reason=cast(FinishReason, finish),
        provider_finish_reason=provider_finish,
        refusal=refusal,
    )


def _parse_call(where: str, step: int, index: int, raw: Any) -> ToolCall:
    where = f"{where}, tool call {index}"
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where} must be an object, got {_kind(raw)}")
    unknown = sorted(set(raw) - _CALL_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; expected name, arguments")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}: name must be a non-empty string")
    call_id = raw.get("id", f"call_{step}_{index}")
    if not isinstance(call_id, str) or not call_id:
        raise ConfigError(f"{where}: id must be a non-empty string")
    arguments = raw.get("arguments", {})
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return ToolCall(id=call_id, name=name, arguments=text)


def _parse_usage(where: str, raw: Any) -> TokenUsage:
    if raw is None:
        return TokenUsage(input_tokens=0, output_tokens=0)
    if not isinstance(raw, Mapping) or set(raw) - set(_USAGE_KEYS):
        raise ConfigError(f"{where}: usage must be an object with some of {', '.join(_USAGE_KEYS)}")
    counts = {key: raw.get(key, 0) for key in _USAGE_KEYS}
    if any(
        isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_COUNT
        for n in counts.values()
    ):
        raise ConfigError(
            f"{where}: usage token counts must be whole numbers from 0 to {MAX_COUNT}"
        )
    if counts["cached_input_tokens"] > counts["input_tokens"]:
        raise ConfigError(f"{where}: usage cached_input_tokens is part of input_tokens: <= it")
    if counts["reasoning_tokens"] > counts["output_tokens"]:
        raise ConfigError(f"{where}: usage reasoning_tokens is part of output_tokens: <= it")
    return TokenUsage(**counts)


def _finite_non_negative(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return 0 <= float(value) < math.inf
    except OverflowError:  # an integer too large for a float
        return False


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", type(None): "null"}
    return names.get(type(value), type(value).__name__)
