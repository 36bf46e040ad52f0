"""One adapter for every OpenAI-compatible chat-completions server.

It serves ``deepseek:MODEL`` and ``openai:MODEL`` (and through ``OPENAI_BASE_URL`` vLLM,
Ollama, LM Studio …). Requests are not streamed, so a connection cut mid-answer is an
ordinary failed attempt and is retried whole.

Failure policy, the part a run's outcome depends on:

- transient (HTTP 408/409/425/429/5xx, timeouts, refused or dropped connections, a body
  that is not JSON): retried with exponential backoff and jitter, at most `max_attempts`
  attempts and `max_wait` seconds of sleeping in total; ``Retry-After`` (or OpenAI's
  ``retry-after-ms``) is honoured within that budget. Before each retry
  ``request.on_retry`` is told why and how long the wait is. Giving up raises
  ``ModelError(transient=True)`` naming the last provider error.
- anything else (400, 401, 403, 404, 422 …): ``ModelError(transient=False)`` at once,
  carrying the provider's own message.

What is sent back never contains a model's reasoning: `Message` has no field for it.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any

from tenacity import RetryCallState, Retrying, retry_if_exception_type

from keel.core.budget import MAX_COUNT
from keel.core.errors import ConfigError, ModelError
from keel.models.base import (
    Message,
    ModelRequest,
    ModelTurn,
    RetryNotice,
    TokenUsage,
    ToolCall,
    ToolSpec,
)
from keel.models.pricing import PriceTable

if TYPE_CHECKING:
    import httpx

TRANSIENT_STATUS_CODES = frozenset({408, 409, 425, 429})
_EXCERPT_CHARS = 500


class _TransientError(Exception):
    """One failed attempt worth retrying; `retry_after` is the server's requested wait."""

    def __init__(self, message: str, *, status_code: int | None, retry_after: float | None):
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.retry_after = retry_after


