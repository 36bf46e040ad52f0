"""What the model says never reaches a person's terminal as an escape sequence.

A model (or a provider) can put ESC, BEL, DEL or a C1 CSI (``\\x9b``) in its text: on a
terminal those clear the screen, retitle the window, write the clipboard (OSC 52) or
forge links. Every line the CLI shows of model text goes through one filter
(``keel.core.text.printable``, via ``excerpt``): the words stay, the controls do not.
"""

from __future__ import annotations

import json
from pathlib import Path

from keel.cli.live import LiveView
from keel.core.text import printable
from keel.models.base import StreamDelta
from keel.testing.cli import KeelWorkspace, call, expect, turn

HOSTILE = "done \x1b[2J\x1b]52;c;cGF5bG9hZA==\x07 \x9b31m red \x7f\x1b]0;owned\x07 ok"
CONTROLS = ("\x1b", "\x07", "\x9b", "\x7f")


def test_printable_turns_every_control_character_into_a_space() -> None:
    assert printable("a\x1bb\x07c\x7fd\x9be\x85f\tg") == "a b c d e f g"
    assert printable("ünïcode ✓ stays") == "ünïcode ✓ stays"


def test_the_live_view_shows_streamed_text_without_its_escape_sequences() -> None:
    view = LiveView()
    view.on_delta(StreamDelta(kind="content", text=HOSTILE))
    line = view.stream_line() or ""
    assert "done" in line and "red" in line and "ok" in line
    assert not any(c in line for c in CONTROLS)


def test_keel_run_events_and_show_print_no_control_character_of_the_model(
    tmp_path: Path,
) -> None:
    ws = KeelWorkspace(root=tmp_path)
    model = ws.script(
        {"content": HOSTILE, "tool_calls": [call("ask_user", question=f"which? {HOSTILE}")]},
        turn(call("request_completion", summary=HOSTILE)),
    )
    run_id, waiting = ws.start("say it", "--model", model)
    expect(waiting, 3)
    expect(ws.keel("answer", run_id, "that one"), 0)
    resumed = ws.keel("resume", run_id)
    expect(resumed, 0)

    for shown in (
        waiting.stdout,
        resumed.stdout,
        expect(ws.keel("events", run_id), 0),
        expect(ws.keel("show", run_id), 0),
    ):
        assert "ok" in shown
        assert not any(c in shown for c in CONTROLS), repr(shown[:400])


def test_task_subjects_and_reasons_print_without_control_characters(tmp_path: Path) -> None:
    """A task's subject and reasons come from the model's task tools as often as from
    people; listing, showing and failing it shows the words, not the escapes."""
    ws = KeelWorkspace(root=tmp_path)
    created = expect(ws.keel("tasks", "create", HOSTILE, "--json"), 0)
    task_id = json.loads(created)["id"]
    expect(ws.keel("tasks", "claim", task_id), 0)

    for shown in (
        expect(ws.keel("tasks", "list"), 0),
        expect(ws.keel("tasks", "show", task_id), 0),
        expect(ws.keel("tasks", "fail", task_id, "--reason", HOSTILE), 0),
        expect(ws.keel("tasks", "graph"), 0),
    ):
        assert "ok" in shown or "red" in shown or task_id in shown
        assert not any(c in shown for c in CONTROLS), repr(shown[:400])
