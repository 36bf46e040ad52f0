"""One adapter for every OpenAI-compatible chat-completions server.

It serves ``deepseek:MODEL`` and ``openai:MODEL`` (and through ``OPENAI_BASE_URL`` vLLM,
Ollama, LM Studio …); what differs between providers comes from its `ProviderProfile`.
The request body is `keel.models.wire.request_body`; the answer, streamed or not, is
read by `keel.models.wire.parse_response`.

Streaming (the default): the body says ``"stream": true`` (with the profile's
``stream_options``, asking for usage in the last chunk); pieces go to
``request.on_delta`` as they arrive, tagged with the attempt number, and the stream is
folded into one payload (`keel.models.stream`). A server that answers a stream request
with plain JSON is read as JSON (decided by the response's content type). A turn is
returned only once the stream has ended properly: a stream cut mid-answer, a dropped
connection or a timeout between pieces is a failed attempt, retried whole, and nothing
of the partial answer is kept.

Failure policy, the part a run's outcome depends on (`keel.models.provider_errors`):

- transient (HTTP 408/409/425/429 other than an exhausted quota, 5xx, timeouts, refused
  or dropped connections, a cut stream, a body that is not JSON, an error object
  mid-stream, a finish reason the profile says to ask again for): retried with
  exponential backoff and jitter, at most `max_attempts` attempts and `max_wait`
  seconds of sleeping in total; ``Retry-After`` (or OpenAI's ``retry-after-ms``) is
  honoured within that budget. Before each retry ``request.on_retry`` is told why and
  how long the wait is. Giving up raises ``ModelError(transient=True)`` naming the last
  provider error.
- out of credit, an over-long context, authentication, any other 4xx:
  ``ModelError(transient=False)`` at once with its `reason`, carrying the provider's
  own message and error body.

Connections come from the process's shared pool (`keel.models.connections`); the API
key travels in each request's headers only.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from tenacity import RetryCallState, Retrying, retry_if_exception_type

from keel.core.budget import MAX_COUNT
from keel.core.errors import ConfigError, ModelError
from keel.models.base import ModelRequest, ModelTurn, RetryNotice, TokenUsage, ToolSpec
from keel.models.connections import shared_client
from keel.models.pricing import PriceTable
from keel.models.profiles import ProviderProfile, profile_for
from keel.models.provider_errors import (
    TRANSIENT_STATUS_CODES,
    TransientFailure,
    classify_error_object,
    classify_http_failure,
    provider_error_message,
    retry_after_seconds,
)
from keel.models.stream import StreamAccumulator, StreamCut, StreamError, body_lines
from keel.models.wire import ParsedResponse, parse_response, request_body

if TYPE_CHECKING:
    import httpx

_EXCERPT_CHARS = 500
MAX_ANSWER_BYTES = 64 * 1024 * 1024  # no real answer comes near; a broken server might
MAX_ANSWER_SECONDS = 1800.0  # one attempt, first byte sent to last byte read


class OpenAICompatModel:
    """A `Model` talking to ``{base_url}/chat/completions`` with a bearer key.

    `profile` defaults to `profile_for` the spec's provider at `base_url`; `stream`
    asks for streamed answers. `timeout` bounds each network operation (connect, each
    read — so a stream may last longer, as long as pieces keep coming) in seconds;
    `max_answer_seconds` bounds one attempt as a whole, so a server that keeps a stream
    alive with comments forever is cut (a transient failure, retried), and
    `max_answer_bytes` bounds what one answer may hold (more is a `ModelError`: nothing
    is kept in memory past it). The retry settings are described in the module
    docstring. `api_key_variable` (default: the profile's) only names the variable to
    check in an authentication error.
    """

    def __init__(
        self,
        *,
        spec: str,
        model: str,
        base_url: str,
        api_key: str,
        profile: ProviderProfile | None = None,
        prices: PriceTable | None = None,
        stream: bool = True,
        max_attempts: int = 5,
        max_wait: float = 60.0,
        initial_wait: float = 1.0,
        timeout: float = 120.0,
        max_answer_seconds: float = MAX_ANSWER_SECONDS,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
        api_key_variable: str | None = None,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        if max_attempts < 1:
            raise ConfigError(f"max_attempts must be at least 1, got {max_attempts}")
        if max_wait < 0 or initial_wait < 0:
            raise ConfigError("max_wait and initial_wait must not be negative")
        if timeout <= 0:
            raise ConfigError(f"timeout must be positive, got {timeout}")
        if max_answer_seconds <= 0 or max_answer_bytes <= 0:
            raise ConfigError("max_answer_seconds and max_answer_bytes must be positive")
        self.spec = spec
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.profile = profile or profile_for(spec.partition(":")[0], self.base_url)
        self.prices = prices if prices is not None else PriceTable()
        self.stream = stream
        self.max_attempts = max_attempts
        self.max_wait = max_wait
        self.initial_wait = initial_wait
        self.timeout = timeout
        self.max_answer_seconds = max_answer_seconds
        self.max_answer_bytes = max_answer_bytes
        self.api_key_variable = api_key_variable or self.profile.key_variable
        self._api_key = api_key
        self._jitter = jitter
        self._url: httpx.URL | None = None  # the endpoint, parsed once (on first use)
        # The tool list's JSON text and the specs it came from: the same list is offered
        # every turn (every run of a worker shares it), and it can be half of a request.
        self._tools_json: tuple[Sequence[ToolSpec], str] | None = None

    def __repr__(self) -> str:  # never shows the key
        return (
            f"OpenAICompatModel(spec={self.spec!r}, base_url={self.base_url!r}, "
            f"profile={self.profile.name!r}, stream={self.stream})"
        )

    @property
    def endpoint(self) -> str:
        return f"{self.base_url}/chat/completions"

    @property
    def priced(self) -> bool:
        """Whether this spec has a price, so a cost budget can bite (`price_known`)."""
        return self.prices.price_of(self.spec) is not None

    def complete(self, request: ModelRequest) -> ModelTurn:
        content = self.request_content(request)
        headers = {"Authorization": f"Bearer {self._api_key}", "Content-Type": "application/json"}
        retrying = Retrying(
            retry=retry_if_exception_type(TransientFailure),
            wait=self._next_wait,
            stop=self._should_stop,
            before_sleep=lambda state: self._notify(state, request),
            reraise=True,
        )
        attempts = 0
        try:
            for attempt in retrying:
                with attempt:
                    attempts = attempt.retry_state.attempt_number
                    parsed = self._attempt(content, headers, request, attempts)
        except TransientFailure as exc:
            waited = retrying.statistics.get("idle_for", 0.0)
            raise ModelError(
                f"{self.spec}: gave up after {attempts} attempt(s) and {waited:.2f}s of "
                f"backoff; last error: {exc.message}",
                status_code=exc.status_code,
                transient=True,
            ) from exc
        return self._turn(parsed)

    def request_content(self, request: ModelRequest) -> bytes:
        """The exact bytes POSTed for `request` (every attempt sends the same)."""
        body = request_body(
            self.profile, self.model, request.messages, request.tools, stream=self.stream
        )
        return self._encode(body, request.tools)

    def _encode(self, body: dict[str, Any], tools: Sequence[ToolSpec]) -> bytes:
        """`body` as JSON bytes, encoded once and sent as is by every attempt (ASCII
        JSON: the fastest encoder). The ``tools`` member is encoded once for each
        specs object `tools` (the same while it is), and goes last."""
        offered = body.pop("tools", None)
        text = json.dumps(body, separators=(",", ":"))
        if offered is None:
            return text.encode("ascii")
        known = self._tools_json
        if known is None or known[0] is not tools:
            known = self._tools_json = (tools, json.dumps(offered, separators=(",", ":")))
        return f'{text[:-1]},"tools":{known[1]}}}'.encode("ascii")

    # --- one attempt -------------------------------------------------------------------

    def _attempt(
        self, content: bytes, headers: dict[str, str], request: ModelRequest, attempt: int
    ) -> ParsedResponse:
        """One request and its whole answer, parsed; raises `TransientFailure` for
        anything worth asking again, `ModelError` for anything that is not."""
        import httpx  # noqa: PLC0415 - loaded by shared_client on first use

        client = shared_client(self.base_url, self.timeout)
        url = self._url
        if url is None:
            url = self._url = httpx.URL(self.endpoint)
        deadline = time.monotonic() + self.max_answer_seconds
        try:
            with client.stream("POST", url, content=content, headers=headers) as response:
                payload = self._read(response, request, attempt, deadline)
        except httpx.TimeoutException as exc:
            raise TransientFailure(
                f"no answer within {self.timeout:g}s ({type(exc).__name__})"
            ) from exc
        except (httpx.NetworkError, httpx.RemoteProtocolError) as exc:
            raise TransientFailure(f"connection failed ({type(exc).__name__}: {exc})") from exc
        except StreamCut as exc:
            raise TransientFailure(str(exc), status_code=200) from exc
        except StreamError as exc:
            raise self._error_object(exc.text, exc.error) from exc
        except httpx.HTTPError as exc:
            raise ModelError(
                f"{self.spec}: cannot reach {self.endpoint}: {type(exc).__name__}: {exc}"
            ) from exc
        except RuntimeError as exc:
            if not client.is_closed:
                raise
            # The shared pool was closed under this call (the harness closing): the
            # next attempt opens a new one.
            raise TransientFailure("the connection pool was closed; reconnecting") from exc
        parsed = parse_response(self.profile, payload, model=self.model, step=request.step)
        if parsed.retry:
            raise TransientFailure(
                f"the provider ended the answer with finish_reason "
                f"{parsed.provider_finish_reason!r}, which means: ask again",
                status_code=200,
            )
        return parsed

    def _read(
        self, response: httpx.Response, request: ModelRequest, attempt: int, deadline: float
    ) -> dict[str, Any]:
        """The answer as a non-streaming payload, whether it came streamed or not, read
        within `deadline` (a monotonic time) and `max_answer_bytes`."""
        chunks = self._bounded(response.iter_bytes(), deadline)
        encoding = response.encoding or "utf-8"
        status = response.status_code
        if status != 200:
            text = b"".join(chunks).decode(encoding, "replace")
            raise classify_http_failure(
                self.profile,
                status=status,
                text=text,
                headers=response.headers,
                spec=self.spec,
                base_url=self.base_url,
                key_variable=self.api_key_variable,
            )
        content_type = response.headers.get("content-type", "")
        if content_type.startswith("text/event-stream"):
            accumulator = StreamAccumulator(
                self.profile.reasoning_fields, on_delta=request.on_delta, attempt=attempt
            )
            accumulator.feed_lines(body_lines(chunks, encoding))
            return accumulator.payload()
        body = b"".join(chunks)
        try:
            parsed: Any = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            parsed = None
        text = body.decode(encoding, "replace")
        if not isinstance(parsed, dict):
            raise TransientFailure(
                f"HTTP 200 with a body that is not a JSON object: {_excerpt(text)}",
                status_code=status,
            )
        if "error" in parsed and not parsed.get("choices"):
            raise self._error_object(text, parsed["error"])
        return parsed

    def _bounded(self, chunks: Iterable[bytes], deadline: float) -> Iterator[bytes]:
        """`chunks` while the answer stays within its size and time bounds."""
        received = 0
        for chunk in chunks:
            received += len(chunk)
            if received > self.max_answer_bytes:
                raise ModelError(
                    f"{self.spec}: the answer passed {self.max_answer_bytes} bytes; "
                    "refusing to read more of it"
                )
            if time.monotonic() > deadline:
                raise TransientFailure(
                    f"the answer was still arriving after {self.max_answer_seconds:g}s; "
                    "cut and asked again"
                )
            yield chunk

    def _error_object(self, text: str, error: Any) -> ModelError | TransientFailure:
        return classify_error_object(
            self.profile, text=text, error=error, spec=self.spec, base_url=self.base_url
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

    def _turn(self, parsed: ParsedResponse) -> ModelTurn:
        return ModelTurn(
            content=parsed.content,
            tool_calls=parsed.tool_calls,
            usage=parsed.usage,
            cost=self._cost(parsed.usage),
            model=parsed.model,
            reasoning=parsed.reasoning,
            finish_reason=parsed.finish_reason,
            provider_finish_reason=parsed.provider_finish_reason,
            refusal=parsed.refusal,
        )

    def _cost(self, usage: TokenUsage) -> float:
        """The turn's cost in USD; ModelError when the reported usage gives no finite
        cost (absurd token counts), so a bogus number never reaches the budget."""
        counts = usage.to_dict()
        if max(counts.values()) > MAX_COUNT:
            reported = ", ".join(f"{count} {kind}" for kind, count in counts.items())
            raise ModelError(
                f"{self.spec}: the provider reported {reported} for one turn (a count "
                f"above {MAX_COUNT}); refusing a usage report that cannot be right"
            )
        cost = self.prices.cost(self.spec, usage)
        if not 0 <= cost < math.inf:
            raise ModelError(
                f"{self.spec}: the reported usage gives a cost of {cost} USD; "
                "a cost must be a finite number, 0 or more"
            )
        return cost


def _failure_of(state: RetryCallState) -> TransientFailure | None:
    if state.outcome is None:
        return None
    exc = state.outcome.exception()
    return exc if isinstance(exc, TransientFailure) else None


def _excerpt(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _EXCERPT_CHARS else text[:_EXCERPT_CHARS] + "…"


__all__ = [
    "TRANSIENT_STATUS_CODES",
    "OpenAICompatModel",
    "provider_error_message",
    "retry_after_seconds",
]
