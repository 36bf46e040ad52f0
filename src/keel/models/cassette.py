"""Record a run's model exchanges to a cassette, and play them back without a provider.

A cassette is a JSON Lines file. Line 1 is a header::

    {"keel_cassette": 1, "model": "openai:gpt-4o", "recorded_at": "2025-…Z"}

then one line per model call, in the order they happened::

    {"step": 0, "request_digest": "<sha256>", "request": {...}, "turn": {...}}

``step`` is `ModelRequest.step` (0-based: how many turns the run had before this call;
an exchange whose `ModelRequest.purpose` is not ``turn`` — a compaction's summary — also
has ``"purpose": "summary"``, and is played back only for a request of that purpose);
messages and events say "step N" counting from 1, as ``model_requested`` does. The
``request`` is the canonical request (`canonical_request`): messages with role, content,
tool calls, tool-call id and reasoning, and tools with name, description and parameters;
``request_digest`` is the SHA-256 of its canonical JSON (sorted keys, no spaces), so
the order of keys inside a tool's parameter schema never changes it. ``turn`` is the
whole `ModelTurn`.

Replay (`ReplayModel`) plays the turn recorded for a request's step only when the request
is the one recorded (same digest); at the first request that differs it stops the run
with a `ModelError` that names the step and the first difference. So a cassette is a
deterministic test of the harness: the same code, workspace and goal give the same run,
and a change anywhere the model can see is pointed at.

What is guaranteed and why:

- every exchange is appended, flushed and fsynced before the turn is handed back, so a
  crash keeps every finished exchange (a torn last line, written when the process died,
  is dropped: by the next recording before it appends, and ignored by replay);
- a resumed run records into the same file (the header must name the same model);
  should a step be recorded twice (a crash after recording, before the turn was
  stored), the LAST exchange for a step wins on replay;
- a call that failed (`ModelError`) records nothing;
- every string of the request and the turn goes through ``redact`` (the run's secret
  redactor) before it is written: the digest is over the redacted request. The loop
  builds requests from redacted events, so the two are the same in practice;
- no key, header or base URL is ever written: a `Model` call carries none of them (the
  adapter holds them), so there is nothing at this level to leak.

What a request is compared on is made portable (`canonical_request`): the workspace's
absolute path, which the system prompt names, is written as ``<workspace>`` wherever it
appears, so a cassette recorded in one checkout replays in another; and the wall time
left in the prompt's budget line (which no two runs share) is written as ``*``. Every
other character the model sees is compared.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from keel.core.errors import ConfigError, ModelError
from keel.models.base import (
    Message,
    Model,
    ModelRequest,
    ModelTurn,
    StreamDelta,
    TokenUsage,
    ToolCall,
    ToolSpec,
    price_known,
)

CASSETTE_VERSION = 1
EXCERPT_CHARS = 120  # longest value a divergence message quotes
_FINISH_REASONS = frozenset({"stop", "tool_calls", "length", "content_filter", "refusal"})
_USAGE_KINDS = ("input_tokens", "output_tokens", "cached_input_tokens", "reasoning_tokens")

Redact = Callable[[str], str]


# --- the canonical request -----------------------------------------------------------------


WORKSPACE_PLACEHOLDER = "<workspace>"
_WORKSPACE_LINE = re.compile(r"^Workspace: (.+)$", re.MULTILINE)
_WALL_TIME_LEFT = re.compile(r"^(Budget left: .*?wall time )[0-9.]+", re.MULTILINE)


PURPOSES = ("turn", "summary")


def canonical_request(request: ModelRequest) -> dict[str, Any]:
    """What of `request` decides the model's answer, as plain JSON data, made portable:
    the workspace path (from the system prompt's ``Workspace:`` line) becomes
    ``<workspace>`` in every message, and the wall time left becomes ``*``."""
    messages = [_message_json(m) for m in request.messages]
    workspace = _workspace_of(request.messages)
    for message in messages:
        for key in ("content", "reasoning"):
            text = message[key]
            if isinstance(text, str):
                if workspace:
                    text = text.replace(workspace, WORKSPACE_PLACEHOLDER)
                message[key] = _WALL_TIME_LEFT.sub(r"\g<1>*", text)
        if workspace:
            for call in message["tool_calls"]:
                call["arguments"] = call["arguments"].replace(workspace, WORKSPACE_PLACEHOLDER)
    return {"messages": messages, "tools": [_tool_json(t) for t in request.tools]}


def _workspace_of(messages: Sequence[Message]) -> str | None:
    """The workspace path the system prompt names (None without one, or when it is too
    short to replace safely, such as ``/``)."""
    for message in messages:
        if message.role != "system" or not message.content:
            continue
        found = _WORKSPACE_LINE.search(message.content)
        if found and len(found.group(1).strip()) > 1:
            return found.group(1).strip()
    return None


def request_digest(canonical: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of `canonical`'s JSON with sorted keys: independent of dict order."""
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def _message_json(message: Message) -> dict[str, Any]:
    return {
        "role": message.role,
        "content": message.content,
        "tool_calls": [_call_json(c) for c in message.tool_calls],
        "tool_call_id": message.tool_call_id,
        "reasoning": message.reasoning,
    }


def _tool_json(tool: ToolSpec) -> dict[str, Any]:
    return {"name": tool.name, "description": tool.description, "parameters": tool.parameters}


def _call_json(call: ToolCall) -> dict[str, str]:
    return {"id": call.id, "name": call.name, "arguments": call.arguments}


def turn_json(turn: ModelTurn) -> dict[str, Any]:
    """`turn` as plain JSON data (every field)."""
    return {
        "content": turn.content,
        "reasoning": turn.reasoning,
        "tool_calls": [_call_json(c) for c in turn.tool_calls],
        "usage": turn.usage.to_dict(),
        "cost": turn.cost,
        "model": turn.model,
        "finish_reason": turn.finish_reason,
        "provider_finish_reason": turn.provider_finish_reason,
        "refusal": turn.refusal,
    }


def _redacted(value: Any, redact: Redact) -> Any:
    """`value` with every string in it (keys too) passed through `redact`."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {redact(str(k)): _redacted(v, redact) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_redacted(v, redact) for v in value]
    return value


def _line(data: Mapping[str, Any]) -> bytes:
    """One JSON line; non-ASCII kept readable unless the text holds a lone surrogate."""
    text = json.dumps(data, ensure_ascii=False)
    try:
        return (text + "\n").encode("utf-8")
    except UnicodeEncodeError:
        return (json.dumps(data, ensure_ascii=True) + "\n").encode("ascii")


# --- recording -----------------------------------------------------------------------------


class RecordingModel:
    """A `Model` that answers through `inner` and appends each exchange to `path`.

    The header is checked (or written) when the model is made, so a cassette recorded
    from another model is refused (`ConfigError`) before the run calls anything.
    """

    def __init__(self, inner: Model, path: Path, redact: Redact | None = None) -> None:
        self.spec = inner.spec
        self.priced = price_known(inner)
        self.path = Path(path)
        self._inner = inner
        self._redact: Redact = redact or (lambda text: text)
        self._lock = threading.Lock()
        self._open_cassette()

    def complete(self, request: ModelRequest) -> ModelTurn:
        turn = self._inner.complete(request)  # a ModelError records nothing
        canonical = _redacted(canonical_request(request), self._redact)
        exchange = {
            "step": request.step,
            **({"purpose": request.purpose} if request.purpose != "turn" else {}),
            "request_digest": request_digest(canonical),
            "request": canonical,
            "turn": _redacted(turn_json(turn), self._redact),
        }
        try:
            with self._lock:
                _append(self.path, _line(exchange))
        except OSError as exc:
            raise ModelError(
                f"recording step {request.step + 1} to {self.path} failed: {exc}; the "
                f"cassette keeps the exchanges before it",
                transient=False,
            ) from exc
        return turn

    def _open_cassette(self) -> None:
        try:
            data = self.path.read_bytes() if self.path.exists() else b""
        except OSError as exc:
            raise ConfigError(f"cannot read cassette {self.path}: {exc}") from exc
        try:
            if data.strip():
                self._check_header(data)
                _drop_torn_tail(self.path, data)
                return
            header = {
                "keel_cassette": CASSETTE_VERSION,
                "model": self._redact(self.spec),
                "recorded_at": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
            }
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "wb") as file:
                file.write(_line(header))
                file.flush()
                os.fsync(file.fileno())
            _sync_directory(self.path.parent)
        except OSError as exc:
            raise ConfigError(f"cannot record to cassette {self.path}: {exc}") from exc

    def _check_header(self, data: bytes) -> None:
        first = data.split(b"\n", 1)[0]
        header = _header(self.path, first)
        recorded = header.get("model")
        if recorded != self._redact(self.spec):
            raise ConfigError(
                f"{self.path} was recorded from model {recorded!r}, not {self.spec!r}: "
                f"record to a new file"
            )


def _append(path: Path, line: bytes) -> None:
    with open(path, "ab") as file:
        file.write(line)
        file.flush()
        os.fsync(file.fileno())


def _drop_torn_tail(path: Path, data: bytes) -> None:
    """Cut a last line the previous recorder died writing (no newline at its end)."""
    if data.endswith(b"\n"):
        return
    with open(path, "r+b") as file:
        file.truncate(data.rfind(b"\n") + 1)
        file.flush()
        os.fsync(file.fileno())


def _sync_directory(directory: Path) -> None:
    """Make a new file's name durable (best effort: not every system can fsync a folder)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# --- replaying -----------------------------------------------------------------------------


class ReplayModel:
    """A `Model` that plays a cassette's turns, refusing any request not the one recorded.

    `priced` is True: the recorded costs are replayed, so a cost budget bites as it did.
    """

    priced = True

    def __init__(
        self,
        exchanges: Mapping[tuple[int, str], tuple[str, dict[str, Any], ModelTurn]],
        *,
        spec: str,
    ) -> None:
        """``exchanges`` by (step, purpose): digest, canonical request, turn."""
        self.spec = spec
        self._exchanges: dict[tuple[int, str], tuple[str, dict[str, Any], ModelTurn]] = dict(
            exchanges
        )

    @classmethod
    def from_file(cls, path: Path, spec: str | None = None) -> ReplayModel:
        """Load `path`; `ConfigError` naming the file (and line) when it is missing, its
        header is not a cassette's, or a line is not a well-formed exchange."""
        path = Path(path)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise ConfigError(f"replay cassette {path} does not exist") from None
        except OSError as exc:
            raise ConfigError(f"cannot read replay cassette {path}: {exc}") from exc
        lines = data.split(b"\n")
        torn = not data.endswith(b"\n")  # the recorder died writing the last line
        if not data.strip():
            raise ConfigError(f"{path} is empty: not a keel cassette")
        _header(path, lines[0])
        exchanges: dict[tuple[int, str], tuple[str, dict[str, Any], ModelTurn]] = {}
        for number, raw in enumerate(lines[1:], start=2):
            if not raw.strip():
                continue
            last = number == len(lines)
            try:
                step, purpose, digest, request, turn = _exchange(path, number, raw)
            except ConfigError:
                if last and torn:
                    break
                raise
            exchanges[step, purpose] = (digest, request, turn)  # the last one for a step wins
        return cls(exchanges, spec=spec or f"replay:{path}")

    @property
    def steps(self) -> int:
        """How many steps the cassette recorded (turns; summaries are not steps)."""
        return sum(1 for _, purpose in self._exchanges if purpose == "turn")

    def complete(self, request: ModelRequest) -> ModelTurn:
        shown = request.step + 1
        recorded = self._exchanges.get((request.step, request.purpose))
        if recorded is None:
            what = "exchange" if request.purpose == "turn" else f"{request.purpose} exchange"
            raise ModelError(
                f"the cassette has no {what} for step {shown} (it recorded {self.steps})",
                transient=False,
                reason="model_error",
            )
        digest, recorded_request, turn = recorded
        now = canonical_request(request)
        if request_digest(now) != digest:
            raise ModelError(
                f"replay diverged at step {shown}: {first_difference(recorded_request, now)}",
                transient=False,
                reason="model_error",
            )
        if request.on_delta is not None:
            if turn.reasoning:
                request.on_delta(StreamDelta(kind="reasoning", text=turn.reasoning))
            if turn.content:
                request.on_delta(StreamDelta(kind="content", text=turn.content))
        return turn


def _header(path: Path, raw: bytes) -> dict[str, Any]:
    expected = f'expected {{"keel_cassette": {CASSETTE_VERSION}, "model": …, "recorded_at": …}}'
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ConfigError(f"{path} line 1: not a keel cassette header ({expected})") from None
    if not isinstance(header, dict) or "keel_cassette" not in header:
        raise ConfigError(f"{path} line 1: not a keel cassette header ({expected})")
    if header["keel_cassette"] != CASSETTE_VERSION:
        raise ConfigError(
            f"{path} line 1: cassette version {header['keel_cassette']!r} is not supported "
            f"(this keel reads version {CASSETTE_VERSION})"
        )
    return header


def _exchange(
    path: Path, number: int, raw: bytes
) -> tuple[int, str, str, dict[str, Any], ModelTurn]:
    where = f"{path} line {number}"
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: not UTF-8 text") from None
    if not isinstance(data, dict) or not {"step", "request_digest", "request", "turn"} <= set(data):
        raise ConfigError(f"{where}: an exchange needs step, request_digest, request and turn")
    step, digest, request = data["step"], data["request_digest"], data["request"]
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ConfigError(f"{where}: step must be a whole number, 0 or more, got {step!r}")
    purpose = data.get("purpose", "turn")
    if purpose not in PURPOSES:
        raise ConfigError(f"{where}: purpose is one of {', '.join(PURPOSES)}, got {purpose!r}")
    if not _request_shape(request):
        raise ConfigError(f"{where}: request must hold lists of messages and tools")
    if digest != request_digest(request):
        raise ConfigError(
            f"{where}: request_digest does not match the recorded request (was the line edited?)"
        )
    return step, purpose, digest, request, _turn(where, data["turn"])


def _request_shape(request: Any) -> bool:
    if not isinstance(request, dict):
        return False
    messages, tools = request.get("messages"), request.get("tools")
    if not isinstance(messages, list) or not isinstance(tools, list):
        return False
    return all(isinstance(m, dict) for m in messages) and all(isinstance(t, dict) for t in tools)


def _turn(where: str, raw: Any) -> ModelTurn:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: turn must be an object")
    texts = ("content", "reasoning", "provider_finish_reason", "refusal")
    for key in texts:
        if raw.get(key) is not None and not isinstance(raw[key], str):
            raise ConfigError(f"{where}: turn {key} must be a string or null")
    finish = raw.get("finish_reason", "stop")
    if finish not in _FINISH_REASONS:
        raise ConfigError(
            f"{where}: turn finish_reason {finish!r} is not one of "
            f"{', '.join(sorted(_FINISH_REASONS))}"
        )
    model = raw.get("model")
    if not isinstance(model, str):
        raise ConfigError(f"{where}: turn model must be a string")
    try:
        return ModelTurn(
            content=raw.get("content"),
            reasoning=raw.get("reasoning"),
            tool_calls=_calls(where, raw.get("tool_calls", [])),
            usage=_usage(where, raw.get("usage", {})),
            cost=raw.get("cost", 0.0),
            model=model,
            finish_reason=finish,
            provider_finish_reason=raw.get("provider_finish_reason"),
            refusal=raw.get("refusal"),
        )
    except ModelError as exc:  # a cost that is not a finite number of USD
        raise ConfigError(f"{where}: {exc}") from None


def _calls(where: str, raw: Any) -> tuple[ToolCall, ...]:
    if not isinstance(raw, list):
        raise ConfigError(f"{where}: turn tool_calls must be a list")
    calls = []
    for index, call in enumerate(raw):
        if not isinstance(call, dict) or not all(
            isinstance(call.get(k), str) for k in ("id", "name", "arguments")
        ):
            raise ConfigError(
                f"{where}: turn tool call {index} needs string id, name and arguments"
            )
        calls.append(ToolCall(id=call["id"], name=call["name"], arguments=call["arguments"]))
    return tuple(calls)


def _usage(where: str, raw: Any) -> TokenUsage:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: turn usage must be an object")
    counts = {kind: raw.get(kind, 0) for kind in _USAGE_KINDS}
    for kind, count in counts.items():
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ConfigError(f"{where}: turn usage {kind} must be a whole number, 0 or more")
    return TokenUsage(**counts)


# --- the first difference ------------------------------------------------------------------


def first_difference(recorded: Mapping[str, Any], now: Mapping[str, Any]) -> str:
    """Where the request `now` first departs from the `recorded` one, in words."""
    old_tools, new_tools = recorded.get("tools", []), now.get("tools", [])
    old_messages, new_messages = recorded.get("messages", []), now.get("messages", [])
    for index, (old, new) in enumerate(zip(old_messages, new_messages, strict=False)):
        found = _message_difference(index, old, new)
        if found:
            return found
    if len(new_messages) != len(old_messages):
        longer = new_messages if len(new_messages) > len(old_messages) else old_messages
        first = longer[min(len(old_messages), len(new_messages))]
        word = "extra" if longer is new_messages else "missing"
        return (
            f"request has {len(new_messages)} messages, recorded {len(old_messages)} "
            f"(first {word}: {first.get('role')} {_excerpt(_message_text(first))})"
        )
    found = _tools_difference(old_tools, new_tools)
    return found or "the request differs from the recorded one"


def _message_difference(index: int, old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    where = f"message {index} ({old.get('role')})"
    if old.get("role") != new.get("role"):
        return f"message {index} role differs: recorded {old.get('role')} now {new.get('role')}"
    for key in ("content", "tool_call_id", "reasoning"):
        if old.get(key) != new.get(key):
            return f"{where} {_differ(key)}: {_values(old.get(key), new.get(key))}"
    old_calls, new_calls = old.get("tool_calls") or [], new.get("tool_calls") or []
    if len(old_calls) != len(new_calls):
        return f"{where} has {len(new_calls)} tool calls, recorded {len(old_calls)}"
    for number, (a, b) in enumerate(zip(old_calls, new_calls, strict=True)):
        for key in ("name", "arguments", "id"):
            if a.get(key) != b.get(key):
                return (
                    f"{where} tool call {number} ({a.get('name')}) {_differ(key)}: "
                    f"{_values(a.get(key), b.get(key))}"
                )
    return ""


def _tools_difference(old: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]]) -> str:
    old_names = [str(t.get("name")) for t in old]
    new_names = [str(t.get("name")) for t in new]
    if old_names != new_names:
        return f"tools differ: recorded {','.join(old_names)} now {','.join(new_names)}"
    for a, b in zip(old, new, strict=True):
        for key in ("description", "parameters"):
            if a.get(key) != b.get(key):
                return f"tool {a.get('name')} {_differ(key)}: {_values(a.get(key), b.get(key))}"
    return ""


