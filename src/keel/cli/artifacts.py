"""``keel artifact ID [--output FILE]``: open a run's evidence (a verifier's log, a diff,
a sign-off, an MCP image) by the id ``keel show`` and a result's evidence name.

Artifacts hold what the model and its tools produced, so they are never written raw to
a terminal: text is printed with control characters made visible (no escape sequence
reaches the terminal), binary content is refused there (``--output FILE`` saves it).
Piped, the bytes go out exactly as stored. ``--output`` refuses to replace a file
unless ``--force``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from keel.cli.common import (
    JsonOption,
    StoreOption,
    console,
    fail,
    keel_errors,
    print_json,
    store_url,
)
from keel.core.text import terminal_safe
from keel.store.url import open_store


def register(app: typer.Typer) -> None:
    app.command("artifact")(artifact_command)


@keel_errors
def artifact_command(
    artifact_id: str = typer.Argument(..., help="The artifact's id (art_…, or artifact:art_…)."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Save it to this file."),
    force: bool = typer.Option(False, "--force", help="Replace --output if it exists."),
    as_json: bool = JsonOption,
    store: str | None = StoreOption,
) -> None:
    """Print or save one artifact."""
    ident = artifact_id.removeprefix("artifact:")
    opened = open_store(store_url(store), must_exist=True)
    try:
        artifact, content = opened.get_artifact(ident)
    finally:
        opened.close()
    if output is not None:
        if output.exists() and not force:
            fail(f"{output} exists; pass --force to replace it")
        output.write_bytes(content)
    text: str | None
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if as_json:
        print_json(
            {
                "id": artifact.id,
                "run_id": artifact.run_id,
                "name": artifact.name,
                "size": artifact.size,
                "created_at": artifact.created_at.isoformat(),
                "text": text if output is None else None,
                "saved_to": str(output) if output is not None else None,
            }
        )
        return
    if output is not None:
        console.print(f"saved {artifact.name} ({artifact.size} bytes) to {output}", highlight=False)
        return
    if not sys.stdout.isatty():
        sys.stdout.buffer.write(content)
        sys.stdout.buffer.flush()
        return
    if text is None:
        fail(f"{artifact.name} is binary ({artifact.size} bytes): save it with --output FILE")
    sys.stdout.write(terminal_safe(text))
    if not text.endswith("\n"):
        sys.stdout.write("\n")
