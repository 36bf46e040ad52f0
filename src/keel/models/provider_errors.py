"""What a failed answer from a provider means: retry, stop the run, and what to say.

A failure is classified with the provider's profile (`keel.models.profiles`), because
the same status means different things at different providers — OpenAI reports an
exhausted quota as HTTP 429, like a rate limit, with ``"code": "insufficient_quota"``.

- out of credit (a status in ``out_of_credit_statuses`` or an error code/type in
  ``out_of_credit_codes``): ``ModelError(reason="out_of_credit")``, never retried; the
  message says to add credit to the provider account.
- over-long context (HTTP 400 with a code in ``context_overflow_codes`` or a message
  holding one of ``context_overflow_phrases``): ``reason="context_overflow"``.
- a refused prompt (HTTP 400 with a code in ``refusal_codes``: Azure OpenAI's
  ``content_filter``):
  ``reason="provider_refused:content_filter"``, never retried — the same refusal as a
  ``content_filter`` finish reason.
- 401/403: ``reason="authentication"``, naming the key variable to check.
- 408/409/425/429 and 5xx: `TransientFailure`, retried; ``Retry-After`` is kept.
- any other status: ``ModelError`` at once.

Every message carries the provider's own message and its whole error body, bounded to
`ERROR_BODY_CHARS`, so nested details (OpenRouter's ``error.metadata.raw``, the upstream
provider's name, ``code``/``type``/``param``) reach the run's record.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from keel.core.errors import ModelError

if TYPE_CHECKING:
    from keel.models.profiles import ProviderProfile

TRANSIENT_STATUS_CODES = frozenset({408, 409, 425, 429})
ERROR_BODY_CHARS = 4000
_EXCERPT_CHARS = 500
_BODY_SEPARATOR = " — provider's error body: "
_PROVIDER_NAMES = {"deepseek": "DeepSeek", "openai": "OpenAI"}


class TransientFailure(Exception):
    """One failed attempt worth retrying; `retry_after` is the server's requested wait
    in seconds. Never escapes the adapter: giving up turns the last one into
    ``ModelError(transient=True)``."""

    def __init__(
        self, message: str, *, status_code: int | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.retry_after = retry_after


def classify_http_failure(
    profile: ProviderProfile,
    *,
    status: int,
    text: str,
    headers: Mapping[str, str],
    spec: str,
    base_url: str,
    key_variable: str,
) -> ModelError | TransientFailure:
    """The meaning of a non-200 answer with body `text` (see the module docstring)."""
    parsed = _json_or_none(text)
    detail = _detail(parsed, text)
    code, kind = error_code_and_type(parsed)
    if status in profile.out_of_credit_statuses or _any_in(
        (code, kind), profile.out_of_credit_codes
    ):
        return _out_of_credit(profile, spec, base_url, f"HTTP {status}: {detail}", status)
    if status == 400 and _is_context_overflow(profile, code, kind, text):
        return ModelError(
            f"{spec}: the conversation is longer than the model's context (HTTP 400: {detail})",
            status_code=status,
            reason="context_overflow",
        )
    if status == 400 and _any_in((code, kind), profile.refusal_codes):
        # Azure OpenAI refuses a prompt its content filter flags with a 400 whose code is
        # content_filter: the same refusal as finish_reason content_filter, never retried.
        return ModelError(
            f"{spec}: the provider refused the request (HTTP 400: {detail})",
            status_code=status,
            reason="provider_refused:content_filter",
        )
    if status in TRANSIENT_STATUS_CODES or status >= 500:
        return TransientFailure(
            f"HTTP {status}: {detail}",
            status_code=status,
            retry_after=retry_after_seconds(headers),
        )
    hint, reason = "", "model_error"
    if status in (401, 403):
        hint, reason = f" (check {key_variable})", "authentication"
    elif status == 404:
        hint = f" (check the model name and the base URL {base_url})"
    elif 300 <= status < 400:
        hint = f" (unexpected redirect; check the base URL {base_url})"
    message, separator, body = detail.partition(_BODY_SEPARATOR)
    return ModelError(
        f"{spec}: provider answered HTTP {status}: {message}{hint}{separator}{body}",
        status_code=status,
        reason=reason,
    )


def classify_error_object(
    profile: ProviderProfile, *, text: str, error: Any, spec: str, base_url: str
) -> ModelError | TransientFailure:
    """The meaning of an error object sent with HTTP 200: inside a stream
    (``data: {"error": …}``) or as the whole body. Out of credit and an over-long
    context stop the run as above; an error carrying an HTTP status as its code
    (OpenRouter does) is classified by it; anything else — typically an upstream
    provider failing mid-answer — is transient: the attempt is retried whole."""
    parsed = _json_or_none(text)
    detail = _detail(parsed if parsed is not None else {"error": error}, text)
    code, kind = error_code_and_type(parsed if parsed is not None else {"error": error})
    where = "in its answer"
    if _any_in((code, kind), profile.out_of_credit_codes):
        return _out_of_credit(profile, spec, base_url, f"error {where}: {detail}", None)
    if _is_context_overflow(profile, code, kind, text):
        return ModelError(
            f"{spec}: the conversation is longer than the model's context "
            f"(error {where}: {detail})",
            reason="context_overflow",
        )
    status = int(code) if code is not None and code.isdigit() else None
    if status is not None and 400 <= status < 500 and status not in TRANSIENT_STATUS_CODES:
        reason = "authentication" if status in (401, 403) else "model_error"
        if status in profile.out_of_credit_statuses:
            return _out_of_credit(profile, spec, base_url, f"error {where}: {detail}", status)
        return ModelError(
            f"{spec}: provider sent an error {where}: {detail}",
            status_code=status,
            reason=reason,
        )
    return TransientFailure(f"error {where}: {detail}", status_code=status)


# --- reading error bodies ------------------------------------------------------------


def provider_error_message(parsed: Any, raw_text: str) -> str:
    """The provider's own error message from an OpenAI-style error body, else an excerpt
    of the body (at most about 500 characters)."""
    if isinstance(parsed, dict):
        error = parsed.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(error, str):
            return error
        for key in ("message", "detail"):
            if isinstance(parsed.get(key), str):
                return str(parsed[key])
    return _excerpt(raw_text, _EXCERPT_CHARS) or "(empty body)"


def error_body_text(parsed: Any, raw_text: str) -> str:
    """The whole error body for the record, bounded to `ERROR_BODY_CHARS`: compact JSON
    when it is JSON (nested details kept), else the text itself."""
    if parsed is not None:
        raw_text = json.dumps(parsed, ensure_ascii=False, separators=(",", ":"))
    return _excerpt(raw_text, ERROR_BODY_CHARS)


def error_code_and_type(parsed: Any) -> tuple[str | None, str | None]:
    """``error.code`` and ``error.type`` of an OpenAI-style body as text (a numeric code,
    as OpenRouter sends, becomes its digits); None where absent."""
    if not isinstance(parsed, dict):
        return None, None
    error = parsed.get("error")
    if not isinstance(error, dict):
        error = parsed
    return _word(error.get("code")), _word(error.get("type"))


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


def provider_display_name(profile: ProviderProfile, base_url: str) -> str:
    """How a message names the provider: DeepSeek, OpenAI, or the server's host."""
    known = _PROVIDER_NAMES.get(profile.name)
    if known is not None:
        return known
    host = urlsplit(base_url).hostname
    return f"the provider at {host}" if host else "the provider"


