"""``POST /runs`` with named verifiers, ``verify_human`` and ``outcome``, and
``POST /runs/{id}/signoff`` over a real uvicorn: the sign-off is recorded as the caller,
a wrong verifier or a decline without a reason is a problem and changes nothing."""

from __future__ import annotations

from typing import Any

import httpx
from live_server import LiveServer

from keel.core.events import EventType
from keel.core.status import RunStatus
from keel.models.scripted import ScriptedModel
from keel.runtime.harness import Harness

WRITE = {"name": "write_file", "arguments": {"path": "fix.txt", "content": "fixed\n"}}
DONE = {"tool_calls": [{"name": "request_completion", "arguments": {"summary": "done"}}]}


def problem_of(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    return body


def test_a_run_submitted_with_a_signoff_waits_and_a_signoff_over_the_api_finishes_it(
    server: LiveServer,
) -> None:
    body = {
        "goal": "fix it",
        "workspace": str(server.workspace),
        "model": "openai:m",
        "verify": ["unit=test -f fix.txt"],
        "verify_human": ["security"],
        "outcome": "change_ready_for_approval",
    }
    response = server.client.post("/runs", json=body)
    assert response.status_code == 201, response.text
    run_id = response.json()["id"]
    options = server.store.load_run(run_id).options
    assert options.signoffs == ("security",) and options.verifier_names == ("unit",)
    assert options.outcome == "change_ready_for_approval"

    with Harness(store=server.store_url, model=ScriptedModel([{"tool_calls": [WRITE]}, DONE])) as h:
        waiting = h.execute(run_id)
        assert waiting.status is RunStatus.WAITING

        wrong = server.client.post(f"/runs/{run_id}/signoff", json={"verifier": "legal"})
        assert "not 'legal'" in problem_of(wrong, 422)["detail"]
        blank = server.client.post(
            f"/runs/{run_id}/signoff", json={"verifier": "security", "deny": True}
        )
        assert "needs a reason" in problem_of(blank, 422)["detail"]
        assert h.get(run_id).status is RunStatus.WAITING  # nothing changed

        signed = server.client.post(f"/runs/{run_id}/signoff", json={"verifier": "security"})
        assert signed.status_code == 200, signed.text
        assert signed.json()["status"] == "verifying"
        done = h.execute(run_id)
    assert done.status is RunStatus.COMPLETED
    assert set(done.evidence_by_name) == {"unit", "security"}
    recorded = [e for e in server.store.read_events(run_id) if e.type is EventType.SIGNOFF_RECORDED]
    assert recorded[0].data["by"].startswith("token:")


def test_a_run_submitted_with_a_reviewer_agent_records_it_and_a_bad_one_is_a_problem(
    server: LiveServer,
) -> None:
    base = {"goal": "fix it", "workspace": str(server.workspace), "model": "openai:m"}
    response = server.client.post("/runs", json={**base, "verify_agent": ["review=reviewer"]})
    assert response.status_code == 201, response.text
    options = server.store.load_run(response.json()["id"]).options
    assert options.reviewers == (("review", "reviewer"),)

    before = len(server.store.list_runs())
    for given, says in [("review=nosuch", "nosuch"), ("review=explorer", "cannot review")]:
        refused = server.client.post("/runs", json={**base, "verify_agent": [given]})
        assert says in problem_of(refused, 422)["detail"]
    assert len(server.store.list_runs()) == before  # nothing stored for either
