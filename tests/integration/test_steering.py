"""Pause, resume and messages across real processes on one SQLite file.

The runs are driven by real ``keel worker`` / ``keel run`` processes talking HTTP to a
``FakeProvider`` on 127.0.0.1 (only the model's answers are scripted); the steering
verbs come from this process or from the real ``keel`` command, and every assertion is
on the store's events or on the request bodies the provider received.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from keel.core.errors import InvalidTransition, RunNotFound, UsageError
from keel.core.events import Event, EventType, NewEvent
from keel.core.records import RunOptions
from keel.core.state import RunState
from keel.core.status import RunStatus
from keel.runtime.decisions import answer_question
from keel.runtime.harness import Harness
from keel.runtime.steering import FOLLOW_UP_HEADER, request_pause, resume_run, send_message
from keel.store.base import Store, iter_all_events
from keel.store.step import STARTS_ACTION
from keel.store.url import open_store
from keel.testing import FakeProvider
from keel.testing.stores import append, move, postgres_unavailable, scratch_database

KEEL = [sys.executable, "-m", "keel.cli.app"]
MODEL = "openai:fake-model"
TIMEOUT = 30


# --- helpers ------------------------------------------------------------------------------


def environment(provider: FakeProvider, who: str = "carol") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
    env.update(
        {
            "OPENAI_API_KEY": "sk-test",
            "OPENAI_BASE_URL": provider.base_url,
            "KEEL_LEASE_TTL": "5",
            "KEEL_AGENT_ID": who,
            "COLUMNS": "200",
        }
    )
    return env


def keel(url: str, cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*KEEL, *args, "--store", url],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def start(url: str, cwd: Path, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*KEEL, *args, "--store", url],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@contextmanager
def worker(url: str, cwd: Path, env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    proc = start(url, cwd, env, "worker", "--poll", "0.1")
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        assert "Traceback" not in err, err


@contextmanager
def opened(url: str) -> Iterator[Store]:
    store = open_store(url)
    try:
        yield store
    finally:
        store.close()


def store_and_workspace(tmp_path: Path) -> tuple[str, Path]:
    """The store's file outside the workspace: the harness hashes every file of a workspace
    it works in, and a process that opens and closes the SQLite file it holds a connection
    to loses that connection's locks (POSIX advisory locks are per process)."""
    (tmp_path / "store").mkdir()
    workspace = tmp_path / "ws"
    workspace.mkdir()
    return f"sqlite:///{tmp_path / 'store' / 'keel.db'}", workspace


def wait_for(condition: Callable[[], bool], what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def writes_until(provider: FakeProvider, resumed: threading.Event, delay: float) -> None:
    """The model writes ``note_N.txt`` each turn (answering after ``delay`` seconds) until
    ``resumed`` is set; from then on, two more writes and it asks to complete. However
    slowly the other processes start, the run is still mid-way when it is paused."""
    count = iter(range(10_000))
    after: list[int] = []

    def respond(body: dict[str, Any]) -> None:
        n = next(count)
        if resumed.is_set():
            after.append(n)
        if len(after) <= 2:
            call = ("write_file", {"path": f"note_{n}.txt", "content": f"{n}\n"})
            provider.reply(tool_calls=[call], usage=(10, 5), delay=delay)
        else:
            provider.reply(tool_calls=[("request_completion", {"summary": "notes written"})])

    provider.respond_with(respond)


def events(store: Store, run_id: str) -> list[Event]:
    return list(iter_all_events(store, run_id))


def seq_of(store: Store, run_id: str, kind: EventType, **data: Any) -> int:
    (seq,) = [
        e.seq
        for e in events(store, run_id)
        if e.type is kind and all(e.data.get(k) == v for k, v in data.items())
    ]
    return seq


def started_after(store: Store, run_id: str, seq: int) -> list[str]:
    return [e.type.value for e in events(store, run_id) if e.seq > seq and e.type in STARTS_ACTION]


def count(store: Store, run_id: str, kind: EventType) -> int:
    return sum(1 for e in events(store, run_id) if e.type is kind)


def user_texts(body: dict[str, Any]) -> list[str]:
    return [str(m.get("content")) for m in body["messages"] if m["role"] == "user"]


def auto_options() -> RunOptions:
    return RunOptions(model=MODEL, mode="auto", sandbox={"mode": "off"})


# --- pause and resume ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_run_paused_in_a_worker_process_stops_after_its_step_and_a_worker_finishes_it_once_resumed(  # noqa: E501
    kind: str, tmp_path: Path
) -> None:
    url, ws = store_and_workspace(tmp_path)
    if kind == "postgres":
        if reason := postgres_unavailable():
            pytest.skip(f"PostgreSQL store not tested: {reason}")
        with scratch_database() as pg_url:
            pause_in_worker_then_resume(pg_url, ws)
        return
    pause_in_worker_then_resume(url, ws)


