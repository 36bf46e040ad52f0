"""A run lease's holder as table columns, the same five in both dialects (migration 0004)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from keel.store.base import LeaseHolder

HolderColumns = tuple[str | None, str | None, int | None, int | None, str | None]


def holder_columns(holder: LeaseHolder | None) -> HolderColumns:
    """``(lease_host, lease_boot_id, lease_pid, lease_pid_start, lease_pid_ns)``; all NULL
    when the caller recorded no holder."""
    if holder is None:
        return (None, None, None, None, None)
    return (holder.host, holder.boot_id, holder.pid, holder.start_ticks, holder.pid_ns)


def holder_from_columns(row: Sequence[Any]) -> LeaseHolder | None:
    """Inverse of ``holder_columns``; None when no holder was recorded."""
    host, boot_id, pid, start_ticks, pid_ns = row
    if host is None or pid is None:
        return None
    return LeaseHolder(
        host=str(host),
        boot_id=str(boot_id or ""),
        pid=int(pid),
        start_ticks=int(start_ticks) if start_ticks is not None else None,
        pid_ns=str(pid_ns or ""),
    )
