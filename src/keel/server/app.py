"""``create_app``: the FastAPI application ``keel serve`` runs.

Every route is behind ``keel.server.auth.require_token`` — put on each API router as
it is included here, so no route of those routers can skip it — except the console's
shell page ``/`` and its assets ``/static/*``, which hold no data. That includes
``/healthz``, ``/readyz``, ``/metrics``, ``/docs`` and ``/openapi.json``
(``tests/server/test_auth.py`` walks the routes to keep it so).

One ``ServerContext`` per application (``keel.server.context``): the store is opened
at startup, embedded worker slots start then, and at shutdown the slots finish their
current steps and release their leases before the store closes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool
from starlette.routing import BaseRoute, Mount, Route

from keel.server import (
    console,
    metrics,
    problems,
    routes_events,
    routes_runs,
    routes_tasks,
)
from keel.server.auth import require_token
from keel.server.config import ServeConfig
from keel.server.context import ServerContext, context_of

service_router = APIRouter(tags=["service"])


@service_router.get("/healthz")
def healthz() -> dict[str, bool]:
    """The process answers (and the caller's token is live)."""
    return {"ok": True}


@service_router.get("/readyz", responses={503: {"description": "the store is unreachable"}})
def readyz(request: Request) -> dict[str, str]:
    """The store answers a query; 503 problem (the store's error) when it does not."""
    context_of(request).store.list_tokens()
    return {"store": "ok"}


@service_router.get("/openapi.json", include_in_schema=False)
def openapi_document(request: Request) -> JSONResponse:
    """The OpenAPI description of this API."""
    document: dict[str, Any] = request.app.openapi()
    return JSONResponse(document)


@service_router.get("/docs", include_in_schema=False)
def api_docs() -> HTMLResponse:
    """Swagger UI over ``/openapi.json``."""
    return get_swagger_ui_html(openapi_url="/openapi.json", title="Keel API")


API_ROUTERS = (
    routes_runs.router,
    routes_tasks.router,
    routes_events.router,
    metrics.router,
    service_router,
)


def create_app(config: ServeConfig) -> FastAPI:
    """The application for ``config``; its store opens when the server starts."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        context = await run_in_threadpool(ServerContext, config)
        app.state.keel = context
        context.start_workers()
        try:
            yield
        finally:
            await run_in_threadpool(context.close)

    app = FastAPI(
        title="Keel",
        version=_keel_version(),
        summary="Durable, auditable, resumable runs of LLM agents, as a service.",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,  # served by service_router, behind the token
    )
    app.state.config = config
    problems.install(app)
    for router in API_ROUTERS:
        app.include_router(router, dependencies=[Depends(require_token)])
    if config.console:
        app.include_router(console.router)
    return app


OPEN_ROUTES = frozenset({("GET", "/"), ("GET", "/static/{name}")})  # the console's shell


def route_table(app: FastAPI) -> list[tuple[str, str]]:
    """Every ``(method, path)`` the application answers, included routers walked
    (what ``tests/server/test_auth.py`` checks the token on)."""
    table: list[tuple[str, str]] = []

    def walk(routes: Iterable[BaseRoute]) -> None:
        for route in routes:
            included = getattr(route, "original_router", None)  # FastAPI >= 0.16x
            if included is not None:
                walk(included.routes)
            elif isinstance(route, APIRoute | Route):
                table.extend((method, route.path) for method in sorted(route.methods or ()))
            elif isinstance(route, Mount):
                raise TypeError(f"mounted app at {route.path}: its routes escape the token check")

    walk(app.router.routes)
    return sorted(set(table))


def _keel_version() -> str:
    for name in ("keel-harness", "keel"):
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return "0"
