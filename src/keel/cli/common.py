"""What every command shares: the store option, JSON output, and one-line errors."""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any, NoReturn, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from keel.core.errors import KeelError
from keel.core.text import terminal_safe

DEFAULT_STORE = "sqlite:///.keel/keel.db"

StoreOption = typer.Option(
    None,
    "--store",
    envvar="KEEL_STORE",
    help="Store URL: sqlite:///PATH or postgresql://… (default sqlite:///.keel/keel.db).",
    show_default=False,
)
JsonOption = typer.Option(False, "--json", help="Print JSON instead of a table.")
WorkspaceOption = typer.Option(
    Path("."),
    "--workspace",
    "-w",
    help="The workspace whose .keel/ to read (default: the current directory).",
    file_okay=False,
)

console = Console()
err_console = Console(stderr=True)

P = ParamSpec("P")
R = TypeVar("R")


def shown(text: str) -> str:
    """``text`` to print inside rich markup: its own markup escaped, and no control
    character left to reach the terminal as an escape sequence (line breaks stay)."""
    return escape(terminal_safe(text))


def store_url(value: str | None) -> str:
    return value or os.environ.get("KEEL_STORE") or DEFAULT_STORE


def fail(message: str, code: int = 2) -> NoReturn:
    """One line on stderr, no traceback, then exit with ``code``."""
    err_console.print(f"[bold red]error:[/] {shown(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def keel_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn any KeelError into a one-line message and exit code 2."""

    @wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except KeelError as exc:
            fail(str(exc))

    return wrapper


def print_json(value: Any) -> None:
    """One line of strict JSON (RFC 8259) on stdout, whatever ``value`` holds.

    ``NaN`` and infinities are not JSON: they are printed as ``null`` (Keel refuses
    them where they enter, so only a log written before that holds them). Text
    that cannot be encoded (a lone surrogate) is printed as a ``\\u`` escape.
    """
    sys.stdout.write(json_line(value) + "\n")
    sys.stdout.flush()


def json_line(value: Any) -> str:
    """``value`` as strict JSON text on one line (see ``print_json``)."""
    try:
        text = json.dumps(value, default=str, ensure_ascii=False, allow_nan=False)
    except ValueError:  # a NaN or an infinity somewhere
        text = json.dumps(_finite(value), default=str, ensure_ascii=False, allow_nan=False)
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    try:
        text.encode(encoding)
    except (UnicodeEncodeError, LookupError):
        text = json.dumps(json.loads(text), ensure_ascii=True, allow_nan=False)
    return text


def _finite(value: Any) -> Any:
    """``value`` with every NaN and infinity replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
