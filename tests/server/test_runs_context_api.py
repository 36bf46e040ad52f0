"""``POST /runs`` with ``context_tokens`` and ``context_summary`` over a real uvicorn: the
run keeps them (and shows them); a size out of range or of the wrong type is a 422
problem naming the field, and nothing is stored."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from live_server import LiveServer


def problem_of(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    return body


def test_a_submitted_context_size_and_summary_are_the_runs(server: LiveServer) -> None:
    body = {
        "goal": "g",
        "workspace": str(server.workspace),
        "model": "openai:m",
        "context_tokens": 32_000,
        "context_summary": True,
    }
    response = server.client.post("/runs", json=body)
    assert response.status_code == 201, response.text
    view = response.json()
    assert view["context_tokens"] == 32_000 and view["context_summary"] is True
    options = server.store.load_run(view["id"]).options
    assert options.context_tokens == 32_000 and options.context_summary
    plain = {"goal": "g", "workspace": str(server.workspace), "model": "openai:m"}
    default = server.client.post("/runs", json=plain).json()
    assert default["context_tokens"] is None and default["context_summary"] is False


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (0, "greater than or equal to 1000"),
        (-5, "greater than or equal to 1000"),
        (999, "greater than or equal to 1000"),
        (10**12, "less than or equal to 100000000"),
        ("abc", "valid integer"),
        ("3000", "valid integer"),
        (3000.5, "valid integer"),
        (True, "valid integer"),
    ],
)
def test_a_bad_context_size_is_422_naming_the_field_and_stores_nothing(
    server: LiveServer, value: object, words: str
) -> None:
    body = {"goal": "g", "workspace": str(server.workspace), "context_tokens": value}
    problem = problem_of(server.client.post("/runs", json=body), 422)
    assert words in problem["detail"]
    assert "context_tokens" in [error["field"] for error in problem["errors"]]
    assert server.store.page_runs()[0] == []


def test_a_context_summary_that_is_not_a_boolean_is_422(server: LiveServer) -> None:
    body = {"goal": "g", "workspace": str(server.workspace), "context_summary": "yes"}
    problem = problem_of(server.client.post("/runs", json=body), 422)
    assert "context_summary" in [error["field"] for error in problem["errors"]]
