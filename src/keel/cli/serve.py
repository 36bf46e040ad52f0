"""``keel serve``: the HTTP API, its SSE streams and the web console, on uvicorn.

``--workers N`` runs N embedded worker slots in the same process (0: separate
``keel worker`` processes execute the queued runs). SIGTERM or Ctrl-C stops it
gracefully: no new request is taken, the slots finish their current step and release
their leases, then the store is closed (a second Ctrl-C forces the exit).

Listening on anything but a loopback address (127.0.0.0/8, ::1, ``localhost``) is
refused while the store holds no live token: every API route needs one, and a server
reachable from other machines must not start in a state where the only way in is to
create one after the fact.
"""

from __future__ import annotations

import ipaddress
import signal
import socket
from pathlib import Path
from types import FrameType

import typer

from keel.cli.common import StoreOption, console, err_console, fail, keel_errors, store_url
from keel.server.config import ServeConfig
from keel.store.url import open_store

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
GRACEFUL_SHUTDOWN_S = 10  # open streams are closed after this many seconds of a stop


def register(app: typer.Typer) -> None:
    app.command("serve")(serve_command)


@keel_errors
def serve_command(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(
        8765, "--port", min=0, max=65535, help="Port to listen on (0: any free one)."
    ),
    workers: int = typer.Option(
        0, "--workers", min=0, help="Embedded worker slots (0: separate `keel worker`s)."
    ),
    owner: str | None = typer.Option(
        None, "--owner", help="Name of the embedded worker (default KEEL_AGENT_ID or user@host)."
    ),
    model: str | None = typer.Option(
        None, "--model", help="Model for runs that do not name one (else KEEL_MODEL)."
    ),
    poll: float = typer.Option(
        1.0, "--poll", min=0.01, help="Seconds between polls of an idle worker slot."
    ),
    no_console: bool = typer.Option(False, "--no-console", help="Serve the API only."),
    workspace_roots: list[Path] = typer.Option(
        [],
        "--workspace-root",
        help="A directory runs created through the API may work in, or below (repeatable; "
        "default: any directory this process can reach).",
    ),
    log_level: str = typer.Option(
        "warning", "--log-level", help="uvicorn's log level: " + ", ".join(LOG_LEVELS) + "."
    ),
    store: str | None = StoreOption,
) -> None:
    """Serve the API, event streams and web console (every API route needs a token)."""
    if log_level not in LOG_LEVELS:
        fail(f"--log-level {log_level!r}: choose one of {', '.join(LOG_LEVELS)}")
    url = store_url(store)
    check_store(url, host)
    listener = _listen(host, port)
    bound_port = listener.getsockname()[1]
    config = ServeConfig(
        store_url=url,
        workers=workers,
        owner=owner or "",
        console=not no_console,
        model=model,
        poll_interval=poll,
        workspace_roots=_roots(workspace_roots),
    )
    shown_host = f"[{host}]" if ":" in host else host
    console.print(
        f"keel serve: http://{shown_host}:{bound_port} (console at /, API docs at /docs)",
        highlight=False,
        soft_wrap=True,
    )
    if not serve(config, listener, log_level=log_level):
        raise typer.Exit(2)  # startup failed; uvicorn logged why


def serve(config: ServeConfig, listener: socket.socket, *, log_level: str) -> bool:
    """Run the application on ``listener`` until SIGTERM or SIGINT; False if it never
    started. The first signal stops it gracefully and ``keel serve`` then exits 0
    (uvicorn would raise the signal again once stopped); a second SIGINT forces it."""
    # The server extra, imported by this command only (every other starts without it).
    import uvicorn  # noqa: PLC0415

    from keel.server.app import create_app  # noqa: PLC0415

    class GracefulServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True
                return
            self.should_exit = True
            err_console.print(
                f"keel serve: signal {sig}: finishing requests and current steps, releasing leases",
                highlight=False,
            )

    server = GracefulServer(
        uvicorn.Config(
            create_app(config),
            log_level=log_level,
            lifespan="on",
            server_header=False,
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        )
    )
    server.run(sockets=[listener])
    return server.started


def _roots(paths: list[Path]) -> tuple[Path, ...]:
    """Each ``--workspace-root``, resolved; exit 2 for one that is not a directory."""
    for path in paths:
        if not path.is_dir():
            fail(f"--workspace-root {path}: not an existing directory")
    return tuple(path.resolve() for path in paths)


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and any address of 127.0.0.0/8 or ::1."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # any other name may resolve to an address others reach


def check_store(url: str, host: str) -> None:
    """Open the store once before listening (a bad URL or database stops here, in one
    line, exit 2); exit 2 as well when ``host`` is not a loopback address and the store
    holds no live token."""
    opened = open_store(url)
    try:
        live = [token for token in opened.list_tokens() if token.revoked_at is None]
    finally:
        opened.close()
    if not live and not is_loopback(host):
        fail(
            f"refusing to listen on {host}: it is not a loopback address and the store has "
            "no live API token, so no one could use the API it opens to the network; "
            "create one first with `keel token create NAME` (same --store), then start "
            "`keel serve` again"
        )


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (port 0: a free one), ready for uvicorn."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host.strip("[]"), port, type=socket.SOCK_STREAM
        )[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
    sock.set_inheritable(True)
    return sock
