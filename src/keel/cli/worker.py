"""`keel worker`: execute queued runs and ready tasks until SIGTERM."""

from __future__ import annotations

import signal
from pathlib import Path
from types import FrameType

import typer

from keel.cli.common import StoreOption, console, err_console, keel_errors, store_url


def register(app: typer.Typer) -> None:
    app.command("worker")(worker_command)


@keel_errors
def worker_command(
    concurrency: int = typer.Option(1, "--concurrency", min=1, help="Runs executed at once."),
    owner: str | None = typer.Option(
        None, "--owner", help="Worker name (default KEEL_AGENT_ID or user@host)."
    ),
    model: str | None = typer.Option(
        None, "--model", help="Model for runs that do not name one (else KEEL_MODEL)."
    ),
    poll: float = typer.Option(1.0, "--poll", min=0.01, help="Seconds between polls when idle."),
    cwd: Path = typer.Option(Path("."), "--cwd", help="Workspace for tasks that name none."),
    until_idle: bool = typer.Option(False, "--until-idle", help="Exit once no work is left."),
    quiet: bool = typer.Option(False, "--quiet", help="Do not print what the worker does."),
    store: str | None = StoreOption,
) -> None:
    """Execute queued runs and ready tasks; SIGTERM finishes the current steps and exits 0."""
    # the runtime is imported by the commands that run agents, not at every `keel` start
    from keel.runtime.harness import Harness  # noqa: PLC0415
    from keel.runtime.worker import Worker  # noqa: PLC0415

    harness = Harness(store=store_url(store), model=model, owner=owner)
    worker = Worker(
        harness,
        concurrency=concurrency,
        poll_interval=poll,
        default_cwd=cwd,
        log=None if quiet else lambda line: err_console.print(line, highlight=False),
    )

    def graceful(signum: int, _frame: FrameType | None) -> None:
        err_console.print(f"signal {signum}: finishing current steps, releasing leases")
        worker.stop()

    signal.signal(signal.SIGTERM, graceful)
    signal.signal(signal.SIGINT, graceful)
    if not quiet:
        err_console.print(f"worker {harness.owner} on {harness.store.url} ({concurrency} slots)")
    stats = worker.run(until_idle=until_idle)
    harness.close()
    console.print(
        f"runs {stats.runs}, tasks completed {stats.tasks_completed}, "
        f"tasks failed {stats.tasks_failed}, errors {len(stats.errors)}",
        highlight=False,
    )
