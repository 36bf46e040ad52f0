"""Who is acting: a stable person/agent name, and a per-process incarnation."""

from __future__ import annotations

import getpass
import os
import socket
import uuid

INCARNATION = uuid.uuid4().hex[:8]  # fresh every process start


def default_owner() -> str:
    """``KEEL_AGENT_ID``, else ``user@host``: stable across commands."""
    explicit = os.environ.get("KEEL_AGENT_ID", "").strip()
    if explicit:
        return explicit
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "user"
    return f"{user}@{socket.gethostname()}"


def process_owner(name: str | None = None) -> str:
    """A lease owner for this process: the name plus this process's incarnation."""
    return f"{name or default_owner()}/{INCARNATION}"
