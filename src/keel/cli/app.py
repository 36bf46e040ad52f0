"""The `keel` command: one Typer app; each command group lives in its own module."""

from __future__ import annotations

import typer

from keel.cli import (
    agents,
    artifacts,
    demo,
    evals,
    gc,
    mcp,
    run,
    runs,
    serve,
    skills,
    stats,
    steering,
    tasks,
    tokens,
    verify,
    worker,
)

app = typer.Typer(
    name="keel",
    help="Keel: a durable, auditable, resumable harness for LLM agents.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

run.register(app)
runs.register(app)
tasks.register(app)
worker.register(app)
verify.register(app)
demo.register(app)
agents.register(app)
gc.register(app)
serve.register(app)
tokens.register(app)
steering.register(app)
skills.register(app)
mcp.register(app)
artifacts.register(app)
stats.register(app)
evals.register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