def pause_in_worker_then_resume(url: str, ws: Path) -> None:
    with FakeProvider() as provider, opened(url) as store:
        resumed = threading.Event()
        writes_until(provider, resumed, delay=0.2)
        run = store.create_run(
            goal="write notes", workspace=str(ws), options=auto_options(), queued=True
        )
        with worker(url, ws, environment(provider)):
            wait_for(lambda: count(store, run.run_id, EventType.TOOL_FINISHED) >= 2, "2 writes")
            assert store.current_run_lease(run.run_id) is not None  # the worker drives it

            asked = request_pause(store, run.run_id, by="alice", reason="lunch")
            assert asked.status is RunStatus.RUNNING and asked.pause_requested is not None

            wait_for(lambda: store.load_run(run.run_id).status is RunStatus.PAUSED, "paused")
            wait_for(lambda: store.current_run_lease(run.run_id) is None, "the lease released")
            paused = store.load_run(run.run_id)
            assert paused.reason == "paused by alice: lunch"
            requested = seq_of(store, run.run_id, EventType.PAUSE_REQUESTED)
            paused_at = seq_of(store, run.run_id, EventType.STATUS_CHANGED, to="paused")
            # What was under way when the request landed finished (a model turn and at
            # most the one call it had started); nothing began after the pause.
            in_flight = started_after(store, run.run_id, requested)
            assert in_flight.count("tool_started") <= 1
            assert in_flight.count("model_requested") <= 1
            assert started_after(store, run.run_id, paused_at) == []
            seen = (provider.served, paused.last_seq)
            time.sleep(0.5)  # the worker keeps polling: it does not take a paused run
            assert (provider.served, store.load_run(run.run_id).last_seq) == seen
            written = {p.name for p in ws.glob("note_*.txt")}
            recorded = {
                e.data["arguments"]["path"]
                for e in events(store, run.run_id)
                if e.type is EventType.TOOL_STARTED
            }
            assert written == recorded  # every write on record, none after the pause

            resumed.set()
            back = resume_run(store, run.run_id, by="bob")
            assert back.status is RunStatus.RUNNING
            assert store.current_run_lease(run.run_id) is None  # free for any worker
            wait_for(
                lambda: store.load_run(run.run_id).status is RunStatus.COMPLETED,
                "the worker to finish the resumed run",
            )
        moves = [
            (e.data["from"], e.data["to"], e.data.get("by"))
            for e in events(store, run.run_id)
            if e.type is EventType.STATUS_CHANGED
        ]
        assert ("running", "paused", None) in moves and ("paused", "running", "bob") in moves
        writes = count(store, run.run_id, EventType.TOOL_FINISHED) - 1  # and the completion
        assert len(list(ws.glob("note_*.txt"))) == writes  # each write made once
        assert provider.violations == []


