"""The SQLite store's answer to an id source that only gives taken ids."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from keel.core.errors import StoreError
from keel.store.sqlite.store import SQLiteStore


def test_an_id_source_giving_only_taken_ids_is_refused_saying_nothing_was_written(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "keel.db")
    try:
        first = store.create_task("a", actor="p")
        store.task_id_factory = lambda: first.id  # type: ignore[method-assign]
        with pytest.raises(StoreError) as err:
            store.create_task("b", actor="p")
        assert re.fullmatch(
            rf"{re.escape(str(tmp_path / 'keel.db'))}: \d+ fresh task ids in a row were already "
            r"taken; the id source is broken, nothing was written",
            str(err.value),
        )
        assert [t.subject for t in store.list_tasks()] == ["a"]
    finally:
        store.close()
