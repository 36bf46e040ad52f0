"""``/tasks`` over a real uvicorn: create with dependencies, list, and the graph."""

from __future__ import annotations

from typing import Any

import httpx
from live_server import LiveServer


def created(server: LiveServer, subject: str, **fields: Any) -> dict[str, Any]:
    response = server.client.post("/tasks", json={"subject": subject, **fields})
    assert response.status_code == 201, response.text
    task: dict[str, Any] = response.json()
    return task


def problem_of(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    return body


def test_tasks_are_created_listed_and_drawn_as_a_graph(server: LiveServer) -> None:
    design = created(server, "design", description="sketch it")
    build = created(server, "build", blocked_by=[design["id"]])
    ship = created(server, "ship", blocked_by=[design["id"], build["id"]])
    assert design["status"] == "pending" and design["ready"] and "lease_token" not in design
    assert build["blocked_by"] == [design["id"]] and not build["ready"]
    history = server.store.task_events(design["id"])
    assert history[0].actor == "token:tester"

    listed = server.client.get("/tasks").json()["tasks"]
    assert [t["id"] for t in listed] == [design["id"], build["id"], ship["id"]]
    ready = server.client.get("/tasks", params={"ready": True}).json()["tasks"]
    assert [t["id"] for t in ready] == [design["id"]]
    assert server.client.get("/tasks", params={"status": "completed"}).json()["tasks"] == []

    graph = server.client.get("/tasks/graph").json()
    assert {n["id"]: n["status"] for n in graph["nodes"]} == {
        design["id"]: "pending",
        build["id"]: "pending",
        ship["id"]: "pending",
    }
    assert sorted((e["from"], e["to"]) for e in graph["edges"]) == sorted(
        [(design["id"], build["id"]), (design["id"], ship["id"]), (build["id"], ship["id"])]
    )


def test_a_claimed_task_shows_its_owner_in_the_graph(server: LiveServer) -> None:
    task = created(server, "work")
    server.store.claim_task(owner="worker-7", lease_seconds=60, task_id=task["id"])
    [node] = server.client.get("/tasks/graph").json()["nodes"]
    assert node["status"] == "in_progress" and node["owner"] == "worker-7"
    [listed] = server.client.get("/tasks").json()["tasks"]
    assert "lease_token" not in listed  # the holder's fencing token is not for readers


def test_bad_tasks_are_refused_with_nothing_created(server: LiveServer) -> None:
    missing = server.client.post("/tasks", json={"subject": "x", "blocked_by": ["task_nope"]})
    assert "task_nope" in problem_of(missing, 409)["detail"]  # a DependencyError
    problem_of(server.client.post("/tasks", json={"subject": ""}), 422)
    nul = problem_of(server.client.post("/tasks", json={"subject": "a\u0000b"}), 422)
    assert "NUL character" in nul["detail"]
    problem_of(server.client.post("/tasks", json={"subject": "x", "owner": "me"}), 422)
    problem_of(server.client.post("/tasks", json={"blocked_by": []}), 422)
    problem_of(server.client.get("/tasks", params={"status": "someday"}), 422)
    assert server.client.get("/tasks").json()["tasks"] == []


def test_a_repeated_idempotency_key_makes_one_task(server: LiveServer) -> None:
    key = {"Idempotency-Key": "import-42"}
    first = server.client.post("/tasks", json={"subject": "import"}, headers=key)
    second = server.client.post("/tasks", json={"subject": "import"}, headers=key)
    assert first.json()["id"] == second.json()["id"]
    assert len(server.client.get("/tasks").json()["tasks"]) == 1