class OpenAICompatModel:
    """A `Model` talking to ``{base_url}/chat/completions`` with a bearer key.

    `timeout` bounds each network operation (connect, each read) in seconds; the retry
    settings are described in the module docstring. `api_key_variable` only names the
    variable to check in an authentication error message.
    """

    def __init__(
        self,
        *,
        spec: str,
        model: str,
        base_url: str,
        api_key: str,
        prices: PriceTable | None = None,
        max_attempts: int = 5,
        max_wait: float = 60.0,
        initial_wait: float = 1.0,
        timeout: float = 120.0,
        api_key_variable: str = "OPENAI_API_KEY",
        jitter: Callable[[], float] = random.random,
    ) -> None:
        if max_attempts < 1:
            raise ConfigError(f"max_attempts must be at least 1, got {max_attempts}")
        if max_wait < 0 or initial_wait < 0:
            raise ConfigError("max_wait and initial_wait must not be negative")
        if timeout <= 0:
            raise ConfigError(f"timeout must be positive, got {timeout}")
        self.spec = spec
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.prices = prices if prices is not None else PriceTable()
        self.max_attempts = max_attempts
        self.max_wait = max_wait
        self.initial_wait = initial_wait
        self.timeout = timeout
        self.api_key_variable = api_key_variable
        self._api_key = api_key
        self._jitter = jitter

    def __repr__(self) -> str:  # never shows the key
        return f"OpenAICompatModel(spec={self.spec!r}, base_url={self.base_url!r})"

    @property
    def endpoint(self) -> str:
        return f"{self.base_url}/chat/completions"

    def complete(self, request: ModelRequest) -> ModelTurn:
        body = request_body(self.model, request.messages, request.tools)
        retrying = Retrying(
            retry=retry_if_exception_type(_TransientError),
            wait=self._next_wait,
            stop=self._should_stop,
            before_sleep=lambda state: self._notify(state, request),
            reraise=True,
        )
        headers = {
            "Authorization": f"Bearer {self._api_key}",
            "Content-Type": "application/json",
            "User-Agent": "keel",
        }
        import httpx  # noqa: PLC0415 - imported on first use: it costs every `keel` start 0.15 s

        attempts = 0
        with httpx.Client(timeout=httpx.Timeout(self.timeout), headers=headers) as client:
            try:
                for attempt in retrying:
                    with attempt:
                        attempts += 1
                        payload = self._post(client, body)
            except _TransientError as exc:
                waited = retrying.statistics.get("idle_for", 0.0)
                raise ModelError(
                    f"{self.spec}: gave up after {attempts} attempt(s) and {waited:.2f}s of "
                    f"backoff; last error: {exc.message}",
                    status_code=exc.status_code,
                    transient=True,
                ) from exc
        return self._turn(payload, request.step)

    # --- one attempt -------------------------------------------------------------------

    def _post(self, client: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
        import httpx  # noqa: PLC0415 - already loaded by complete()

        try:
            response = client.post(self.endpoint, json=body)
        except httpx.TimeoutException as exc:
            raise _TransientError(
                f"no answer within {self.timeout:g}s ({type(exc).__name__})",
                status_code=None,
                retry_after=None,
            ) from exc
        except (httpx.NetworkError, httpx.RemoteProtocolError) as exc:
            raise _TransientError(
                f"connection failed ({type(exc).__name__}: {exc})",
                status_code=None,
                retry_after=None,
            ) from exc
        except httpx.HTTPError as exc:
            raise ModelError(
                f"{self.spec}: cannot reach {self.endpoint}: {type(exc).__name__}: {exc}"
            ) from exc
        return self._payload(response)

    def _payload(self, response: httpx.Response) -> dict[str, Any]:
        status = response.status_code
        try:
            parsed: Any = response.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            parsed = None
        if status == 200 and isinstance(parsed, dict):
            return parsed
        if status == 200:
            raise _TransientError(
                f"HTTP 200 with a body that is not a JSON object: {_excerpt(response.text)}",
                status_code=status,
                retry_after=None,
            )
        detail = provider_error_message(parsed, response.text)
        if status in TRANSIENT_STATUS_CODES or status >= 500:
            raise _TransientError(
                f"HTTP {status}: {detail}",
                status_code=status,
                retry_after=retry_after_seconds(response.headers),
            )
        hint = ""
        if status in (401, 403):
            hint = f" (check {self.api_key_variable})"
        elif status == 404:
            hint = f" (check the model name and the base URL {self.base_url})"
        elif 300 <= status < 400:
            hint = f" (unexpected redirect; check the base URL {self.base_url})"
        raise ModelError(
            f"{self.spec}: provider answered HTTP {status}: {detail}{hint}",
            status_code=status,
            transient=False,
        )

    # --- retry policy --------------------------------------------------------------------

    def _next_wait(self, state: RetryCallState) -> float:
        backoff = self.initial_wait * 2.0 ** (state.attempt_number - 1)
        wait = backoff * (0.5 + 0.5 * self._jitter())
        failure = _failure_of(state)
        if failure is not None and failure.retry_after is not None:
            wait = max(wait, failure.retry_after)
        return max(0.0, min(wait, self.max_wait - state.idle_for))

    def _should_stop(self, state: RetryCallState) -> bool:
        waited_out = state.idle_for >= self.max_wait - 1e-9  # float sums of clamped waits
        return state.attempt_number >= self.max_attempts or waited_out

    def _notify(self, state: RetryCallState, request: ModelRequest) -> None:
        failure = _failure_of(state)
        if request.on_retry is None or failure is None:
            return
        request.on_retry(
            RetryNotice(
                attempt=state.attempt_number,
                wait_seconds=state.upcoming_sleep,
                error=failure.message,
                status_code=failure.status_code,
            )
        )

    # --- the answer ------------------------------------------------------------------------

    def _turn(self, payload: dict[str, Any], step: int) -> ModelTurn:
        choices = payload.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise ModelError(
                f"{self.spec}: the response has no choices: "
                f"{provider_error_message(payload, json.dumps(payload))}"
            )
        message = choices[0].get("message")
        if not isinstance(message, dict):
            raise ModelError(f"{self.spec}: the response's first choice has no message")
        usage = _usage(payload.get("usage"))
        reported_model = payload.get("model")
        return ModelTurn(
            content=_text(message.get("content")),
            tool_calls=_tool_calls(message.get("tool_calls"), step),
            usage=usage,
            cost=self._cost(usage),
            model=reported_model if isinstance(reported_model, str) else self.model,
            reasoning=_text(message.get("reasoning_content") or message.get("reasoning")),
        )

    def _cost(self, usage: TokenUsage) -> float:
        """The turn's cost in USD; ModelError when the reported usage gives no finite
        cost (absurd token counts), so a bogus number never reaches the budget."""
        if max(usage.input_tokens, usage.output_tokens) > MAX_COUNT:
            raise ModelError(
                f"{self.spec}: the provider reported {usage.input_tokens} prompt and "
                f"{usage.output_tokens} completion tokens for one turn (more than {MAX_COUNT}); "
                "refusing a usage report that cannot be right"
            )
        cost = self.prices.cost(self.spec, usage)
        if not 0 <= cost < math.inf:
            raise ModelError(
                f"{self.spec}: the reported usage gives a cost of {cost} USD; "
                "a cost must be a finite number, 0 or more"
            )
        return cost


# --- wire format (public so the loop's tests can compare against it) ---------------------


def request_body(
    model: str, messages: tuple[Message, ...], tools: tuple[ToolSpec, ...]
) -> dict[str, Any]:
    """The chat-completions request body; never carries reasoning content."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [wire_message(m) for m in messages],
        "stream": False,
    }
    if tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.parameters,
                },
            }
            for t in tools
        ]
    return body


def wire_message(message: Message) -> dict[str, Any]:
    """One message as the provider expects it."""
    if message.role == "tool":
        return {
            "role": "tool",
            "tool_call_id": message.tool_call_id or "",
            "content": message.content or "",
        }
    if message.role == "assistant" and message.tool_calls:
        return {
            "role": "assistant",
            "content": message.content,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for call in message.tool_calls
            ],
        }
    return {"role": message.role, "content": message.content or ""}


def provider_error_message(parsed: Any, raw_text: str) -> str:
    """The provider's own error message from an OpenAI-style error body, else the body."""
    if isinstance(parsed, dict):
        error = parsed.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(error, str):
            return error
        for key in ("message", "detail"):
            if isinstance(parsed.get(key), str):
                return str(parsed[key])
    return _excerpt(raw_text) or "(empty body)"


def retry_after_seconds(headers: Mapping[str, str], *, now: datetime | None = None) -> float | None:
    """The server's requested wait: ``retry-after-ms``, or ``Retry-After`` as seconds or
    an HTTP date; None when absent or unreadable."""
    milliseconds = headers.get("retry-after-ms")
    if milliseconds is not None:
        try:
            return max(0.0, float(milliseconds) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def _failure_of(state: RetryCallState) -> _TransientError | None:
    if state.outcome is None:
        return None
    exc = state.outcome.exception()
    return exc if isinstance(exc, _TransientError) else None


def _usage(raw: Any) -> TokenUsage:
    if not isinstance(raw, dict):
        return TokenUsage(input_tokens=0, output_tokens=0)
    return TokenUsage(
        input_tokens=_count(raw.get("prompt_tokens")),
        output_tokens=_count(raw.get("completion_tokens")),
    )


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # content parts: [{"type": "text", "text": "…"}]
        parts = [p.get("text", "") for p in value if isinstance(p, dict)]
        return "".join(p for p in parts if isinstance(p, str))
    return None


def _tool_calls(raw: Any, step: int) -> tuple[ToolCall, ...]:
    if not isinstance(raw, list):
        return ()
    calls = []
    for index, item in enumerate(raw):
        if not isinstance(item, dict):
            continue
        function = item.get("function")
        function = function if isinstance(function, dict) else {}
        arguments = function.get("arguments")
        if arguments is None:
            arguments = ""
        elif not isinstance(arguments, str):  # some servers send the object itself
            arguments = json.dumps(arguments, ensure_ascii=False)
        call_id = item.get("id")
        name = function.get("name")
        calls.append(
            ToolCall(
                id=call_id if isinstance(call_id, str) and call_id else f"call_{step}_{index}",
                name=name if isinstance(name, str) else "",
                arguments=arguments,
            )
        )
    return tuple(calls)


def _excerpt(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _EXCERPT_CHARS else text[:_EXCERPT_CHARS] + "…"


__all__ = [
    "OpenAICompatModel",
    "provider_error_message",
    "request_body",
    "retry_after_seconds",
    "wire_message",
]
