"""``keel pause`` and ``keel message``: steering a run from any terminal.

``keel pause RUN``: the run finishes its current step, starts nothing new and stops
``paused`` with its lease released; ``keel resume RUN`` goes on in the foreground.
``keel message RUN TEXT``: a live run's model reads the message at its next turn; an
ended run gets a follow-up run (its id on the first line), driven here like ``keel run``
(exit codes as ``keel run``'s) unless ``--detach`` leaves it queued for a worker.
Who decides is ``KEEL_AGENT_ID``, else ``user@host``.
"""

from __future__ import annotations

import typer

from keel.cli.common import JsonOption, StoreOption, console, keel_errors, print_json, store_url
from keel.cli.run import drive
from keel.cli.runs import answer_store_flag
from keel.core.status import RunStatus

# the harness (the whole runtime) is imported when a command runs, not at every `keel` start


def register(app: typer.Typer) -> None:
    """Add ``keel pause`` and ``keel message`` to ``app``."""
    app.command("pause")(pause_command)
    app.command("message")(message_command)


@keel_errors
def pause_command(
    run_id: str = typer.Argument(..., help="The running run to pause."),
    reason: str | None = typer.Option(None, "--reason", help="Why (kept in its stop reason)."),
    as_json: bool = JsonOption,
    store: str | None = StoreOption,
) -> None:
    """Pause a running run after its current step (`keel resume RUN` goes on).

    A run a process is driving pauses at its next step boundary; one nobody drives is
    paused at once. A queued, waiting, paused or ended run is refused (exit 2).
    """
    from keel.runtime.harness import Harness  # noqa: PLC0415 - see the imports

    harness = Harness(store=store_url(store))
    try:
        state = harness.pause(run_id, reason=reason)
    finally:
        harness.close()
    if as_json:
        print_json(
            {
                "run_id": state.run_id,
                "status": state.status.value,
                "reason": state.reason,
                "pause_requested": state.pause_requested,
            }
        )
        return
    flag = answer_store_flag(store)
    if state.status is RunStatus.PAUSED:
        console.print(
            f"run {run_id} is paused — `keel resume {run_id}{flag}` goes on", highlight=False
        )
    else:
        console.print(
            f"pause requested (seq {state.last_seq}); run {run_id} pauses after its current "
            f"step — `keel resume {run_id}{flag}` goes on",
            highlight=False,
        )


@keel_errors
def message_command(
    run_id: str = typer.Argument(..., help="The run to tell something."),
    text: str = typer.Argument(..., help="What the run should take into account."),
    detach: bool = typer.Option(
        False, "--detach", help="An ended run's follow-up is only queued; a worker runs it."
    ),
    as_json: bool = JsonOption,
    store: str | None = StoreOption,
) -> None:
    """Give a run a person's message: its model reads it at its next turn.

    On an ended run this starts a follow-up run in the same workspace, with the first
    run's outcome and evidence in its context: its id is printed first, then it is driven
    here like `keel run` (same exit codes) unless --detach queues it.
    """
    from keel.runtime.harness import Harness  # noqa: PLC0415 - see the imports

    harness = Harness(store=store_url(store))
    try:
        result = harness.message(run_id, text, queue=detach)
    except BaseException:
        harness.close()
        raise
    follow_up = result.follow_up
    if follow_up is None:
        harness.close()
        if as_json:
            print_json({"run_id": run_id, "seq": result.seq, "follow_up": None})
        else:
            console.print(f"message recorded (seq {result.seq})", highlight=False)
        return
    if as_json:
        print_json(
            {"run_id": follow_up.run_id, "status": follow_up.status.value, "follows": run_id}
        )
    else:
        console.print(follow_up.run_id, highlight=False)
    if detach:
        harness.close()
        return
    drive(harness, follow_up.run_id, as_json, answer_store_flag(store))
