"""Every route but the console's shell refuses a request without a live token.

The routes are walked from the served application itself (and checked against the
OpenAPI document), so a route added later is covered without touching this file.
"""

from __future__ import annotations

import re

import httpx
import pytest
from live_server import LiveServer

from keel.runtime.api_tokens import make_token
from keel.server.app import OPEN_ROUTES, route_table

BODIES = {
    ("POST", "/runs"): {"goal": "g", "workspace": "/tmp"},
    ("POST", "/runs/{run_id}/deny"): {"reason": "no"},
    ("POST", "/runs/{run_id}/answer"): {"text": "yes"},
    ("POST", "/runs/{run_id}/cancel"): {"reason": "stop"},
    ("POST", "/runs/{run_id}/messages"): {"text": "hello"},
    ("POST", "/tasks"): {"subject": "s"},
}


def concrete(path: str) -> str:
    """``/runs/{run_id}`` -> ``/runs/run_000000000000``: any value reaches the route."""
    return re.sub(r"\{[^}]+\}", "run_000000000000", path)


def guarded_routes(server: LiveServer) -> list[tuple[str, str]]:
    return [route for route in route_table(server.app) if route not in OPEN_ROUTES]


def send(server: LiveServer, method: str, path: str, headers: dict[str, str]) -> httpx.Response:
    body = BODIES.get((method, path), {}) if method == "POST" else None
    return server.anon.request(method, concrete(path), json=body, headers=headers, timeout=10)


def assert_refused(response: httpx.Response, where: str) -> None:
    assert response.status_code == 401, f"{where}: {response.status_code} {response.text}"
    assert response.headers["content-type"] == "application/problem+json", where
    assert response.headers["www-authenticate"].startswith("Bearer"), where
    problem = response.json()
    assert problem["status"] == 401 and problem["title"] == "Unauthorized", where
    assert "run_000000000000" not in response.text, where  # nothing about the resource


def test_the_walk_covers_every_route_openapi_lists_and_the_docs(server: LiveServer) -> None:
    walked = {path for _method, path in route_table(server.app)}
    listed = set(server.client.get("/openapi.json").json()["paths"])
    assert listed <= walked
    assert {"/docs", "/openapi.json", "/healthz", "/readyz", "/metrics", "/runs"} <= walked
    assert set(OPEN_ROUTES) <= set(route_table(server.app))  # what stays open exists
    assert len(guarded_routes(server)) >= 20


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "",
        "Bearer",
        "Basic dXNlcjpwYXNz",
        "Bearer not-a-keel-token",
        "Bearer keel_" + "A" * 43,  # well formed, never issued
    ],
    ids=["missing", "empty", "no-token", "basic", "malformed", "unknown"],
)
def test_every_route_refuses_a_request_without_a_live_token(
    server: LiveServer, authorization: str | None
) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    for method, path in guarded_routes(server):
        assert_refused(send(server, method, path, headers), f"{method} {path}")


def test_a_revoked_token_is_refused_everywhere_from_the_next_request_on(
    server: LiveServer,
) -> None:
    token = server.add_token("ci-bot")
    headers = {"Authorization": f"Bearer {token}"}
    assert server.anon.get("/healthz", headers=headers).json() == {"ok": True}

    server.store.revoke_token("ci-bot")  # no cache: the very next request is refused

    for method, path in guarded_routes(server):
        assert_refused(send(server, method, path, headers), f"{method} {path}")
    assert server.client.get("/healthz").status_code == 200  # other tokens stay live


def test_a_token_of_another_store_or_a_changed_one_is_refused(server: LiveServer) -> None:
    changed = server.token[:-1] + ("A" if server.token[-1] != "A" else "B")
    for token in (make_token(), changed, server.token.upper(), server.token + "x"):
        response = server.anon.get("/runs", headers={"Authorization": f"Bearer {token}"})
        assert_refused(response, token)
    assert server.client.get("/runs").status_code == 200


def test_a_malformed_body_without_a_token_is_refused_not_described(server: LiveServer) -> None:
    response = server.anon.post(
        "/runs", content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert_refused(response, "POST /runs with a broken body")
    with_token = server.client.post(
        "/runs", content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert with_token.status_code == 422


def test_the_console_shell_is_the_only_thing_open(server: LiveServer) -> None:
    for method, path in OPEN_ROUTES:
        assert server.anon.request(method, concrete(path)).status_code != 401
    assert server.anon.get("/docs").status_code == 401
    assert server.client.get("/docs").status_code == 200
    assert "/openapi.json" in server.client.get("/docs").text


def test_the_scheme_word_is_case_insensitive_and_the_caller_is_named(server: LiveServer) -> None:
    response = server.anon.post(
        "/runs",
        json={"goal": "attributed", "workspace": str(server.workspace), "model": "openai:m"},
        headers={"Authorization": f"bearer {server.token}"},
    )
    assert response.status_code == 201, response.text
    assert response.json()["creator"] == "token:tester"
