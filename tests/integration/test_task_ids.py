"""Task ids on a real SQLite file: a drawn id that is already taken is drawn again."""

from __future__ import annotations

from pathlib import Path

import pytest

from keel.core.errors import StoreError
from keel.store.sqlite.store import SQLiteStore


class ScriptedIds(SQLiteStore):
    """A store whose fresh ids come from a list, to force a collision."""

    drawn: list[str]

    def task_id_factory(self) -> str:  # type: ignore[override]
        return self.drawn.pop(0)


def test_an_id_collision_is_retried_with_a_fresh_id(tmp_path: Path) -> None:
    store = ScriptedIds(tmp_path / "keel.db")
    store.drawn = ["task_0000000a", "task_0000000a", "task_0000000a", "task_0000000b"]
    first = store.create_task("a", actor="p")
    second = store.create_task("b", actor="p")
    assert (first.id, second.id) == ("task_0000000a", "task_0000000b")
    assert store.drawn == []
    assert [t.subject for t in store.list_tasks()] == ["a", "b"]
    store.close()


def test_endless_collisions_fail_loudly_without_writing(tmp_path: Path) -> None:
    store = ScriptedIds(tmp_path / "keel.db")
    store.drawn = ["task_0000000a"] * 20
    store.create_task("a", actor="p")
    with pytest.raises(StoreError, match="already taken"):
        store.create_task("b", actor="p")
    assert len(store.list_tasks()) == 1
    store.close()