def test_keel_run_paused_from_another_process_exits_3_and_keel_resume_finishes_it(
    tmp_path: Path,
) -> None:
    url, ws = store_and_workspace(tmp_path)
    with FakeProvider() as provider, opened(url) as store:
        resumed = threading.Event()
        writes_until(provider, resumed, delay=0.2)
        env = environment(provider, who="carol")
        proc = start(url, ws, env, "run", "write notes", "--model", MODEL, "--mode", "auto")
        assert proc.stdout is not None
        run_id = proc.stdout.readline().strip()
        assert run_id.startswith("run_"), proc.stderr.read() if proc.stderr else ""
        wait_for(lambda: count(store, run_id, EventType.TOOL_FINISHED) >= 1, "a first write")

        paused = keel(url, ws, env, "pause", run_id, "--reason", "review first")
        assert paused.returncode == 0, paused.stderr
        assert paused.stdout.startswith("pause requested (seq ")

        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 3, (out, err)  # resumable, needs a person
        assert "paused" in out and f"keel resume {run_id}" in out
        state = store.load_run(run_id)
        assert (state.status, state.reason) == (RunStatus.PAUSED, "paused by carol: review first")
        assert store.current_run_lease(run_id) is None

        with pytest.raises(InvalidTransition, match="already paused"):
            request_pause(store, run_id, by="carol")
        assert store.load_run(run_id).last_seq == state.last_seq

        told = keel(url, ws, env, "message", run_id, "name them notes/N.txt next time")
        assert told.returncode == 0, told.stderr
        told_seq = seq_of(store, run_id, EventType.MESSAGE_RECEIVED)
        assert told.stdout.strip() == f"message recorded (seq {told_seq})"
        before_resume = len(provider.requests)

        env["KEEL_AGENT_ID"] = "dave"
        resumed.set()
        going_on = keel(url, ws, env, "resume", run_id)
        assert going_on.returncode == 0, going_on.stdout + going_on.stderr
        final = store.load_run(run_id)
        assert final.status is RunStatus.COMPLETED
        back = [
            e.data
            for e in events(store, run_id)
            if e.type is EventType.STATUS_CHANGED and e.data["from"] == "paused"
        ]
        assert back == [{"from": "paused", "to": "running", "reason": None, "by": "dave"}]
        wanted = "[message from carol] name them notes/N.txt next time"
        assert wanted in user_texts(provider.requests[before_resume])
        writes = count(store, run_id, EventType.TOOL_FINISHED) - 1  # and the completion
        assert len(list(ws.glob("note_*.txt"))) == writes
        assert provider.violations == []


def test_a_run_nobody_drives_is_paused_at_once_and_resumed_for_any_worker_to_claim(
    tmp_path: Path,
) -> None:
    url, ws = store_and_workspace(tmp_path)
    with opened(url) as store:
        run = store.create_run(goal="g", workspace=str(ws), options=auto_options(), queued=True)
        claimed = store.claim_next_run(owner="w1", ttl=30)
        assert claimed is not None
        state, lease = claimed
        append(store, store.load_run(run.run_id), [move(state, RunStatus.RUNNING)])
        store.release_run_lease(lease)  # its worker stopped: running, held by nobody

        paused = request_pause(store, run.run_id, by="erin")
        assert (paused.status, paused.reason) == (RunStatus.PAUSED, "paused by erin")
        assert [e.type for e in events(store, run.run_id)][-2:] == [
            EventType.PAUSE_REQUESTED,
            EventType.STATUS_CHANGED,
        ]
        assert store.claim_next_run(owner="w2", ttl=30) is None  # a paused run is not work

        resume_run(store, run.run_id, by="erin")
        again = store.claim_next_run(owner="w3", ttl=30)
        assert again is not None and again[0].run_id == run.run_id


# --- messages -----------------------------------------------------------------------------


