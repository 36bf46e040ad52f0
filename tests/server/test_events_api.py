"""``GET /runs/{id}/events``: a page of a run's log after a sequence number (real uvicorn)."""

from __future__ import annotations

from typing import Any

from keel.core.events import EventType, NewEvent
from keel.core.records import RunOptions
from keel.store.base import iter_all_events

EVENTS = "/runs/{}/events"


def make_run_with_notes(server: Any, notes: int) -> str:
    store = server.store
    run_id: str = store.create_run(
        goal="g", workspace=str(server.workspace), options=RunOptions()
    ).run_id
    for n in range(notes):
        store.append_events(
            run_id,
            [NewEvent(type=EventType.NOTE_ADDED, data={"text": f"note {n}", "n": n})],
            expected_seq=n + 1,
        )
    return run_id


def test_pages_follow_each_other_and_match_the_log(server: Any) -> None:
    run_id = make_run_with_notes(server, 11)  # 12 events
    stored = [e.to_dict() for e in iter_all_events(server.store, run_id)]

    pages: list[dict[str, Any]] = []
    after = 0
    while True:
        page = server.client.get(EVENTS.format(run_id), params={"after": after, "limit": 5})
        assert page.status_code == 200, page.text
        body = page.json()
        assert body["last_seq"] == 12
        if not body["events"]:
            break
        pages.extend(body["events"])
        after = body["events"][-1]["seq"]

    assert [e["seq"] for e in pages] == list(range(1, 13))
    for got, want in zip(pages, stored, strict=True):
        assert got == {
            k: want[k] for k in ("run_id", "seq", "event_id", "type", "recorded_at", "data")
        }
    assert pages[3]["type"] == "note_added" and pages[3]["data"] == {"text": "note 2", "n": 2}


def test_default_page_is_everything_after(server: Any) -> None:
    run_id = make_run_with_notes(server, 3)
    body = server.client.get(EVENTS.format(run_id), params={"after": 2}).json()
    assert [e["seq"] for e in body["events"]] == [3, 4]
    assert server.client.get(EVENTS.format(run_id), params={"after": 4}).json() == {
        "events": [],
        "last_seq": 4,
    }


def test_unknown_run_is_a_404_problem(server: Any) -> None:
    response = server.client.get(EVENTS.format("run_missing"))
    assert response.status_code == 404
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["status"] == 404 and "run_missing" in problem["detail"]


def test_bad_after_and_limit_are_422_problems(server: Any) -> None:
    run_id = make_run_with_notes(server, 1)
    for params in ({"after": -1}, {"after": "x"}, {"limit": 0}, {"limit": 1001}):
        response = server.client.get(EVENTS.format(run_id), params=params)
        assert response.status_code == 422, params
        assert response.headers["content-type"] == "application/problem+json"
    assert (
        len(server.client.get(EVENTS.format(run_id), params={"limit": 1000}).json()["events"]) == 2
    )


def test_a_missing_token_is_refused(server: Any) -> None:
    run_id = make_run_with_notes(server, 0)
    assert server.anon.get(EVENTS.format(run_id)).status_code == 401
