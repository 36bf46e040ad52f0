"""SQLite half of the task graph (being written)."""

from __future__ import annotations


class SQLiteTasks:
    """Task-graph methods of SQLiteStore (mixin over the shared Database)."""
