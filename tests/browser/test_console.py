"""The web console in a real headless Chromium against a real ``keel serve``.

Only the model's turns are scripted; the server, its SQLite store, its embedded
workers and the browser are real. Each page's screenshot is saved under
``test-results/console/`` (or ``$KEEL_TEST_ARTIFACTS/console``), at 1280x800 and at a
phone's 390x844. Every test also checks that the page asked nothing of any other
origin and set no cookie.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
if not CHROMIUM.exists():
    pytest.skip(
        f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium); "
        "the console is tested with the system browser, never a downloaded one",
        allow_module_level=True,
    )
pytest.importorskip(
    "playwright.sync_api", reason="the playwright package is missing (pip install -e '.[dev]')"
)
from playwright.sync_api import Browser, Page, expect, sync_playwright  # noqa: E402

KeelServer = Any  # tests/browser/conftest.py's KeelServer (a conftest is not importable)

DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
HOSTILE = '<img src=x onerror="window.__xss=1">'


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def turn(*calls: dict[str, Any]) -> dict[str, Any]:
    return {"tool_calls": list(calls)}


DONE = turn(call("request_completion", summary="done"))


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        chromium = p.chromium.launch(
            executable_path=str(CHROMIUM), args=["--no-sandbox"], headless=True
        )
        yield chromium
        chromium.close()


class Console:
    """One browser tab on the console, recording every URL it requests."""

    def __init__(
        self, browser: Browser, server: KeelServer, viewport: dict[str, int], screenshots: Path
    ) -> None:
        self.server = server
        self.screenshots = screenshots
        self.context = browser.new_context(viewport=viewport)  # type: ignore[arg-type]
        self.context.set_default_timeout(15_000)
        self.page: Page = self.context.new_page()
        self.requests: list[str] = []
        self.page.on("request", lambda request: self.requests.append(request.url))
        self.console_errors: list[str] = []
        self.page.on(
            "console",
            lambda msg: self.console_errors.append(msg.text) if msg.type == "error" else None,
        )
        self.page.on("pageerror", lambda exc: self.console_errors.append(str(exc)))

    def open(self, hash_route: str = "") -> Page:
        self.page.goto(f"{self.server.url}/{hash_route}")
        return self.page

    def sign_in(self, token: str | None = None) -> Page:
        page = self.open()
        page.get_by_label("API token").fill(token or self.server.token)
        page.get_by_role("button", name="Sign in").click()
        return page

    def shot(self, name: str) -> Path:
        path = self.screenshots / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def check_origin(self, expected_errors: tuple[str, ...] = ("status of 401",)) -> None:
        """Every request went to the server (or stayed in the page: data:, blob:), no
        cookie was set, and the page logged no error but ``expected_errors``."""
        outside = [
            url
            for url in self.requests
            if not url.startswith(self.server.url + "/")
            and url.split(":", 1)[0] not in ("data", "blob")
        ]
        assert outside == [], outside
        assert self.context.cookies() == []
        unexpected = [e for e in self.console_errors if not any(x in e for x in expected_errors)]
        assert unexpected == [], unexpected

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def console(browser: Browser, keel_server: KeelServer, screenshots: Path) -> Iterator[Console]:
    tab = Console(browser, keel_server, DESKTOP, screenshots)
    yield tab
    tab.close()


@pytest.fixture
def phone(browser: Browser, keel_server: KeelServer, screenshots: Path) -> Iterator[Console]:
    tab = Console(browser, keel_server, PHONE, screenshots)
    yield tab
    tab.close()


def test_a_wrong_token_is_refused_and_nothing_is_kept(console: Console) -> None:
    page = console.open()
    expect(page.get_by_role("heading", name="Sign in to Keel")).to_be_visible()
    console.shot("signin")

    console.sign_in("keel_" + "x" * 43)

    alert = page.get_by_role("alert")
    expect(alert).to_contain_text("That token was refused")
    assert page.evaluate("sessionStorage.length") == 0
    expect(page.get_by_role("navigation", name="Main")).to_be_hidden()
    console.shot("signin-wrong-token")
    console.check_origin()


def test_sign_in_lists_runs_and_sign_out_forgets_the_token(
    console: Console, keel_server: KeelServer
) -> None:
    run_id = keel_server.submit("say hello", "hello", [{"content": "hello"}])
    keel_server.wait_for(run_id, "completed")

    page = console.sign_in()

    row = page.locator(f'tr[data-run="{run_id}"]')
    expect(row).to_contain_text("completed")
    expect(row).to_contain_text("say hello")
    assert page.evaluate("sessionStorage.getItem('keel.token')") == keel_server.token
    console.shot("runs")
    for _ in range(20):  # the keyboard reaches the run's link, and Enter opens it
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.textContent") == run_id:
            break
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", name=f"Run {run_id}")).to_be_focused()
    page.go_back()
    expect(row).to_be_visible()

    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_role("heading", name="Sign in to Keel")).to_be_visible()
    assert page.evaluate("sessionStorage.length") == 0
    page.goto(f"{keel_server.url}/#/runs")  # a signed-out tab cannot see the runs
    expect(page.get_by_role("heading", name="Sign in to Keel")).to_be_visible()
    console.check_origin()


def test_a_revoked_token_sends_the_tab_back_to_sign_in(
    console: Console, keel_server: KeelServer
) -> None:
    token = keel_server.new_token("short-lived")
    page = console.sign_in(token)
    expect(page.get_by_role("heading", name="Runs")).to_be_visible()

    keel_server.revoke("short-lived")

    # The list's next refresh is refused: the tab forgets the token and says why.
    expect(page.get_by_role("heading", name="Sign in to Keel")).to_be_visible()
    expect(page.get_by_role("alert")).to_contain_text("refused the token")
    assert page.evaluate("sessionStorage.length") == 0
    console.shot("signin-session-ended")
    console.check_origin()


@pytest.mark.sandboxed  # its auto-mode command runs unasked only inside bubblewrap
def test_pause_resume_and_message_a_run(console: Console, keel_server: KeelServer) -> None:
    console.sign_in()
    page = console.page
    expect(page.get_by_role("heading", name="Runs")).to_be_visible()
    # The run's first step lasts until the test creates the file `go` (at most 20 s).
    gate = call(
        "run_command",
        argv=["sh", "-c", "for i in $(seq 400); do [ -f go ] && exit; sleep 0.05; done"],
    )
    run_id = keel_server.submit(
        "wait for go, then finish", "pause", [turn(gate), DONE], mode="auto"
    )
    page.goto(f"{keel_server.url}/#/runs/{run_id}")
    badge = page.locator(".status-line .badge")
    expect(page.locator("li.event", has_text="Tool run_command started")).to_have_count(1)

    page.get_by_role("button", name="Pause").click()
    expect(page.locator("li.event", has_text="Pause requested")).to_have_count(1)
    expect(badge).to_have_text("running")  # the step in progress finishes first
    (keel_server.workspace("pause") / "go").touch()
    expect(badge).to_have_text("paused")
    expect(page.get_by_role("button", name="Pause")).to_be_disabled()
    console.shot("run-paused")
    page.get_by_role("button", name="Resume").click()
    expect(badge).to_have_text("completed")
    paused = [e for e in keel_server.events(run_id) if e["type"] == "pause_requested"]
    assert [e["data"]["by"] for e in paused] == ["token:console"]

    page.get_by_label("Message to the run").fill("now also write a changelog")
    page.get_by_role("button", name="Send message").click()
    follow_up = page.get_by_role("status").get_by_role("link")
    expect(follow_up).to_be_visible()
    follow_up.click()
    expect(page.locator(".run-head dl")).to_contain_text(run_id)  # "Follows" links back
    follow_up_id = page.url.rsplit("/", 1)[1]
    with keel_server.api() as api:  # it would nap again: not worth the wait
        api.post(f"/runs/{follow_up_id}/cancel", json={"reason": "test over"})
    console.check_origin()


def test_approve_the_exact_call_then_see_the_run_complete(
    console: Console, keel_server: KeelServer
) -> None:
    append = call("run_command", argv=["sh", "-c", "echo approved >> log.txt"])
    run_id = keel_server.submit(
        "note the approval in log.txt",
        "approve",
        [
            turn(call("write_file", path="notes.txt", content="first line\nsecond line\n")),
            turn(append),
            DONE,
        ],
        verify=["cat log.txt"],
    )
    waiting = keel_server.wait_for(run_id, "waiting")
    digest = waiting["pending"]["digest"]
    console.sign_in()
    page = console.page
    page.locator(f'tr[data-run="{run_id}"] a').click()

    card = page.get_by_role("region", name="Approval needed")
    expect(card.locator(".digest")).to_have_text(digest)
    expect(card.locator(".pending-tool")).to_have_text("run_command")
    expect(card.locator(".pending-command")).to_have_text("sh -c 'echo approved >> log.txt'")
    expect(page.locator("#stream-state")).to_have_text("live")
    written = page.locator("li.event.type-tool_finished", has_text="Tool write_file finished")
    written.get_by_text("Diff").click()
    expect(written.locator(".diff-add")).to_have_text(["+first line", "+second line"])
    console.shot("run-waiting-approval")
    assert not (keel_server.workspace("approve") / "log.txt").exists()

    card.get_by_role("button", name="Approve").click()

    expect(page.locator(".status-line .badge")).to_have_text("completed", timeout=20_000)
    expect(card).to_be_hidden()
    page.get_by_text("Tool run_command finished").wait_for()
    assert (keel_server.workspace("approve") / "log.txt").read_text() == "approved\n"
    granted = [e for e in keel_server.events(run_id) if e["type"] == "approval_granted"]
    assert [(e["data"]["digest"], e["data"]["by"]) for e in granted] == [(digest, "token:console")]
    # Live over SSE: every event in the timeline once, in order, up to the last one.
    last_seq = keel_server.view(run_id)["last_seq"]
    expect(page.locator(f'li.event[data-seq="{last_seq}"]')).to_have_count(1)
    seqs = [
        int(s) for s in page.locator("li.event").evaluate_all("els => els.map(e => e.dataset.seq)")
    ]
    assert seqs == list(range(1, last_seq + 1))
    console.shot("run-completed")

    # The verifier's output is evidence: open it in the page, then download it.
    (evidence,) = keel_server.view(run_id)["evidence"]
    artifact_id = evidence.removeprefix("artifact:")
    item = page.get_by_role("region", name="Evidence").get_by_role("listitem")
    expect(item).to_contain_text(artifact_id)
    item.get_by_role("button", name="Open").click()
    shown = page.locator("pre.artifact")
    expect(shown).to_contain_text("$ cat log.txt")
    expect(shown).to_contain_text("approved")
    with page.expect_download() as download:
        item.get_by_role("button", name="Download").click()
    assert Path(download.value.path()).read_text() == shown.text_content()
    console.shot("run-evidence")
    console.check_origin()


def test_answer_a_question_from_the_keyboard(
    console: Console, phone: Console, keel_server: KeelServer
) -> None:
    run_id = keel_server.submit(
        "configure the port",
        "question",
        [turn(call("ask_user", question=f"Which port? {HOSTILE}")), DONE],
    )
    keel_server.wait_for(run_id, "waiting")
    console.sign_in()
    page = console.page
    expect(page.get_by_role("heading", name="Runs")).to_be_visible()
    page.goto(f"{keel_server.url}/#/runs/{run_id}")

    card = page.get_by_role("region", name="The run asks a question")
    expect(card.locator(".question-text")).to_have_text(f"Which port? {HOSTILE}")
    console.shot("run-question")
    phone.sign_in()
    expect(phone.page.get_by_role("heading", name="Runs")).to_be_visible()
    phone.shot("phone-runs")
    phone.page.goto(f"{keel_server.url}/#/runs/{run_id}")
    expect(phone.page.locator(".question-text")).to_have_text(f"Which port? {HOSTILE}")
    phone.shot("phone-run-question")

    card.get_by_label("Your answer").focus()
    page.keyboard.type("8080")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Send answer"
    page.keyboard.press("Enter")

    expect(page.locator(".status-line .badge")).to_have_text("completed", timeout=20_000)
    received = [e for e in keel_server.events(run_id) if e["type"] == "input_received"]
    assert [e["data"]["answer"] for e in received] == ["8080"]
    assert page.evaluate("window.__xss") is None and phone.page.evaluate("window.__xss") is None
    console.check_origin()
    phone.check_origin()


def test_the_timeline_resumes_after_its_server_dies_with_no_gap_or_repeat(
    browser: Browser,
    keel_server: KeelServer,
    screenshots: Path,
    replica_server: Callable[[int], Any],
    unused_port: int,
) -> None:
    """A second ``keel serve`` (no workers) on the same store serves this tab; it is
    killed mid-stream and started again: the tab reconnects with Last-Event-ID."""
    append = call("run_command", argv=["sh", "-c", "echo again >> log.txt"])
    run_id = keel_server.submit("lose the connection", "resume", [turn(append), DONE])
    waiting = keel_server.wait_for(run_id, "waiting")
    port = unused_port
    replica = replica_server(port)
    tab = Console(
        browser, replace(keel_server, url=f"http://127.0.0.1:{port}"), DESKTOP, screenshots
    )
    streams: list[str | None] = []
    tab.page.on(
        "request",
        lambda r: streams.append(r.headers.get("last-event-id")) if "/stream" in r.url else None,
    )
    try:
        page = tab.sign_in(keel_server.token)
        expect(page.get_by_role("heading", name="Runs")).to_be_visible()
        page.goto(f"{tab.server.url}/#/runs/{run_id}")
        state = page.locator("#stream-state")
        expect(state).to_have_text("live")
        expect(page.locator("li.event")).to_have_count(waiting["last_seq"])

        replica.kill()
        replica.wait()
        expect(state).to_have_text("reconnecting")
        with keel_server.api() as api:  # decided elsewhere while this tab is cut off
            assert api.post(f"/runs/{run_id}/approve", json={}).status_code == 200
        keel_server.wait_for(run_id, "completed")
        replica_server(port)

        last_seq = keel_server.view(run_id)["last_seq"]
        expect(page.locator(f'li.event[data-seq="{last_seq}"]')).to_have_count(1)
        seqs = page.locator("li.event").evaluate_all("els => els.map(e => Number(e.dataset.seq))")
        assert seqs == list(range(1, last_seq + 1))  # every event once, in order
        assert streams[0] == "0" and streams[-1] == str(waiting["last_seq"]), streams
        expect(page.locator(".status-line .badge")).to_have_text("completed")
        tab.check_origin(expected_errors=("net::ERR_CONNECTION_REFUSED", "net::ERR_INCOMPLETE"))
    finally:
        tab.close()


def test_cancel_asks_for_a_reason_first(console: Console, keel_server: KeelServer) -> None:
    append = call("run_command", argv=["sh", "-c", "echo no >> log.txt"])
    run_id = keel_server.submit("wait to be cancelled", "cancel", [turn(append), DONE])
    keel_server.wait_for(run_id, "waiting")
    console.sign_in()
    page = console.page
    expect(page.get_by_role("heading", name="Runs")).to_be_visible()
    page.goto(f"{keel_server.url}/#/runs/{run_id}")

    page.get_by_role("button", name="Cancel run…").click()
    dialog = page.get_by_role("dialog", name="Cancel this run?")
    expect(dialog).to_be_visible()
    dialog.get_by_role("button", name="Cancel the run").click()  # no reason yet: refused
    expect(dialog).to_be_visible()
    assert keel_server.view(run_id)["status"] == "waiting"
    dialog.get_by_label("Reason").fill("wrong workspace")
    console.shot("run-cancel-dialog")
    dialog.get_by_role("button", name="Cancel the run").click()

    expect(page.locator(".status-line .badge")).to_have_text("cancelled")
    assert keel_server.view(run_id)["reason"].endswith("wrong workspace")
    console.check_origin()


def test_the_task_graph_is_coloured_by_status(
    console: Console, phone: Console, keel_server: KeelServer
) -> None:
    tasks = keel_server.tasks
    console.sign_in()
    page = console.page
    page.get_by_role("link", name="Task graph").click()

    svg = page.locator("svg.dag")
    expect(svg.locator("g.node")).to_have_count(len(tasks))
    expect(svg.locator("path.edge")).to_have_count(5)
    status_of = {
        name: svg.locator(f'g.node[data-id="{task_id}"]').get_attribute("data-status")
        for name, task_id in tasks.items()
    }
    assert status_of == {
        "schema": "completed",
        "api": "in_progress",
        "load": "failed",
        "docs": "pending",
        "release": "pending",
        "idea": "cancelled",
    }
    fills = {
        status: svg.locator(f'g.node[data-status="{status}"] rect').first.evaluate(
            "r => getComputedStyle(r).fill"
        )
        for status in ("completed", "in_progress", "failed", "pending", "cancelled")
    }
    assert len(set(fills.values())) == 5, fills  # one colour per status
    # Layers by longest path: schema, then api and load, then docs, then release.
    x = {
        name: svg.locator(f'g.node[data-id="{task_id}"]').evaluate(
            "g => g.transform.baseVal[0].matrix.e"
        )
        for name, task_id in tasks.items()
    }
    assert x["schema"] < x["api"] == x["load"] < x["docs"] < x["release"]
    expect(page.get_by_role("list", name="Colours by status")).to_contain_text("in_progress")
    console.shot("tasks")

    phone.sign_in()
    expect(phone.page.get_by_role("heading", name="Runs")).to_be_visible()
    phone.page.goto(f"{keel_server.url}/#/tasks")
    expect(phone.page.locator("svg.dag g.node")).to_have_count(len(tasks))
    phone.shot("phone-tasks")
    console.check_origin()
    phone.check_origin()


def test_hostile_goal_and_model_output_render_as_text(
    console: Console, keel_server: KeelServer
) -> None:
    output = f"<script>window.__xss=2</script>{HOSTILE}"
    run_id = keel_server.submit(f"fix {HOSTILE}", "hostile", [{"content": output}])
    keel_server.wait_for(run_id, "completed")
    console.sign_in()
    page = console.page
    expect(page.locator(f'tr[data-run="{run_id}"]')).to_contain_text(HOSTILE)
    page.goto(f"{keel_server.url}/#/runs/{run_id}")

    expect(page.locator(".run-head .goal")).to_have_text(f"fix {HOSTILE}")
    expect(page.locator("pre.output", has_text="<script>window.__xss=2</script>")).to_have_count(1)
    console.shot("run-hostile-text")
    assert page.evaluate("window.__xss") is None
    assert page.locator("main img, main script").count() == 0
    assert not any(url.endswith("/x") for url in console.requests)  # no <img src=x> loaded
    console.check_origin()


def test_the_sse_parser_handles_split_lines_comments_and_crlf(console: Console) -> None:
    page = console.open()
    messages = page.evaluate(
        """async () => {
          const { SseParser } = await import('/static/api.js');
          const text = 'id: 1\\nevent: tool_started\\ndata: {"seq":1}\\n\\n: keep-alive\\n\\n'
            + 'id: 2\\r\\ndata: a\\r\\ndata: b\\r\\n\\r\\nid: 3\\rdata:c\\r\\r';
          const parser = new SseParser();
          const out = [];
          for (const ch of text) out.push(...parser.feed(ch));
          out.push(...parser.finish());
          return out;
        }"""
    )
    assert messages == [
        {"id": "1", "event": "tool_started", "data": '{"seq":1}'},
        {"id": "2", "event": "message", "data": "a\nb"},
        {"id": "3", "event": "message", "data": "c"},
    ]