def test_a_message_to_a_run_driven_elsewhere_reaches_the_models_next_request(
    tmp_path: Path,
) -> None:
    url, ws = store_and_workspace(tmp_path)
    with FakeProvider() as provider, opened(url) as store:
        provider.reply(tool_calls=[("write_file", {"path": "a.txt", "content": "a\n"})])
        provider.reply(tool_calls=[("write_file", {"path": "b.txt", "content": "b\n"})], delay=2.0)
        provider.reply(tool_calls=[("request_completion", {"summary": "done"})])
        env = environment(provider)
        proc = start(url, ws, env, "run", "write a", "--model", MODEL, "--mode", "auto")
        assert proc.stdout is not None
        run_id = proc.stdout.readline().strip()
        wait_for(lambda: len(provider.requests) == 2, "the second model request")

        # The model is answering its second turn in the other process right now.
        result = send_message(store, run_id, "indent with tabs, please", by="frank")
        assert result.follow_up is None and result.state.status is RunStatus.RUNNING

        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, (out, err)
        first, second, third = provider.requests
        wanted = "[message from frank] indent with tabs, please"
        assert wanted not in user_texts(first) + user_texts(second)
        assert wanted in user_texts(third)  # its next turn
        recorded = store.read_events(run_id, after=result.seq - 1, limit=1)[0]
        assert recorded.type is EventType.MESSAGE_RECEIVED
        assert recorded.data == {"text": "indent with tabs, please", "by": "frank"}
        assert provider.violations == []