def _differ(key: str) -> str:
    return f"{key} differ" if key in ("arguments", "parameters") else f"{key} differs"


def _values(old: Any, new: Any) -> str:
    """``recorded '…' now '…'``, both cut to the stretch where they start to differ."""
    old_text, new_text = _as_text(old), _as_text(new)
    at = 0
    if isinstance(old, str) and isinstance(new, str):
        at = next(
            (i for i, (a, b) in enumerate(zip(old_text, new_text, strict=False)) if a != b),
            min(len(old_text), len(new_text)),
        )
    return f"recorded {_excerpt(old, at)} now {_excerpt(new, at)}"


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def _message_text(message: Mapping[str, Any]) -> Any:
    if message.get("content") is None and message.get("tool_calls"):
        return ", ".join(f"{c.get('name')}({c.get('arguments')})" for c in message["tool_calls"])
    return message.get("content")


def _excerpt(value: Any, at: int = 0) -> str:
    """`value` quoted on one line, at most `EXCERPT_CHARS` characters between the quotes,
    starting a little before index `at` (where it differs) when that is far in."""
    if value is None:
        return "null"
    raw = _as_text(value)
    text = _one_line(raw)
    at = len(_one_line(raw[:at])) if isinstance(value, str) else 0
    start = at - 30 if at > EXCERPT_CHARS - 30 else 0
    lead = "…" if start else ""
    room = EXCERPT_CHARS - len(lead)
    piece = text[start : start + room]
    if start + room < len(text):
        piece = piece[: room - 1] + "…"
    return f"'{lead}{piece}'"


def _one_line(text: str) -> str:
    """`text` with backslashes, line breaks and tabs escaped: one unambiguous line."""
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