# --- helpers --------------------------------------------------------------------------


def _out_of_credit(
    profile: ProviderProfile, spec: str, base_url: str, what: str, status: int | None
) -> ModelError:
    provider = provider_display_name(profile, base_url)
    known = provider in _PROVIDER_NAMES.values()
    account = f"your {provider} account" if known else f"your account with {provider}"
    return ModelError(
        f"{spec}: out of credit — add credit to {account}, then run again ({what})",
        status_code=status,
        reason="out_of_credit",
    )


def _is_context_overflow(
    profile: ProviderProfile, code: str | None, kind: str | None, text: str
) -> bool:
    if _any_in((code, kind), profile.context_overflow_codes):
        return True
    lowered = text.lower()
    # Escaped JSON text (OpenRouter's metadata.raw) holds the phrases too.
    return any(phrase in lowered for phrase in profile.context_overflow_phrases)


def _detail(parsed: Any, text: str) -> str:
    """The provider's message, then the whole body (bounded) when it says more."""
    if parsed is None:
        return _excerpt(text, ERROR_BODY_CHARS) or "(empty body)"
    message = provider_error_message(parsed, text)
    body = error_body_text(parsed, text)
    return message if body == message else f"{message}{_BODY_SEPARATOR}{body}"


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _word(value: Any) -> str | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, str | int):
        return str(value)
    return None


def _any_in(words: tuple[str | None, ...], known: frozenset[str]) -> bool:
    return any(word is not None and word in known for word in words)


def _excerpt(text: str, limit: int) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[:limit] + "…"


__all__ = [
    "ERROR_BODY_CHARS",
    "TRANSIENT_STATUS_CODES",
    "TransientFailure",
    "classify_error_object",
    "classify_http_failure",
    "error_body_text",
    "error_code_and_type",
    "provider_display_name",
    "provider_error_message",
    "retry_after_seconds",
]
