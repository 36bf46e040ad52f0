"""Errors as RFC 9457 problem documents (``application/problem+json``).

Every error the API returns is ``{type, title, status, detail}`` where ``detail`` is
the message the CLI prints for the same failure (``str(KeelError)``). ``type`` is
``urn:keel:<error-name>`` for a Keel error (e.g. ``urn:keel:run-not-found``) and
``about:blank`` for a plain HTTP one. The status of a Keel error:

- 404: NotFound (RunNotFound, TaskNotFound, an unknown artifact);
- 409: a move the current state does not allow or nothing waiting for it
  (NothingPending, InvalidTransition, InvalidTaskTransition, DependencyError,
  TaskNotClaimable, NotOwner, ConcurrentUpdate, LeaseHeld, LeaseLost);
- 422: any other UsageError (ConfigError…) and request validation;
- 503: any other StoreError (the store cannot serve the request);
- 500: anything else (detail says no more than that: internals stay in the log).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from keel.core.errors import (
    ConcurrentUpdate,
    DependencyError,
    InvalidTaskTransition,
    InvalidTransition,
    KeelError,
    LeaseHeld,
    LeaseLost,
    NotFound,
    NothingPending,
    NotOwner,
    StoreError,
    TaskNotClaimable,
    UsageError,
)

PROBLEM_MEDIA_TYPE = "application/problem+json"
log = logging.getLogger("keel.server")

# First match wins: subclasses before their bases.
STATUS_OF_ERROR: tuple[tuple[type[KeelError], int], ...] = (
    (NotFound, 404),
    (NothingPending, 409),
    (InvalidTransition, 409),
    (InvalidTaskTransition, 409),
    (DependencyError, 409),
    (TaskNotClaimable, 409),
    (NotOwner, 409),
    (ConcurrentUpdate, 409),
    (LeaseHeld, 409),
    (LeaseLost, 409),
    (UsageError, 422),
    (StoreError, 503),
)


class ProblemResponse(JSONResponse):
    media_type = PROBLEM_MEDIA_TYPE


class ApiProblem(Exception):
    """An error a route raises that no ``KeelError`` names (a changed digest, a reused
    idempotency key): answered as a problem with this status and detail."""

    def __init__(self, status: int, detail: str, *, type_: str = "about:blank") -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.type = type_


def problem(
    status: int,
    detail: str,
    *,
    type_: str = "about:blank",
    title: str | None = None,
    headers: Mapping[str, str] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> ProblemResponse:
    """A ``status`` problem response saying ``detail``."""
    body: dict[str, Any] = {
        "type": type_,
        "title": title or _title(status),
        "status": status,
        "detail": detail,
    }
    if extra:
        body.update(extra)
    return ProblemResponse(body, status_code=status, headers=dict(headers or {}))


def status_of(exc: KeelError) -> int:
    """The HTTP status a Keel error is answered with (see the module docstring)."""
    for kind, status in STATUS_OF_ERROR:
        if isinstance(exc, kind):
            return status
    return 500


def error_type(exc: BaseException) -> str:
    """``urn:keel:run-not-found`` for ``RunNotFound``."""
    words = re.sub(r"(?<!^)(?=[A-Z])", "-", type(exc).__name__).lower()
    return f"urn:keel:{words}"


def keel_problem(exc: KeelError) -> ProblemResponse:
    status = status_of(exc)
    if status == 500:
        log.error("unexpected Keel error: %s", exc, exc_info=exc)
        return problem(500, "internal error: the server could not handle this request")
    return problem(status, str(exc), type_=error_type(exc))


def install(app: FastAPI) -> None:
    """Answer every error raised while handling a request as a problem document."""

    async def on_keel_error(_request: Request, exc: Exception) -> ProblemResponse:
        assert isinstance(exc, KeelError)
        return keel_problem(exc)

    async def on_api_problem(_request: Request, exc: Exception) -> ProblemResponse:
        assert isinstance(exc, ApiProblem)
        return problem(exc.status, exc.detail, type_=exc.type)

    async def on_http_error(_request: Request, exc: Exception) -> ProblemResponse:
        assert isinstance(exc, StarletteHTTPException)
        detail = exc.detail if isinstance(exc.detail, str) else _title(exc.status_code)
        return problem(exc.status_code, detail, headers=exc.headers)

    async def on_invalid_request(request: Request, exc: Exception) -> ProblemResponse:
        assert isinstance(exc, RequestValidationError)
        # FastAPI reads a body before it checks the token: say 401 to a caller without
        # one rather than describe the request's shape to it.
        from keel.server.auth import refusal_for  # noqa: PLC0415 - auth imports this module

        refused = await refusal_for(request)
        if refused is not None:
            return refused
        errors = [_field_error(error) for error in exc.errors()]
        detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors) or "invalid request"
        return problem(422, detail, type_="urn:keel:invalid-request", extra={"errors": errors})

    async def on_unexpected(_request: Request, exc: Exception) -> ProblemResponse:
        log.error("unexpected error: %s", exc, exc_info=exc)
        return problem(500, "internal error: the server could not handle this request")

    app.add_exception_handler(KeelError, on_keel_error)
    app.add_exception_handler(ApiProblem, on_api_problem)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(RequestValidationError, on_invalid_request)
    app.add_exception_handler(Exception, on_unexpected)


def _field_error(error: Mapping[str, Any]) -> dict[str, str]:
    location = [str(part) for part in error.get("loc", ()) if part != "body"]
    return {
        "field": ".".join(location) or "body",
        "message": str(error.get("msg", "invalid")),
        "kind": str(error.get("type", "")),
    }


def _title(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"
