"""How one ``keel serve`` process is set up."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeConfig:
    """``store_url``: the store every request and embedded worker uses (one ``Store``
    per process). ``workers``: embedded worker slots (0: separate ``keel worker``
    processes execute the queued runs). ``owner``: the worker name (""; KEEL_AGENT_ID
    or user@host). ``console``: serve the web console at ``/``. ``model``: the model of
    queued runs that name none (None: KEEL_MODEL). ``poll_interval``: seconds an idle
    embedded worker waits between polls. ``keepalive_seconds``: SSE keep-alive period.
    ``workspace_roots``: the directories a run created through the API may work in
    (each run's workspace, symlinks resolved, must be one of them or below one);
    empty: any directory this process can reach.
    """

    store_url: str
    workers: int = 0
    owner: str = ""
    console: bool = True
    model: str | None = None
    poll_interval: float = 1.0
    keepalive_seconds: float = 15.0
    workspace_roots: tuple[Path, ...] = ()
