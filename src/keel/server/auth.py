"""Bearer-token authentication for every API route.

A request proves itself with ``Authorization: Bearer keel_…``. The token's SHA-256 is
looked up in the store at every request (no cache: a revoked token is refused from
the next request on); only live tokens match. Missing, malformed, unknown and revoked
tokens all get the same 401 problem with ``WWW-Authenticate: Bearer`` — a caller
learns nothing about which tokens exist.

Timing: the presented token is never compared with a stored secret character by
character. It is hashed first and the store finds the row by that SHA-256, which a
caller cannot steer byte by byte: how long a lookup takes tells nothing about how
close a guess was. (The store keeps no token, so there is nothing to compare it with.)

``require_token`` is the FastAPI dependency; ``keel.server.app`` puts it on every
router but the console's, so a route added to one of those routers cannot skip it.
A route that needs to know who called declares ``caller: Caller = Depends(require_token)``
(FastAPI computes a dependency once per request).
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request
from starlette.exceptions import HTTPException as StarletteHTTPException

from keel.runtime.api_tokens import hash_token, well_formed
from keel.server.context import context_of
from keel.server.problems import ProblemResponse, problem
from keel.store.base import Store

MISSING = (
    "this API needs a bearer token: send `Authorization: Bearer TOKEN` "
    "(create one with `keel token create NAME`)"
)
INVALID = "the bearer token is not valid: it is unknown or was revoked"
CHALLENGE = 'Bearer realm="keel"'
INVALID_CHALLENGE = 'Bearer realm="keel", error="invalid_token"'


@dataclass(frozen=True, slots=True)
class Caller:
    """Who made a request: the name of the token it carried."""

    name: str

    @property
    def by(self) -> str:
        """How decisions taken by this caller are recorded: ``token:NAME``."""
        return f"token:{self.name}"


class Unauthorized(StarletteHTTPException):
    def __init__(self, detail: str, challenge: str) -> None:
        super().__init__(401, detail, headers={"WWW-Authenticate": challenge})


def presented_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer TOKEN`` header, None without one."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def authenticate(store: Store, authorization: str | None) -> Caller:
    """The caller a header names; ``Unauthorized`` when it names none that is live."""
    token = presented_token(authorization)
    if token is None:
        raise Unauthorized(MISSING, CHALLENGE)
    if not well_formed(token):
        raise Unauthorized(INVALID, INVALID_CHALLENGE)
    found = store.token_by_hash(hash_token(token))
    if found is None:
        raise Unauthorized(INVALID, INVALID_CHALLENGE)
    return Caller(found.name)


async def require_token(request: Request) -> Caller:
    """FastAPI dependency: the request's ``Caller`` or a 401 problem (one store lookup,
    made as ``ServerContext.read`` makes reads)."""
    cached: Caller | None = request.scope.get("keel.caller")
    if cached is not None:
        return cached
    context = context_of(request)
    caller = await context.read(authenticate, context.store, request.headers.get("authorization"))
    request.scope["keel.caller"] = caller
    return caller


async def refusal_for(request: Request) -> ProblemResponse | None:
    """The 401 problem a request would get, or None if its token is live (for error
    paths reached before the dependency ran)."""
    try:
        await require_token(request)
    except Unauthorized as exc:
        return problem(401, str(exc.detail), headers=exc.headers)
    return None
