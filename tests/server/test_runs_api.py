"""``/runs`` over a real uvicorn: submit, list, read, decide, steer, download.

Runs are executed by the server's embedded worker slots where a test needs one; the
model's turns are scripted (``scripted:`` files), everything else is real.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from live_server import LiveServer, ServerFactory

from keel.core.errors import NothingPending, RunNotFound
from keel.core.events import EventType
from keel.core.state import transition
from keel.core.status import RunStatus
from keel.store.base import iter_all_events
from keel.testing.cli import DONE, call, run_command_call, turn

Poll = Callable[..., Any]


def script(server: LiveServer, *turns: dict[str, Any]) -> str:
    path = server.workspace / f"model-{len(list(server.workspace.iterdir()))}.json"
    path.write_text(json.dumps(list(turns)), encoding="utf-8")
    return f"scripted:{path}"


def submit(server: LiveServer, **fields: Any) -> dict[str, Any]:
    body = {"goal": "do it", "workspace": str(server.workspace), "model": "openai:m", **fields}
    response = server.client.post("/runs", json=body)
    assert response.status_code == 201, response.text
    view: dict[str, Any] = response.json()
    return view


def problem_of(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    assert body["status"] == status and body["title"] and body["type"]
    return body


def run_status(server: LiveServer, run_id: str) -> str:
    status: str = server.client.get(f"/runs/{run_id}").json()["status"]
    return status


def events_of(server: LiveServer, run_id: str, kind: EventType) -> list[dict[str, Any]]:
    return [e.data for e in iter_all_events(server.store, run_id) if e.type is kind]


# --- submitting -----------------------------------------------------------------------


def test_a_submitted_run_is_queued_attributed_to_the_token_and_readable(
    server: LiveServer,
) -> None:
    view = submit(
        server,
        goal="tidy the README",
        mode="ask",
        budget={"max_steps": 7, "max_cost": 0.5},
        verify=["true"],
        model="openai:gpt-4o-mini",
    )
    assert view["status"] == "queued" and view["creator"] == "token:tester"
    assert view["mode"] == "ask" and view["verify"] == ["true"]
    assert view["budget"]["max_steps"] == 7 and view["budget"]["max_tool_calls"] == 200
    assert view["pending"] is None and view["last_seq"] == 1
    assert server.client.get(f"/runs/{view['id']}").json() == view
    stored = server.store.load_run(view["id"])
    assert stored.status is RunStatus.QUEUED and stored.options.creator == "token:tester"
    assert stored.workspace == str(server.workspace.resolve())


def test_twenty_concurrent_posts_with_one_key_make_one_run(server: LiveServer) -> None:
    body = {"goal": "exactly once", "workspace": str(server.workspace), "model": "openai:m"}
    start = threading.Barrier(20)

    def post(_: int) -> httpx.Response:
        with httpx.Client(base_url=server.url, headers=server.headers, timeout=30) as client:
            start.wait()
            return client.post("/runs", json=body, headers={"Idempotency-Key": "order-17"})

    with ThreadPoolExecutor(20) as pool:
        responses = list(pool.map(post, range(20)))

    assert {r.json()["id"] for r in responses} == {responses[0].json()["id"]}
    assert sorted(r.status_code for r in responses) == [200] * 19 + [201]
    runs, _ = server.store.page_runs(limit=50)
    assert len(runs) == 1


def test_a_key_reused_for_another_goal_or_workspace_is_refused(
    server: LiveServer, tmp_path: Path
) -> None:
    key = {"Idempotency-Key": "k-1"}
    body = {"goal": "first", "workspace": str(server.workspace), "model": "openai:m"}
    first = server.client.post("/runs", json=body, headers=key).json()

    for change in ({"goal": "second"}, {"workspace": str(tmp_path)}):
        refused = server.client.post("/runs", json={**body, **change}, headers=key)
        detail = problem_of(refused, 409)["detail"]
        assert "k-1" in detail and first["id"] in detail and "different goal" in detail

    again = server.client.post("/runs", json=body, headers=key)
    assert again.status_code == 200 and again.json()["id"] == first["id"]
    assert len(server.store.page_runs()[0]) == 1


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"workspace": "/no/such/dir"}, None, "not an existing directory"),
        ({"workspace": "relative/dir"}, None, "not an absolute path"),
        ({"goal": ""}, "goal", "at least 1 character"),
        ({"goal": "   "}, None, "the task is empty"),
        ({"goal": "fix\u0000it"}, None, "contains a NUL character"),
        ({"mode": "yolo"}, "mode", "'plan', 'ask', 'edit' or 'auto'"),
        ({"budget": {"max_steps": 0}}, "budget.max_steps", "greater than 0"),
        ({"budget": {"max_cost": -1}}, "budget.max_cost", "greater than 0"),
        ({"budget": {"timeout_s": "soon"}}, "budget.timeout_s", "valid number"),
        ({"model": "gpt-4"}, None, "malformed model spec"),
        ({"model": "acme:large"}, None, "unknown model provider 'acme' in 'acme:large'"),
        ({"model": "scripted:missing.json"}, None, "no file"),
        ({"verify": [""]}, "verify.0", "at least 1 character"),
        ({"colour": "blue"}, "colour", "Extra inputs"),
        ({"agent": "nobody"}, None, "no agent named 'nobody'"),
        ({"tools": ["read_file", "nope"]}, None, "unknown tool 'nope'"),
        ({"tools": []}, None, "allowlist is empty"),
        ({"tools": [""]}, "tools.0", "at least 1 character"),
        ({"agent": "../reviewer"}, None, "is not allowed"),
    ],
)
def test_an_invalid_submission_is_422_naming_the_problem_and_stores_nothing(
    server: LiveServer, change: dict[str, Any], field: str | None, words: str
) -> None:
    body = {"goal": "g", "workspace": str(server.workspace), "model": "openai:m", **change}
    problem = problem_of(server.client.post("/runs", json=body), 422)
    assert words in problem["detail"]
    if field is not None:
        assert field in [error["field"] for error in problem["errors"]]
    assert server.store.page_runs()[0] == []


def test_a_run_may_follow_an_agent_spec_and_a_repeat_of_its_key_is_the_same_run(
    server: LiveServer,
) -> None:
    headers = {"Idempotency-Key": "review-1"}
    body = {"goal": "review the diff", "workspace": str(server.workspace), "model": "openai:m"}
    first = server.client.post("/runs", json={**body, "agent": "reviewer"}, headers=headers)
    assert first.status_code == 201, first.text
    view = first.json()
    assert view["agent"] == "reviewer" and view["mode"] == "plan"  # the spec's, narrower
    assert view["budget"]["max_steps"] == 30  # the spec's budget: none was given
    assert view["goal"].startswith("You are a reviewer.")  # the spec's instructions
    assert "review the diff" in view["goal"]
    state = server.store.load_run(view["id"])
    assert state.options.tools is not None and "write_file" not in state.options.tools
    assert state.options.output_schema is not None

    again = server.client.post("/runs", json={**body, "agent": "reviewer"}, headers=headers)
    assert again.status_code == 200 and again.json()["id"] == view["id"]
    other = server.client.post("/runs", json={**body, "agent": "explorer"}, headers=headers)
    assert problem_of(other, 409)["type"] == "urn:keel:idempotency-key-reused"
    plain = server.client.post("/runs", json=body, headers=headers)
    assert problem_of(plain, 409)["type"] == "urn:keel:idempotency-key-reused"
    assert len(server.store.page_runs()[0]) == 1


def test_with_workspace_roots_a_run_works_only_at_or_below_one(
    start_server: ServerFactory, tmp_path: Path
) -> None:
    root = tmp_path / "repos"
    (root / "payments").mkdir(parents=True)
    (root / "escape").symlink_to(tmp_path)  # inside the root by name, outside by target
    server = start_server(workspace_roots=(root,))
    inside = submit(server, workspace=str(root / "payments"))
    assert inside["workspace"] == str((root / "payments").resolve())
    for outside in (server.workspace, root / "escape", root / "payments" / ".." / ".."):
        body = {"goal": "g", "workspace": str(outside), "model": "openai:m"}
        refused = problem_of(server.client.post("/runs", json=body), 422)
        assert "outside the directories this server lets runs work in" in refused["detail"]
    assert [run.run_id for run in server.store.page_runs()[0]] == [inside["id"]]


def test_a_submitted_tool_allowlist_is_the_runs(server: LiveServer) -> None:
    view = submit(server, tools=["grep", "read_file"])
    assert view["tools"] == ["read_file", "grep", "request_completion"]
    assert server.store.load_run(view["id"]).options.tools == tuple(view["tools"])
    assert submit(server)["tools"] is None  # every tool


def test_a_script_path_is_read_from_the_workspace(server: LiveServer) -> None:
    (server.workspace / "turns.json").write_text(json.dumps([DONE]))
    view = submit(server, model="scripted:turns.json")
    assert view["model"] == f"scripted:{server.workspace.resolve() / 'turns.json'}"


# --- listing and reading --------------------------------------------------------------


def test_runs_page_newest_first_with_a_cursor_and_filters(server: LiveServer) -> None:
    other = server.add_token("nightly")
    ids = [submit(server, goal=f"run {i}")["id"] for i in range(5)]
    theirs = server.anon.post(
        "/runs",
        json={"goal": "theirs", "workspace": str(server.workspace), "model": "openai:m"},
        headers={"Authorization": f"Bearer {other}"},
    ).json()["id"]
    child = server.store.create_run(
        goal="child",
        workspace=str(server.workspace),
        options=server.store.load_run(ids[0]).options,
        parent_id=ids[0],
    )

    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 2, "top_level": True, "creator": "token:tester"}
        if cursor:
            params["cursor"] = cursor
        page = server.client.get("/runs", params=params).json()
        assert len(page["runs"]) <= 2
        seen += [run["id"] for run in page["runs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == list(reversed(ids))

    mine = server.client.get("/runs", params={"creator": "token:nightly"}).json()["runs"]
    assert [run["id"] for run in mine] == [theirs]
    kids = server.client.get("/runs", params={"parent": ids[0]}).json()["runs"]
    assert [run["id"] for run in kids] == [child.run_id]
    assert server.client.get("/runs", params={"status": "running"}).json()["runs"][0]["id"] == (
        child.run_id
    )
    tree = server.client.get(f"/runs/{ids[0]}/tree").json()
    assert [node["id"] for node in tree["children"]] == [child.run_id]

    assert (
        "invalid cursor"
        in problem_of(server.client.get("/runs", params={"cursor": "garbage"}), 422)["detail"]
    )
    problem_of(server.client.get("/runs", params={"status": "sleeping"}), 422)
    problem_of(server.client.get("/runs", params={"limit": 0}), 422)
    problem_of(server.client.get("/runs", params={"limit": 201}), 422)


def test_an_unknown_run_is_404_in_the_words_of_the_cli(server: LiveServer) -> None:
    for path in ("/runs/run_nope", "/runs/run_nope/tree", "/runs/run_nope/artifacts/art_x"):
        problem = problem_of(server.client.get(path), 404)
        assert problem["detail"] == str(RunNotFound("run_nope"))
        assert problem["type"] == "urn:keel:run-not-found"
    for verb, body in (("approve", {}), ("answer", {"text": "x"}), ("cancel", {"reason": "x"})):
        problem_of(server.client.post(f"/runs/run_nope/{verb}", json=body), 404)


# --- deciding -------------------------------------------------------------------------


def test_approval_through_the_api_checks_the_digest_and_unblocks_the_run(
    start_server: ServerFactory, poll_until: Poll
) -> None:
    server = start_server(workers=1)
    model = script(server, turn(run_command_call("sh", "-c", "echo ran >> log.txt")), DONE)
    run_id = submit(server, model=model, goal="log it")["id"]

    waiting = poll_until(
        lambda: (v := server.client.get(f"/runs/{run_id}").json())["status"] == "waiting" and v
    )
    pending = waiting["pending"]
    assert pending["kind"] == "approval" and pending["tool"] == "run_command"
    assert pending["preview"]["command"] == "sh -c 'echo ran >> log.txt'"
    assert not (server.workspace / "log.txt").exists()

    changed = server.client.post(f"/runs/{run_id}/approve", json={"digest": "sha256:other"})
    detail = problem_of(changed, 409)["detail"]
    assert detail.startswith("the pending call changed") and pending["digest"] in detail
    assert run_status(server, run_id) == "waiting"  # nothing was decided

    approved = server.client.post(f"/runs/{run_id}/approve", json={"digest": pending["digest"]})
    assert approved.status_code == 200, approved.text
    poll_until(lambda: run_status(server, run_id) == "completed")
    assert (server.workspace / "log.txt").read_text() == "ran\n"
    [granted] = events_of(server, run_id, EventType.APPROVAL_GRANTED)
    assert granted["by"] == "token:tester" and granted["digest"] == pending["digest"]

    again = server.client.post(f"/runs/{run_id}/approve", json={})
    assert problem_of(again, 409)["type"] == "urn:keel:nothing-pending"


def test_deny_and_answer_through_the_api_are_recorded_with_the_token_name(
    start_server: ServerFactory, poll_until: Poll
) -> None:
    server = start_server(workers=1)
    model = script(
        server,
        turn(run_command_call("sh", "-c", "echo no >> log.txt")),
        turn(call("ask_user", question="which colour?")),
        DONE,
    )
    run_id = submit(server, model=model)["id"]
    poll_until(lambda: run_status(server, run_id) == "waiting")

    problem_of(server.client.post(f"/runs/{run_id}/deny", json={}), 422)
    problem_of(server.client.post(f"/runs/{run_id}/deny", json={"reason": ""}), 422)
    denied = server.client.post(f"/runs/{run_id}/deny", json={"reason": "not on prod"})
    assert denied.status_code == 200, denied.text

    asked = poll_until(
        lambda: (
            (v := server.client.get(f"/runs/{run_id}").json())["pending"]
            and v["pending"]["kind"] == "question"
            and v
        )
    )
    assert asked["pending"]["question"] == "which colour?"
    wrong = server.client.post(f"/runs/{run_id}/approve", json={})
    assert problem_of(wrong, 409)["detail"].startswith(f"run {run_id} is not waiting for")
    answered = server.client.post(f"/runs/{run_id}/answer", json={"text": "blue"})
    assert answered.status_code == 200, answered.text
    poll_until(lambda: run_status(server, run_id) == "completed")

    assert not (server.workspace / "log.txt").exists()
    [refusal] = events_of(server, run_id, EventType.APPROVAL_DENIED)
    assert refusal["by"] == "token:tester" and refusal["reason"] == "not on prod"
    [answer] = events_of(server, run_id, EventType.INPUT_RECEIVED)
    assert answer["by"] == "token:tester" and answer["answer"] == "blue"


def test_nothing_pending_is_409_in_the_words_of_the_cli(server: LiveServer) -> None:
    run_id = submit(server)["id"]
    refused = server.client.post(f"/runs/{run_id}/approve", json={})
    assert problem_of(refused, 409)["detail"] == str(
        NothingPending(run_id, "an approval (it is queued)")
    )
    problem_of(server.client.post(f"/runs/{run_id}/answer", json={"text": "x"}), 409)
    problem_of(server.client.post(f"/runs/{run_id}/resume", json={}), 409)
    assert run_status(server, run_id) == "queued"


def test_cancel_through_the_api_records_who_and_cannot_be_repeated(server: LiveServer) -> None:
    run_id = submit(server)["id"]
    cancelled = server.client.post(f"/runs/{run_id}/cancel", json={"reason": "wrong repo"})
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "cancelled"
    assert "wrong repo" in (cancelled.json()["reason"] or "")
    problem_of(server.client.post(f"/runs/{run_id}/cancel", json={"reason": "again"}), 409)
    problem_of(server.client.post(f"/runs/{run_id}/cancel", json={}), 422)
    changes = events_of(server, run_id, EventType.STATUS_CHANGED)
    assert changes[-1]["to"] == "cancelled"
    assert changes[-1]["by"] == "token:tester"


# --- pause, resume, messages ---------------------------------------------------------


def test_pause_and_resume_through_the_api(server: LiveServer) -> None:
    run_id = submit(server)["id"]
    problem_of(server.client.post(f"/runs/{run_id}/pause", json={}), 409)  # queued
    state = server.store.load_run(run_id)
    server.store.append_events(  # a running run no process holds (its worker died)
        run_id, [transition(state, RunStatus.RUNNING, None)], expected_seq=state.last_seq
    )

    paused = server.client.post(f"/runs/{run_id}/pause", json={"reason": "lunch"})
    assert paused.status_code == 200, paused.text
    assert paused.json()["status"] == "paused"
    [asked] = events_of(server, run_id, EventType.PAUSE_REQUESTED)
    assert asked["by"] == "token:tester" and asked["reason"] == "lunch"
    problem_of(server.client.post(f"/runs/{run_id}/pause", json={}), 409)

    resumed = server.client.post(f"/runs/{run_id}/resume", json={})
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["status"] == "running"
    problem_of(server.client.post(f"/runs/{run_id}/resume", json={"extra": 1}), 422)


def test_a_message_reaches_a_live_run_and_a_finished_one_gets_a_follow_up(
    server: LiveServer,
) -> None:
    live = submit(server)["id"]
    told = server.client.post(f"/runs/{live}/messages", json={"text": "also update docs"})
    assert told.status_code == 201, told.text
    assert told.json()["follow_up"] is None and told.json()["run"]["id"] == live
    [message] = events_of(server, live, EventType.MESSAGE_RECEIVED)
    assert message == {"text": "also update docs", "by": "token:tester"}

    server.client.post(f"/runs/{live}/cancel", json={"reason": "done with it"})
    again = server.client.post(f"/runs/{live}/messages", json={"text": "one more thing"})
    assert again.status_code == 201, again.text
    follow_up = again.json()["follow_up"]
    assert follow_up["status"] == "queued" and follow_up["follows"] == live
    [created] = events_of(server, live, EventType.FOLLOW_UP_CREATED)
    assert created == {"run_id": follow_up["id"], "by": "token:tester"}
    problem_of(server.client.post(f"/runs/{live}/messages", json={"text": ""}), 422)


# --- artifacts ------------------------------------------------------------------------


def test_an_artifact_downloads_only_under_its_own_run(server: LiveServer) -> None:
    first, second = submit(server)["id"], submit(server)["id"]
    binary = server.store.put_artifact(first, "dump.bin", b"\x00\x01binary")
    patch = server.store.put_artifact(first, "../patch-x.diff", b"--- a\n+++ b\n")

    got = server.client.get(f"/runs/{first}/artifacts/{binary.id}")
    assert got.status_code == 200 and got.content == b"\x00\x01binary"
    assert got.headers["content-type"] == "application/octet-stream"
    assert got.headers["content-disposition"].startswith('attachment; filename="dump.bin"')
    text = server.client.get(f"/runs/{first}/artifacts/{patch.id}")
    assert text.headers["content-type"] == "text/plain; charset=utf-8"
    assert 'filename="patch-x.diff"' in text.headers["content-disposition"]

    elsewhere = server.client.get(f"/runs/{second}/artifacts/{binary.id}")
    assert binary.id in problem_of(elsewhere, 404)["detail"]
    problem_of(server.client.get(f"/runs/{first}/artifacts/art_nothing"), 404)


# --- service routes -------------------------------------------------------------------


def test_health_and_readiness_answer_with_a_token(server: LiveServer) -> None:
    assert server.client.get("/healthz").json() == {"ok": True}
    assert server.client.get("/readyz").json() == {"store": "ok"}


@pytest.mark.postgres
def test_readiness_is_503_once_the_store_is_gone(
    start_server: ServerFactory, postgres_url: str
) -> None:
    import psycopg  # noqa: PLC0415 - the postgres extra

    server = start_server(postgres_url)
    assert server.client.get("/readyz").json() == {"store": "ok"}
    server.store.close()
    name = postgres_url.rpartition("/")[2]
    with psycopg.connect(os.environ["KEEL_TEST_POSTGRES_URL"], autocommit=True) as conn:
        conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')

    problem = problem_of(server.client.get("/readyz"), 503)
    assert problem["type"] == "urn:keel:store-error" and name in problem["detail"]