def test_a_message_to_an_ended_run_starts_a_linked_follow_up_with_its_outcome_in_context(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, ws = store_and_workspace(tmp_path)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    with FakeProvider() as provider, opened(url) as store:
        monkeypatch.setenv("OPENAI_BASE_URL", provider.base_url)
        provider.reply(tool_calls=[("write_file", {"path": "app.txt", "content": "v1\n"})])
        provider.reply(tool_calls=[("request_completion", {"summary": "wrote app.txt"})])
        # One store object in this process: a second one on the same file would drop
        # this one's SQLite locks (see the note to the lead on Database._check_header).
        harness = Harness(store=store, model=MODEL)
        first = harness.run(
            "write app.txt",
            cwd=ws,
            mode="auto",
            sandbox="off",
            verify=[f"{sys.executable} -c pass"],
        )
        assert first.status is RunStatus.COMPLETED and first.evidence

        provider.reply(tool_calls=[("request_completion", {"summary": "docs added"})])
        env = environment(provider, who="gina")
        out = keel(url, ws, env, "message", first.id, "now add a README")
        assert out.returncode == 0, out.stdout + out.stderr
        follow_id = out.stdout.splitlines()[0].strip()
        assert follow_id.startswith("run_") and follow_id != first.id

        follow = store.load_run(follow_id)
        assert follow.status is RunStatus.COMPLETED
        assert follow.options.follows == first.id and follow.parent_id is None
        assert follow.goal == "now add a README" and follow.workspace == first.state.workspace
        assert follow.options.verify == first.state.options.verify
        linked = events(store, first.id)[-1]
        assert linked.type is EventType.FOLLOW_UP_CREATED
        assert linked.data == {"run_id": follow_id, "by": "gina"}
        assert store.load_run(first.id).status is RunStatus.COMPLETED  # the ended run stays so

        request = provider.requests[-1]  # the follow-up's first (and only) model turn
        assert user_texts(request)[0] == "now add a README"
        (brief,) = [t for t in user_texts(request) if FOLLOW_UP_HEADER in t]
        assert f"run {first.id}" in brief and "It ended completed (verified)." in brief
        assert "Its summary: wrote app.txt" in brief and "app.txt" in brief
        for ref in first.evidence:
            assert ref in brief

        queued = keel(url, ws, env, "message", first.id, "and a CHANGELOG", "--detach")
        assert queued.returncode == 0, queued.stderr
        later = store.load_run(queued.stdout.strip())
        assert later.status is RunStatus.QUEUED and later.options.follows == first.id
        assert provider.violations == []


# --- refusals -----------------------------------------------------------------------------


def test_illegal_pause_resume_and_message_are_refused_precisely_with_nothing_written(
    tmp_path: Path,
) -> None:
    url, ws = store_and_workspace(tmp_path)
    with opened(url) as store:
        options = auto_options()
        queued = store.create_run(goal="q", workspace=str(ws), options=options, queued=True)
        waiting = store.create_run(goal="w", workspace=str(ws), options=options)
        waiting, _ = append(store, waiting, [move(waiting, RunStatus.WAITING, "question:c1")])
        done = store.create_run(goal="d", workspace=str(ws), options=options)
        done, _ = append(store, done, [move(done, RunStatus.CANCELLED, "not needed")])
        running = store.create_run(goal="r", workspace=str(ws), options=options)
        before = {r.run_id: store.load_run(r.run_id) for r in (queued, waiting, done, running)}

        cases: list[tuple[Callable[[], object], type[Exception], str]] = [
            (lambda: request_pause(store, queued.run_id, by="x"), InvalidTransition, "queued"),
            (lambda: request_pause(store, waiting.run_id, by="x"), InvalidTransition, "waiting"),
            (lambda: request_pause(store, done.run_id, by="x"), InvalidTransition, "has ended"),
            (lambda: request_pause(store, running.run_id, by=" "), UsageError, "blank"),
            (lambda: resume_run(store, running.run_id, by="x"), InvalidTransition, "not paused"),
            (lambda: resume_run(store, waiting.run_id, by="x"), InvalidTransition, "approve"),
            (lambda: resume_run(store, done.run_id, by="x"), InvalidTransition, "keel message"),
            (lambda: send_message(store, running.run_id, " \n", by="x"), UsageError, "blank"),
            (
                lambda: send_message(store, running.run_id, "x" * 40_000, by="x"),
                UsageError,
                "at most",
            ),
            (lambda: request_pause(store, "run_nope", by="x"), RunNotFound, "run_nope"),
            (lambda: send_message(store, "run_nope", "hi", by="x"), RunNotFound, "run_nope"),
        ]
        for call, error, words in cases:
            with pytest.raises(error, match=words):
                call()
        after = {run_id: store.load_run(run_id) for run_id in before}
        assert after == before
        assert store.list_runs(limit=100).__len__() == 4  # no follow-up was made

        # A live run that is queued, waiting or paused takes a message all the same.
        for run in (queued, waiting):
            result = send_message(store, run.run_id, "note this", by="x")
            assert result.follow_up is None and result.state.status is before[run.run_id].status


def test_an_answer_records_who_answered(tmp_path: Path) -> None:
    url, ws = store_and_workspace(tmp_path)
    with opened(url) as store:
        run = store.create_run(goal="q", workspace=str(ws), options=auto_options())
        asked = NewEvent(
            type=EventType.INPUT_REQUESTED, data={"call_id": "c1", "question": "port?"}
        )
        state, _ = append(store, run, [asked])
        append(store, state, [move(state, RunStatus.WAITING, "question:c1")])
        answered = answer_question(store, run.run_id, "8080", by="token:ops")
        assert answered.status is RunStatus.RUNNING
        last_two = events(store, run.run_id)[-2:]
        assert last_two[0].data["by"] == "token:ops" and last_two[0].data["answer"] == "8080"


def test_the_cli_refuses_pausing_an_ended_run_with_exit_2(tmp_path: Path) -> None:
    url, ws = store_and_workspace(tmp_path)
    with opened(url) as store:
        done = store.create_run(goal="d", workspace=str(ws), options=auto_options())
        done, _ = append(store, done, [move(done, RunStatus.FAILED, "budget_exhausted:steps")])
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
    out = keel(url, ws, env, "pause", done.run_id, "--json")
    assert out.returncode == 2 and out.stdout == ""
    assert f"run {done.run_id} has ended (failed)" in out.stderr
    blank = keel(url, ws, env, "message", done.run_id, "   ")
    assert blank.returncode == 2 and "message is blank" in blank.stderr
    with opened(url) as store:
        assert store.load_run(done.run_id) == RunState.from_events(events(store, done.run_id))
        assert store.load_run(done.run_id).last_seq == 2
        assert json.dumps(store.load_run(done.run_id).to_dict())  # intact and readable
